"""Training options side by side: held-out tau of the same data and budget per variant.

    .venv/bin/python benchmarks/objective.py                   # writes benchmarks/results/objective.{json,md}
    .venv/bin/python benchmarks/objective.py --group settings  # writes benchmarks/results/settings.{json,md}
    .venv/bin/python benchmarks/objective.py --steps 20 --eval-prompts 8 --no-record   # smoke

The data and budget are the peers benchmark's (benchmarks/peers/run.py): one capture of `tiny-gqa`
(its answers to the bundled training prompts), `--steps` steps of the tiny recipe, scored by the
reference engine on the same tiny-eval prompts at T=0 and T=1. Each row changes a few recipe keys and
nothing else; gains read against the group's first row. Training is deterministic here (same seed, same
data): a row reruns to the same tau.

Groups:
- `objective`: `train.loss.ce_target` x `train.loss.slot_weighting` (docs/train.md, Objective); the first
  row is the published objective.
- `settings`: the tiny recipe as shipped, then one setting at a time that dspark and SpecForge do not
  share (AdamW betas, the cosine floor) and two the comparison suggested (the learning rate, the CE / L1
  split).
- `warmup`: the budget's 5% warmup against NeMo AutoModel's, which never warms up for fewer than 20
  steps (the one schedule setting it does not take from the budget).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks" / "peers"))
sys.path.insert(0, str(ROOT))

import provenance  # noqa: E402  (benchmarks/provenance.py)
import run as peers  # noqa: E402  (benchmarks/peers/run.py)

GROUPS = {  # name -> [(row name, recipe overrides)]; gains read against each group's first row
    "objective": [
        ("published: CE vs label, exp decay", {"train.loss.ce_target": "label", "train.loss.slot_weighting": "decay"}),
        (
            "CE vs label, expected-length weights",
            {"train.loss.ce_target": "label", "train.loss.slot_weighting": "expected_length"},
        ),
        (
            "CE vs target distribution, exp decay",
            {"train.loss.ce_target": "target", "train.loss.slot_weighting": "decay"},
        ),
        (
            "CE vs target distribution, expected-length weights",
            {"train.loss.ce_target": "target", "train.loss.slot_weighting": "expected_length"},
        ),
    ],
    "settings": [
        ("the tiny recipe", {}),
        ("AdamW betas 0.9/0.999 (SpecForge's)", {"train.betas": "[0.9,0.999]"}),
        ("cosine to 0 (SpecForge's)", {"train.min_lr_ratio": "0.0"}),
        ("lr 6e-3 (2x)", {"train.lr": "6.0e-3"}),
        ("0.3 CE + 0.7 L1", {"train.loss.ce": "0.3", "train.loss.l1": "0.7"}),
    ],
    "warmup": [
        ("the tiny recipe, warmup 5% (8 of 160 steps)", {}),
        ("warmup 20 steps (NeMo AutoModel's floor)", {"train.warmup_steps": "20"}),
    ],
}
TITLES = {
    "objective": "The training objective's options",
    "settings": "Training settings, one at a time",
    "warmup": "Warmup length (NeMo AutoModel floors it at 20 steps)",
}


def markdown(result: dict) -> str:
    group = result.get("group", "objective")
    md = [
        f"# {TITLES[group]}: same data, same budget, one engine",
        "",
        f"Command: `{result['command']}` ({result['date']}, {result['machine']}); {result['wall_s'] / 60:.1f} min.",
        "",
        f"Data: the peers benchmark's capture of `tiny-gqa` ({result['data']}). Budget: {result['steps']} steps "
        "of the tiny recipe (`target.model=tiny-gqa draft.arch=gqa`), its loss weights "
        f"({result['loss']}), seed {result.get('seed', 0)}; each row changes only the keys it names. tau: `dspark bench DRAFT --offline`, "
        f"{result['eval_prompts']} tiny-eval prompts.",
        "",
        "| variant | changes | tau T=0 [95% CI] | tau T=1 [95% CI] | train s |",
        "|---|---|---|---|---|",
    ]
    base = result["rows"][0]
    for r in result["rows"]:
        cells = []
        for t in ("0.0", "1.0"):
            tau, ci = r["tau"][t]["tau"], r["tau"][t]["ci95"]
            gain = f" ({tau / base['tau'][t]['tau'] - 1:+.1%})" if r is not base else ""
            cells.append(f"{tau:.2f} [{ci[0]:.2f}, {ci[1]:.2f}]{gain}")
        changes = ", ".join(f"`{k}={v}`" for k, v in r["overrides"].items()) or "none"
        md.append(f"| {r['name']} | {changes} | {cells[0]} | {cells[1]} | {r['train_wall_s']:.0f} |")
    md += ["", f"Gains are against the first row ({base['name']})."]
    return "\n".join(md) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--group", choices=sorted(GROUPS), default="objective")
    parser.add_argument("--steps", type=int, default=160)
    parser.add_argument(
        "--seed",
        type=int,
        default=None,
        help="train.seed for every row (default: the recipe's); recorded as GROUP-seedN.*",
    )
    parser.add_argument("--eval-prompts", type=int, default=200)
    parser.add_argument("--rows", default=None, help="only these rows of the group, e.g. 0,1 (default: all)")
    parser.add_argument("--work", default=None, help="working directory (default: a new temp dir)")
    parser.add_argument("--no-record", action="store_true", help="do not write benchmarks/results/GROUP.*")
    provenance.add_arguments(parser)
    args = parser.parse_args()
    seed_tag = f"-seed{args.seed}" if args.seed is not None else ""  # in run directories and result names
    rec = None if args.no_record else provenance.Recording(args.group + seed_tag, allow_dirty=args.allow_dirty)
    started = time.time()
    work = Path(args.work or tempfile.mkdtemp(prefix="dspark-objective-"))
    work.mkdir(parents=True, exist_ok=True)
    extra = [f"train.warmup_steps={max(1, round(args.steps * 0.05))}"]
    extra += [f"train.seed={args.seed}"] if args.seed is not None else []
    recipe = peers.recipe_for(work, *extra)
    timings = peers.make_data(recipe, work)
    rows = []
    keep = {int(i) for i in args.rows.split(",")} if args.rows else None
    for i, (name, overrides) in enumerate(GROUPS[args.group]):
        if keep is not None and i not in keep:
            continue
        over = [*extra, *(f"{k}={v}" for k, v in overrides.items())]
        tag = f"{args.group}-{i}{seed_tag}"  # one --work, many runs
        run = peers.train_dspark(work, tag, args.steps, over)
        draft = work / f"draft-{tag}"
        peers.export(Path(run["dir"]), draft, work / f"export-{tag}.log")
        tau = peers.bench(work, name, draft, args.eval_prompts, slug=tag)
        rows.append(
            {
                "name": name,
                "overrides": overrides,
                "train_wall_s": run["wall_s"],
                "final_loss": run["final_loss"],
                "tau": {str(r["temperature"]): {"tau": r["tau"], "ci95": r["ci95"], "turns": r["turns"]} for r in tau},
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    result = {
        "command": "python benchmarks/objective.py"
        + "".join(
            f" --{k.replace('_', '-')} {v}"
            for k, v in vars(args).items()
            if k in ("group", "steps", "seed", "rows", "eval_prompts") and v != parser.get_default(k)
        ),
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "group": args.group,
        "steps": args.steps,
        "seed": recipe.train.seed,
        "eval_prompts": args.eval_prompts,
        "timings": timings,
        "data": f"{timings['datagen']['conversations']} regenerated answers",
        "loss": ", ".join(
            f"{k} {v}"
            for k, v in recipe.train.loss.model_dump().items()
            if k in ("ce", "l1", "confidence", "slot_decay_gamma")
        ),
        "rows": rows,
        "wall_s": round(time.time() - started),
        "work": str(work),
    }
    print(markdown(result))
    if rec is not None:
        rec.write(result, markdown)


if __name__ == "__main__":
    main()
