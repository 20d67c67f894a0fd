"""Speed of dspark's reference speculative engine: tokens/s with DSpark speculation on vs off.

    .venv/bin/python benchmarks/bench_engine.py --draft runs/tiny/draft     # a bundled tiny target + its draft
        # recorded with the draft of: dspark run tiny output_dir=/tmp/tinyrun "datagen.sources=[{path: tiny-prompts,
        #   max_samples: 300}]" datagen.max_tokens=128 train.max_steps=300 (then --draft /tmp/tinyrun/draft)
    .venv/bin/python benchmarks/bench_engine.py --fixture                   # no run needed (~1 min): the
                                                                            # training tests' random Qwen3 target
                                                                            # and a draft trained here with run_train
    .venv/bin/python benchmarks/bench_engine.py --quick ...                 # fewer prompts, a smoke run

Both write results/bench_engine.{json,md} (one section per setup, merged with what is there).
For every temperature (0 and 1) the engine answers the same prompts with speculation off (plain
KV-cached target decoding, one token per target forward) and on (standard and block verification,
probabilistic drafts; block again with confidence-scheduled verification at threshold 0.5); tokens/s = generated tokens / wall seconds over all prompts, tau =
tokens per verification step. One torch thread: the machine is shared, and the tiny models are
latency-bound. The load average is recorded; re-run on a quiet machine for cleaner numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from dspark_cli.bench.engine import Sampling, Speculation, SpeculativeEngine  # noqa: E402
from dspark_cli.bench.stats import TurnStats, summarize  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"


def measure(
    target,
    drafter,
    prompts: list[list[int]],
    *,
    temperature: float,
    method: str | None,
    block: int,
    max_tokens: int,
    stop_ids: frozenset[int],
    threshold: float = 0.0,
) -> dict:
    """One pass over the prompts; method None = speculation off."""
    engine = (
        SpeculativeEngine(target)
        if method is None
        else SpeculativeEngine(target, drafter, Speculation(block, "probabilistic", method, threshold))
    )
    sampling = Sampling(temperature, 1.0, max_tokens, stop_ids)
    turns, started = [], time.perf_counter()
    for i, prompt in enumerate(prompts):
        out = engine.generate(prompt, sampling, seed=i)
        turns.append(TurnStats("all", out.accepted, out.verified, len(out.token_ids), out.seconds))
    seconds = time.perf_counter() - started
    tokens = sum(t.output_tokens for t in turns)
    summary = summarize(turns, block) if method is not None else None
    label = method or "off"
    if threshold > 0:
        label += f", confidence >= {threshold:g}"
    return {
        "temperature": temperature,
        "speculation": label,
        "prompts": len(prompts),
        "tokens": tokens,
        "seconds": round(seconds, 3),
        "tokens_per_second": round(tokens / seconds, 1),
        "tau": round(summary["tau"]["mean"], 3) if summary else None,
        "tau_ci95": [round(x, 3) for x in summary["tau"]["ci95"]] if summary else None,
        "verified_per_step": round(summary["verified_per_step"], 2) if summary else None,
    }


def setup_fixture(work: Path, quick: bool):
    """The training tests' random Qwen3 target, 64 greedy sequences, a draft trained for 400 steps."""
    import train_fixtures as tf

    from dspark_cli.bench.engine import DSparkDrafter, HFTarget
    from dspark_cli.training.run import run_train

    tf.make_target(work / "target")
    sequences = tf.make_sequences(work / "target", num=64)
    recipe = tf.tiny_recipe(
        work, ["train.max_steps=400", "train.checkpoint_every=400", "train.log_every=100", "train.num_anchors=24"]
    )
    if not (Path(recipe.stage_dir("train")) / "final" / "model.safetensors").is_file():
        run_train(recipe, resume="never", sequences=lambda: iter(sequences))
    target = HFTarget.load(str(work / "target"), tf.LAYER_IDS, dtype="float32", device="cpu")
    drafter = DSparkDrafter.from_dir(recipe.stage_dir("train"), target)
    prompts = [s.input_ids[: tf.PROMPT].tolist() for s in sequences[: 8 if quick else 32]]
    info = {
        "setup": "fixture",
        "target": "tests/train_fixtures.py random Qwen3 (hidden 64, 4 layers, vocab 256)",
        "draft": "2-layer GQA, block 4, trained 400 steps by run_train on 64 greedy sequences",
        "prompts": "the 16-token training prompts",
        "max_tokens": tf.LENGTH - tf.PROMPT,
    }
    return target, drafter, prompts, frozenset(), 4, info


def setup_draft(draft_dir: str, recipe_path: str | None, dataset: str, quick: bool, note: str | None):
    """A bundled/local target + an exported draft, prompts from a bench dataset through the chat template."""
    from dspark_cli.bench.datasets import load_datasets
    from dspark_cli.bench.offline import OfflineBench
    from dspark_cli.bench.run import draft_recipe_path
    from dspark_cli.recipe import load_recipe

    n = 8 if quick else 32
    recipe = load_recipe(
        recipe_path or draft_recipe_path(draft_dir), [f"bench.datasets=[{dataset}]", f"bench.num_prompts={n}"]
    )
    bench = OfflineBench(recipe, draft_dir)
    conversations = load_datasets(recipe.bench)[0].conversations
    prompts = [bench.chat.prompt_ids([{"role": "user", "content": c.user_turns[0]}]) for c in conversations]
    training = bench.manifest.get("training", {})
    trained = (
        (
            f"trained {training['steps']} steps, train-time tau_greedy "
            f"{training.get('final_metrics', {}).get('tau_greedy', float('nan')):.2f}"
        )
        if training.get("steps")
        else "untrained"
    )
    info = {
        "setup": f"{recipe.target.model} + {bench.manifest.get('architecture', 'DSpark')} draft",
        "target": recipe.target.model,
        "draft": f"{note or draft_dir} ({bench.manifest.get('architecture')}, block {bench.num_speculative_tokens}, "
        f"{trained})",
        "prompts": f"{len(prompts)} first turns of {dataset} (chat template)",
        "max_tokens": 128,
    }
    return bench.target, bench.drafter, prompts, bench.stop_ids, bench.num_speculative_tokens, info


def write(section: dict) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / "bench_engine.json"
    data = json.loads(path.read_text()) if path.is_file() else {"sections": []}
    data["sections"] = [s for s in data["sections"] if s["info"]["setup"] != section["info"]["setup"]] + [section]
    path.write_text(json.dumps(data, indent=2) + "\n")
    lines = [
        "# Reference engine: speculation on vs off",
        "",
        "Command: `python benchmarks/bench_engine.py` (see its docstring). tokens/s = generated tokens / wall "
        "seconds over all prompts, one request at a time, 1 torch thread.",
        "",
        "Reading the numbers: on a CPU these tiny targets are latency-bound (a forward over 8 tokens costs little "
        "more than over 1) and a draft step costs about as much as a target forward, plus Python overhead per "
        "step; speculation pays where tau is high and not at tau ~2. Confidence scheduling cuts the tokens "
        "verified per step (the cost that matters on a busy GPU server), not much CPU time here.",
        "",
    ]
    for sec in data["sections"]:
        info, machine = sec["info"], sec["machine"]
        lines += [
            f"## {info['setup']}",
            "",
            f"- target: {info['target']}",
            f"- draft: {info['draft']}",
            f"- prompts: {info['prompts']}, max_tokens {info['max_tokens']}",
            f"- machine: {machine['cpu']}, torch {machine['torch']}, load average before/after "
            f"{machine['load_before']} / {machine['load_after']}",
            "",
            "| T | speculation | tokens | seconds | tokens/s | tau [95% CI] | verified/step | speedup |",
            "|---|---|---|---|---|---|---|---|",
        ]
        base = {r["temperature"]: r["tokens_per_second"] for r in sec["rows"] if r["speculation"] == "off"}
        for r in sec["rows"]:
            tau = "-" if r["tau"] is None else f"{r['tau']:.2f} [{r['tau_ci95'][0]:.2f}, {r['tau_ci95'][1]:.2f}]"
            speed = r["tokens_per_second"] / base[r["temperature"]]
            verified = "-" if r.get("verified_per_step") is None else f"{r['verified_per_step']:.2f}"
            lines.append(
                f"| {r['temperature']:g} | {r['speculation']} | {r['tokens']} | {r['seconds']:.1f} | "
                f"{r['tokens_per_second']:.1f} | {tau} | {verified} | {speed:.2f}x |"
            )
        lines.append("")
    (RESULTS / "bench_engine.md").write_text("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draft", help="exported draft directory (its recipe names the target)")
    parser.add_argument("--recipe", help="recipe file (default: the draft dir's)")
    parser.add_argument("--dataset", default="tiny-eval", help="prompt set for --draft (default tiny-eval)")
    parser.add_argument("--fixture", action="store_true", help="random target + draft trained here")
    parser.add_argument("--work", default="/tmp/dspark-bench-engine", help="work dir for --fixture")
    parser.add_argument("--draft-note", help="how the --draft was made, for the results file")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if not args.fixture and not args.draft:
        parser.error("pass --draft DIR or --fixture")
    torch.set_num_threads(1)
    load_before = [round(x, 2) for x in os.getloadavg()]
    if args.fixture:
        target, drafter, prompts, stop_ids, block, info = setup_fixture(Path(args.work), args.quick)
    else:
        target, drafter, prompts, stop_ids, block, info = setup_draft(
            args.draft, args.recipe, args.dataset, args.quick, args.draft_note
        )
    rows = []
    for temperature in (0.0, 1.0):
        for method, threshold in ((None, 0.0), ("standard", 0.0), ("block", 0.0), ("block", 0.5)):
            kwargs = dict(
                temperature=temperature,
                method=method,
                block=block,
                max_tokens=info["max_tokens"],
                stop_ids=stop_ids,
                threshold=threshold,
            )
            measure(target, drafter, prompts[:2], **kwargs)  # warm-up
            row = measure(target, drafter, prompts, **kwargs)
            print(json.dumps(row), flush=True)
            rows.append(row)
    machine = {
        "cpu": f"{platform.machine()} {os.cpu_count()} cores",
        "torch": torch.__version__,
        "threads": 1,
        "load_before": load_before,
        "load_after": [round(x, 2) for x in os.getloadavg()],
    }
    write({"info": info, "machine": machine, "rows": rows})


if __name__ == "__main__":
    main()
