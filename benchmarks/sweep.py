"""A settings sweep on the tiny recipe, chosen on the validation split, reported once on the test split.

    .venv/bin/python benchmarks/sweep.py                 # results/sweep.{json,md}; ~30 min on 2 quiet cores
    .venv/bin/python benchmarks/sweep.py --grid "train.lr_scale.markov_head=1,5" --steps 20 --prompts 200 \\
        --test-seeds 11 --eval-prompts 4 --out-dir /tmp/sweep-check --allow-dirty   # a check that it runs

Every stage is a `dspark` command on the demo's recipe (`templates/recipes/tiny.yaml`, target `tiny-mla`):

1. data: `dspark datagen` once; datagen holds out `datagen.validation_fraction` of the conversations (by
   content, docs/datagen.md), capture captures them apart, and training never sees them.
2. select: every setting of `--grid` (the cartesian product of its keys' values) trained with each of the
   `--select-seeds` (`train.seed`); a setting's score is the mean over those seeds of its best validation
   tau (`train.validation_metric`, teacher-forced on the held-out conversations, as `dspark train` logs it).
   The best score wins; nothing in this step looks at a test prompt.
3. test: the chosen setting (only it: a comparison there would be a choice made on the test split) trained
   again with each of the `--test-seeds` (fresh: the script refuses a test seed that selection used), exported (the best
   checkpoint, as `dspark export` takes by default), and scored once by `dspark bench --offline` on
   tiny-eval and tiny-requests (the test split: bundled prompts no training file holds) with the global
   `seed` set to the same test seed, so the bench's sampling seeds are fresh too. tau [95% CI] per dataset
   and temperature, per seed, and pooled over seeds (the mean of the seeds' means, with the seeds'
   spread).

The record keeps the whole selection table, so what was chosen and on what is visible, and
`benchmarks/results/sweep.md` is regenerated from it (`--rerender`).
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import tempfile
from pathlib import Path

import provenance  # benchmarks/provenance.py
from demo_tau import _timed  # benchmarks/demo_tau.py: one command, logged and timed

ROOT = Path(__file__).resolve().parents[1]
RECIPE = "templates/recipes/tiny.yaml"
DSPARK = str(Path(sys.executable).with_name("dspark"))
DEFAULT_GRID = "train.lr_scale.markov_head=1,5;train.min_lr_ratio=0,0.1"
TEST_SETS = ("tiny-eval", "tiny-requests")


def parse_grid(text: str) -> list[dict[str, str]]:
    """`key=a,b;key2=c,d` -> every combination, as {key: value} (values kept as the recipe override text)."""
    axes = []
    for part in filter(None, (p.strip() for p in text.split(";"))):
        key, _, values = part.partition("=")
        if not key or not values:
            sys.exit(f"--grid: {part!r} is not key=value[,value...]")
        axes.append([(key.strip(), v.strip()) for v in values.split(",") if v.strip()])
    return [dict(combo) for combo in itertools.product(*axes)]


def recipe_values(keys: list[str]) -> dict[str, str]:
    """The shipped recipe's value of each grid key, as text comparable with the grid's."""
    sys.path.insert(0, str(ROOT))
    from dspark_cli.recipe.loader import load_recipe

    data = load_recipe(RECIPE).model_dump()
    out = {}
    for key in keys:
        node: object = data
        parts = key.split(".")
        for i, part in enumerate(parts):
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, dict) and ".".join(parts[i:]) in node:  # lr_scale's dotted module names
                node = node[".".join(parts[i:])]
                break
            else:
                node = None
                break
        out[key] = "1" if node is None and "lr_scale" in key else f"{node:g}" if isinstance(node, float) else str(node)
    return out


def same_setting(a: dict[str, str], b: dict[str, str]) -> bool:
    return all(float(a[k]) == float(b[k]) if _number(a[k]) and _number(b[k]) else a[k] == b[k] for k in a)


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def validation_curve(train_dir: Path) -> list[dict]:
    """The `validation` records `dspark train` logged, in step order."""
    path = train_dir / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if r.get("kind") == "validation"]


def best_validation(train_dir: Path, metric: str) -> dict:
    curve = validation_curve(train_dir)
    if not curve:
        sys.exit(f"{train_dir}: no validation records (is datagen.validation_fraction 0?)")
    best = max(curve, key=lambda r: r[metric])
    return {
        "step": best["step"],
        "value": round(best[metric], 4),
        "curve": [[r["step"], round(r[metric], 4)] for r in curve],
    }


def bench_numbers(bench_dir: Path) -> dict:
    """{dataset: {"T=0": {tau, ci95, turns}, ...}} at confidence threshold 0."""
    report = json.loads((bench_dir / "bench.json").read_text())
    out: dict = {}
    for run in report["offline"]["runs"]:
        if run.get("threshold", 0.0) != 0.0:
            continue
        out.setdefault(run["dataset"], {})[f"T={run['temperature']:g}"] = {
            "tau": round(run["tau"]["mean"], 3),
            "ci95": [round(x, 3) for x in run["tau"]["ci95"]],
            "turns": run["num_turns"],
        }
    return out


def pooled(per_seed: list[dict]) -> dict:
    """Mean over seeds of each (dataset, temperature) tau, with the seeds' min and max."""
    out: dict = {}
    for dataset in per_seed[0]:
        for temp in per_seed[0][dataset]:
            values = [s[dataset][temp]["tau"] for s in per_seed]
            out.setdefault(dataset, {})[temp] = {
                "mean": round(statistics.fmean(values), 3),
                "min": min(values),
                "max": max(values),
                "seeds": len(values),
            }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--grid", default=DEFAULT_GRID, help=f"settings to try (default: {DEFAULT_GRID})")
    parser.add_argument("--select-seeds", default="0", help="train.seed values scored on validation (default 0)")
    parser.add_argument("--test-seeds", default="11,12,13", help="fresh seeds for the test split (default 11,12,13)")
    parser.add_argument("--steps", type=int, default=None, help="train.max_steps (default: the recipe's)")
    parser.add_argument("--prompts", type=int, default=None, help="training prompts (default: the recipe's)")
    parser.add_argument("--eval-prompts", type=int, default=40, help="test prompts per set (default 40)")
    parser.add_argument("--work", type=Path, default=None, help="working directory (default: a new temp dir)")
    parser.add_argument("--out-dir", type=Path, default=None, help="write the record here instead of results/")
    parser.add_argument("--rerender", action="store_true", help="rewrite results/sweep.md from its .json")
    provenance.add_arguments(parser)
    args = parser.parse_args()
    if args.rerender:
        out = args.out_dir or provenance.RESULTS
        record = json.loads((out / "sweep.json").read_text())
        provenance.write_record(out, "sweep", record, markdown(record))
        return
    rec = provenance.Recording("sweep", allow_dirty=args.allow_dirty, out_dir=args.out_dir)
    grid = parse_grid(args.grid)
    select_seeds = [int(s) for s in args.select_seeds.split(",")]
    test_seeds = [int(s) for s in args.test_seeds.split(",")]
    if set(select_seeds) & set(test_seeds):
        sys.exit(f"test seeds {sorted(set(select_seeds) & set(test_seeds))} were used to select: pick fresh ones")
    work = args.work or Path(tempfile.mkdtemp(prefix="dspark-sweep-"))
    work.mkdir(parents=True, exist_ok=True)
    log = work / "log.txt"
    metric = _recipe_metric()
    base = [f"output_dir={work / 'run'}", "train.log_every=50"]
    if args.steps:
        base.append(f"train.max_steps={args.steps}")
    if args.prompts:
        base.append(f"datagen.sources=[{{path: tiny-prompts, max_samples: {args.prompts}}}]")
    timings: dict = {"datagen": _timed([DSPARK, "datagen", RECIPE, *base], log)}

    def train(name: str, setting: dict[str, str], seed: int) -> Path:
        out = work / f"train-{name}-seed{seed}"
        overrides = [*base, *(f"{k}={v}" for k, v in setting.items()), f"train.seed={seed}", f"train.output_dir={out}"]
        timings[f"train {name} seed {seed}"] = _timed([DSPARK, "train", RECIPE, *overrides], log)
        return out

    selection = []
    for i, setting in enumerate(grid):
        scores = [best_validation(train(f"s{i}", setting, seed), metric) for seed in select_seeds]
        selection.append(
            {
                "setting": setting,
                "score": round(statistics.fmean(s["value"] for s in scores), 4),
                "per_seed": dict(zip(map(str, select_seeds), scores, strict=True)),
            }
        )
    chosen = max(selection, key=lambda row: row["score"])["setting"]
    shipped = recipe_values(list(grid[0]))
    candidates = {"chosen": chosen}  # only the chosen one meets the test split: comparing there would choose on it
    test: dict = {}
    for name, setting in candidates.items():
        per_seed = []
        for seed in test_seeds:
            out = train(name, setting, seed)
            common = [*base, *(f"{k}={v}" for k, v in setting.items()), f"train.seed={seed}", f"seed={seed}"]
            draft = work / f"draft-{name}-seed{seed}"
            _timed([DSPARK, "export", str(out), "--recipe", RECIPE, *common, "-o", str(draft)], log)
            bench_dir = work / f"bench-{name}-seed{seed}"
            bench = [
                f"bench.datasets=[{', '.join(TEST_SETS)}]",
                "bench.temperatures=[0.0, 1.0]",
                f"bench.num_prompts={args.eval_prompts}",
                "bench.confidence_thresholds=[0.0]",
                "bench.baselines=[]",
                "bench.context_sweep=false",
                f"bench.output_dir={bench_dir}",
            ]
            timings[f"bench {name} seed {seed}"] = _timed(
                [DSPARK, "bench", str(draft), "--recipe", RECIPE, *common, *bench, "--offline"], log
            )
            manifest = json.loads((draft / "dspark_manifest.json").read_text())
            per_seed.append({"seed": seed, "selected": manifest.get("selected"), "tau": bench_numbers(bench_dir)})
        test[name] = {"setting": setting, "per_seed": per_seed, "pooled": pooled([s["tau"] for s in per_seed])}
    result = {
        "target": "tiny-mla",
        "recipe": RECIPE,
        "metric": metric,
        "settings": {
            "grid": args.grid,
            "select_seeds": select_seeds,
            "test_seeds": test_seeds,
            "steps": args.steps,
            "prompts": args.prompts,
            "eval_prompts": args.eval_prompts,
            "test_sets": list(TEST_SETS),
        },
        "selection": selection,
        "chosen": chosen,
        "shipped": shipped,
        "test": test,
        "timings_s": timings,
    }
    rec.write(result, markdown)
    print(markdown(result))


def _recipe_metric() -> str:
    sys.path.insert(0, str(ROOT))
    from dspark_cli.recipe.loader import load_recipe

    return str(load_recipe(RECIPE).train.validation_metric)


def _setting(setting: dict[str, str]) -> str:
    return ", ".join(f"`{k}={v}`" for k, v in setting.items())


def markdown(result: dict) -> str:
    s = result["settings"]
    md = [
        f"# Settings sweep on the tiny recipe ({result['target']}, {result['recipe']})",
        "",
        f"Chosen on the validation split (held out by datagen, never trained on): the best `{result['metric']}` "
        f"of each run's validation curve, mean over training seeds {s['select_seeds']}. Reported once on the test "
        f"split ({', '.join(s['test_sets'])}, {s['eval_prompts']} prompts each) with fresh seeds {s['test_seeds']} "
        "(training and the bench's sampling): `dspark bench --offline`, tau mean [95% CI] at confidence threshold 0.",
        "",
        "## Selection (validation)",
        "",
        "| setting | score | per seed: best (step) |",
        "|---|---|---|",
    ]
    best = max(row["score"] for row in result["selection"])
    for row in result["selection"]:
        seeds = ", ".join(f"seed {k}: {v['value']:.3f} ({v['step']})" for k, v in row["per_seed"].items())
        mark = " **chosen**" if row["score"] == best else ""
        md.append(f"| {_setting(row['setting'])}{mark} | {row['score']:.3f} | {seeds} |")
    verdict = "the chosen one" if same_setting(result["chosen"], result["shipped"]) else "not the chosen one"
    md += ["", f"Shipped in the recipe when this ran: {_setting(result['shipped'])} ({verdict}).", "", "## Test", ""]
    for name, entry in result["test"].items():
        md.append(f"### {name}: {_setting(entry['setting'])}")
        md.append("")
        first = entry["per_seed"][0]["tau"]
        cols = [(d, t) for d in first for t in first[d]]
        md.append("| seed | selected checkpoint | " + " | ".join(f"{d} {t}" for d, t in cols) + " |")
        md.append("|---|---|" + "---|" * len(cols))
        for row in entry["per_seed"]:
            sel = row.get("selected") or {}
            where = f"{sel.get('checkpoint', '?')} @ {sel.get('step', '?')}"
            cells = []
            for d, t in cols:
                cell = row["tau"][d][t]
                cells.append(f"{cell['tau']:.2f} [{cell['ci95'][0]:.2f}, {cell['ci95'][1]:.2f}]")
            md.append(f"| {row['seed']} | {where} | " + " | ".join(cells) + " |")
        pooled_cells = [
            f"{entry['pooled'][d][t]['mean']:.2f} ({entry['pooled'][d][t]['min']:.2f}-{entry['pooled'][d][t]['max']:.2f})"
            for d, t in cols
        ]
        md.append("| mean (seed range) | | " + " | ".join(pooled_cells) + " |")
        md.append("")
    times = ", ".join(f"{k} {v:.0f}" for k, v in result["timings_s"].items())
    md += [f"Stage times (s): {times}."]
    return "\n".join(md) + "\n"


if __name__ == "__main__":
    main()
