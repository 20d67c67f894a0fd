"""The training objective's options, side by side: held-out tau of the same data and budget per variant.

    .venv/bin/python benchmarks/objective.py                  # writes benchmarks/results/objective.{json,md}
    .venv/bin/python benchmarks/objective.py --steps 20 --eval-prompts 8 --no-record   # smoke

The data and budget are the peers benchmark's (benchmarks/peers/run.py): one capture of `tiny-gqa`
(its answers to the bundled training prompts), `--steps` steps of the tiny recipe, scored by the
reference engine on the same tiny-eval prompts at T=0 and T=1. Only `train.loss.ce_target` and
`train.loss.slot_weighting` change between rows (docs/train.md, Objective); the loss weights stay the
recipe's. Training is deterministic here (same seed, same data): a row reruns to the same tau.
"""

from __future__ import annotations

import argparse
import json
import platform
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks" / "peers"))
sys.path.insert(0, str(ROOT))

import run as peers  # noqa: E402  (benchmarks/peers/run.py)

VARIANTS = [  # (name, ce_target, slot_weighting)
    ("published: CE vs label, exp decay", "label", "decay"),
    ("CE vs label, expected-length weights", "label", "expected_length"),
    ("CE vs target distribution, exp decay", "target", "decay"),
    ("CE vs target distribution, expected-length weights", "target", "expected_length"),
]


def markdown(result: dict) -> str:
    md = ["# The training objective's options: same data, same budget, one engine", "",
          f"Command: `{result['command']}` ({result['date']}, {result['machine']}); {result['wall_s'] / 60:.1f} min.",
          "",
          f"Data: the peers benchmark's capture of `tiny-gqa` ({result['data']}). Budget: {result['steps']} steps "
          "of the tiny recipe (`target.model=tiny-gqa draft.arch=gqa`), its loss weights "
          f"({result['loss']}); only the two options below change. tau: `dspark bench DRAFT --offline`, "
          f"{result['eval_prompts']} tiny-eval prompts.", "",
          "| train.loss.ce_target | train.loss.slot_weighting | tau T=0 [95% CI] | tau T=1 [95% CI] | train s |",
          "|---|---|---|---|---|"]
    base = result["rows"][0]
    for r in result["rows"]:
        cells = []
        for t in ("0.0", "1.0"):
            tau, ci = r["tau"][t]["tau"], r["tau"][t]["ci95"]
            gain = f" ({tau / base['tau'][t]['tau'] - 1:+.1%})" if r is not base else ""
            cells.append(f"{tau:.2f} [{ci[0]:.2f}, {ci[1]:.2f}]{gain}")
        md.append(f"| {r['ce_target']} | {r['slot_weighting']} | {cells[0]} | {cells[1]} | {r['train_wall_s']:.0f} |")
    md += ["", "Gains are against the first row (the published objective)."]
    return "\n".join(md) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=160)
    parser.add_argument("--eval-prompts", type=int, default=200)
    parser.add_argument("--work", default=None, help="working directory (default: a new temp dir)")
    parser.add_argument("--no-record", action="store_true", help="do not write benchmarks/results/objective.*")
    args = parser.parse_args()
    started = time.time()
    work = Path(args.work or tempfile.mkdtemp(prefix="dspark-objective-"))
    work.mkdir(parents=True, exist_ok=True)
    extra = [f"train.warmup_steps={max(1, round(args.steps * 0.05))}"]
    recipe = peers.recipe_for(work, *extra)
    timings = peers.make_data(recipe, work)
    rows = []
    for i, (name, ce_target, weighting) in enumerate(VARIANTS):
        over = [*extra, f"train.loss.ce_target={ce_target}", f"train.loss.slot_weighting={weighting}"]
        run = peers.train_dspark(work, i, args.steps, over)
        draft = work / f"draft-{i}"
        peers.export(Path(run["dir"]), draft, work / f"export-{i}.log")
        tau = peers.bench(work, name, draft, args.eval_prompts, slug=f"objective-{i}")
        rows.append({"name": name, "ce_target": ce_target, "slot_weighting": weighting, "train_wall_s": run["wall_s"],
                     "final_loss": run["final_loss"],
                     "tau": {str(r["temperature"]): {"tau": r["tau"], "ci95": r["ci95"], "turns": r["turns"]}
                             for r in tau}})
        print(json.dumps(rows[-1]), flush=True)
    result = {
        "command": "python benchmarks/objective.py" + "".join(
            f" --{k.replace('_', '-')} {v}" for k, v in vars(args).items()
            if k in ("steps", "eval_prompts") and v != parser.get_default(k)),
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "steps": args.steps, "eval_prompts": args.eval_prompts, "timings": timings,
        "data": f"{timings['datagen']['conversations']} regenerated answers",
        "loss": ", ".join(f"{k} {v}" for k, v in recipe.train.loss.model_dump().items()
                          if k in ("ce", "l1", "confidence", "slot_decay_gamma")),
        "rows": rows, "wall_s": round(time.time() - started), "work": str(work),
    }
    text = markdown(result)
    print(text)
    if not args.no_record:
        peers.record("objective", result, text)


if __name__ == "__main__":
    main()
