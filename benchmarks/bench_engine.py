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
tokens per verification step. One torch thread: the tiny models are latency-bound. Each section keeps the
provenance of the run that measured it (benchmarks/provenance.py); record on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import provenance  # noqa: E402  (benchmarks/provenance.py)

from dspark_cli.bench.engine import Sampling, Speculation, SpeculativeEngine  # noqa: E402
from dspark_cli.bench.stats import TurnStats, summarize  # noqa: E402


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


def write(rec: provenance.Recording, section: dict) -> None:
    """This run's section, with its provenance, merged into the record (the other setup's section is kept)."""
    path = provenance.RESULTS / "bench_engine.json"
    old = json.loads(path.read_text()) if path.is_file() else {}
    sections = [  # the other setup's, when it was recorded with its provenance
        s for s in old.get("sections", []) if "provenance" in s and s["info"]["setup"] != section["info"]["setup"]
    ]
    rec.write({"sections": [*sections, {"provenance": rec.provenance(), **section}]}, markdown)


def markdown(data: dict) -> str:
    lines = [
        "# Reference engine: speculation on vs off",
        "",
        "`benchmarks/bench_engine.py` (see its docstring). tokens/s = generated tokens / wall seconds over all "
        "prompts, one request at a time, 1 torch thread; each section is its own run.",
        "",
    ]
    for sec in data["sections"]:
        info, prov = sec["info"], sec["provenance"]
        lines += [
            f"## {info['setup']}",
            "",
            f"- target: {info['target']}",
            f"- draft: {info['draft']}",
            f"- prompts: {info['prompts']}, max_tokens {info['max_tokens']}",
            f"- made at commit {prov['commit'][:10]}, load {prov['load']['before']} before, "
            f"{prov['load']['during_mean']} mean during, {prov['load']['after']} after",
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
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draft", help="exported draft directory (its recipe names the target)")
    parser.add_argument("--recipe", help="recipe file (default: the draft dir's)")
    parser.add_argument("--dataset", default="tiny-eval", help="prompt set for --draft (default tiny-eval)")
    parser.add_argument("--fixture", action="store_true", help="random target + draft trained here")
    parser.add_argument("--work", default="/tmp/dspark-bench-engine", help="work dir for --fixture")
    parser.add_argument("--draft-note", help="how the --draft was made, for the results file")
    parser.add_argument("--quick", action="store_true")
    provenance.add_arguments(parser)
    args = parser.parse_args()
    if not args.fixture and not args.draft:
        parser.error("pass --draft DIR or --fixture")
    rec = provenance.Recording("bench_engine", allow_dirty=args.allow_dirty)
    torch.set_num_threads(1)
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
    write(rec, {"info": info, "threads": 1, "rows": rows})


if __name__ == "__main__":
    main()
