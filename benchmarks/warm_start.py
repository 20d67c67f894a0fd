"""Warm start: does a draft trained on one kind of prompt, fine-tuned on another (`train.init: pretrained`),
beat a draft trained from scratch (`train.init: target`) for the same steps on that second kind?

    .venv/bin/python benchmarks/warm_start.py          # results/warm_start.{json,md}; ~11 min on 2 quiet cores
    .venv/bin/python benchmarks/warm_start.py --base-steps 20 --steps 10 --prompts 40 --eval-prompts 4 \\
        --out-dir /tmp/warm-check --allow-dirty         # a check that it runs, not a record (6 min on 2 busy cores)

The ~11 min is estimated from the demo's stage times (results/demo_tau.md: ~0.5 s per step of 2,048
tokens); the defaults are sized for it: 300 base steps, 150 steps per kind-2 run, 30 held-out prompts per
kind. Fixed costs (each command's start-up, vLLM's for datagen and capture) are ~3 of the minutes.

Two kinds of prompt from the bundled tiny sets (`dspark_cli/prompts/bundled/`), split by category:
kind 1 `signature` ("What is the signature of `x.y`?": one-line answers), kind 2 `code` + `explain`
(code and prose). Training prompts come from `tiny-prompts`, held-out prompts from `tiny-eval` (the
script checks that no held-out id or prompt text is in either training set). On the demo's target
(`tiny-mla`) and recipe (`templates/recipes/tiny.yaml`), every stage a `dspark` command:

1. base: datagen + train `--base-steps` steps on kind 1 (`init: target`, as the recipe), export;
2. warm: `--steps` steps on kind 2 from the base draft (`train.init=pretrained train.init_from=BASE`);
3. cold: `--steps` steps on the same kind-2 data from `init: target`, the same settings otherwise;
4. each draft scored by `dspark bench --offline` (the reference engine) on held-out prompts of both
   kinds, tau with its 95% CI at T=0 and T=1 (`--no-t1`: T=0 only), the base draft too.

Both fine-tunes take the recipe's optimiser settings and schedule (warmup included); only the start
differs. Writes results/warm_start.{json,md} (or `--out-dir`) through provenance.py.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import provenance  # benchmarks/provenance.py
from demo_tau import _timed  # benchmarks/demo_tau.py: one command, logged and timed

ROOT = Path(__file__).resolve().parents[1]
RECIPE = "templates/recipes/tiny.yaml"
DSPARK = str(Path(sys.executable).with_name("dspark"))
BUNDLED = ROOT / "dspark_cli" / "prompts" / "bundled"
KINDS = {"kind1": ("signature",), "kind2": ("code", "explain")}
LABEL = {"kind1": "signature", "kind2": "code + explain"}


def _rows(name: str) -> list[dict]:
    return [json.loads(line) for line in (BUNDLED / f"{name}.jsonl").read_text().splitlines() if line.strip()]


def write_prompt_sets(work: Path, prompts: int, eval_prompts: int) -> dict:
    """kind1/kind2 training files (first `prompts` of tiny-prompts per kind) and held-out files (first
    `eval_prompts` of tiny-eval per kind); refuses held-out prompts that any training file holds."""
    train_rows, eval_rows = _rows("tiny-prompts"), _rows("tiny-eval")
    sets: dict = {}
    for kind, categories in KINDS.items():
        chosen = [r for r in train_rows if r["category"] in categories][:prompts]
        held = [r for r in eval_rows if r["category"] in categories][:eval_prompts]
        for rows, name in ((chosen, f"train-{kind}"), (held, f"held-{kind}")):
            (work / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        sets[kind] = {"train": chosen, "held": held}
    trained_ids = {r["id"] for s in sets.values() for r in s["train"]}
    trained_text = {r["prompt"] for s in sets.values() for r in s["train"]}
    leaked = [
        r["id"] for s in sets.values() for r in s["held"] if r["id"] in trained_ids or r["prompt"] in trained_text
    ]
    if leaked:
        sys.exit(f"held-out prompts in the training data: {leaked[:5]}")
    return {
        kind: {"categories": list(KINDS[kind]), "train_prompts": len(s["train"]), "held_out_prompts": len(s["held"])}
        for kind, s in sets.items()
    }


def _bench_numbers(bench_dir: Path, held: dict[str, Path]) -> dict:
    """{kind: {"T=0": {tau, ci95, turns, steps}, ...}} from bench.json at confidence threshold 0."""
    report = json.loads((bench_dir / "bench.json").read_text())
    names = {str(path): kind for kind, path in held.items()}
    out: dict = {}
    for run in report["offline"]["runs"]:
        if run.get("threshold", 0.0) != 0.0:
            continue
        kind = names.get(run["dataset"]) or next((k for p, k in names.items() if Path(p).stem in run["dataset"]), None)
        out.setdefault(kind or run["dataset"], {})[f"T={run['temperature']:g}"] = {
            "tau": round(run["tau"]["mean"], 3),
            "ci95": [round(x, 3) for x in run["tau"]["ci95"]],
            "turns": run["num_turns"],
            "steps": run["num_steps"],
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-steps", type=int, default=300, help="steps of the base draft on kind 1")
    parser.add_argument("--steps", type=int, default=150, help="steps of each kind-2 run (warm and cold)")
    parser.add_argument("--prompts", type=int, default=1000, help="training prompts per kind (at most ~1000)")
    parser.add_argument("--eval-prompts", type=int, default=30, help="held-out prompts per kind")
    parser.add_argument("--no-t1", action="store_true", help="score at T=0 only")
    parser.add_argument("--work", type=Path, default=None, help="working directory (default: a new temp dir)")
    parser.add_argument("--out-dir", type=Path, default=None, help="write the record here instead of results/")
    provenance.add_arguments(parser)
    args = parser.parse_args()
    rec = provenance.Recording("warm_start", allow_dirty=args.allow_dirty, out_dir=args.out_dir)
    work = args.work or Path(tempfile.mkdtemp(prefix="dspark-warm-start-"))
    work.mkdir(parents=True, exist_ok=True)
    log = work / "log.txt"
    sets = write_prompt_sets(work, args.prompts, args.eval_prompts)
    held = {kind: work / f"held-{kind}.jsonl" for kind in KINDS}
    temperatures = "[0.0]" if args.no_t1 else "[0.0, 1.0]"

    def data(kind: str) -> list[str]:
        return [
            f"output_dir={work / kind}",
            f"datagen.sources=[{{path: {work / f'train-{kind}.jsonl'}, max_samples: {args.prompts}}}]",
            "datagen.exclude_eval=[]",  # held-out prompts are kept out above, by id and text
            "train.log_every=50",
            f"train.checkpoint_every={max(args.base_steps, args.steps)}",
        ]

    runs = {
        "base": ("kind1", [f"train.max_steps={args.base_steps}"]),
        "warm": ("kind2", [f"train.max_steps={args.steps}", "train.init=pretrained"]),
        "cold": ("kind2", [f"train.max_steps={args.steps}", "train.init=target"]),
    }
    timings: dict = {}
    for kind in KINDS:
        timings[f"datagen {kind}"] = _timed([DSPARK, "datagen", RECIPE, *data(kind)], log)
    result_runs: dict = {}
    for name, (kind, overrides) in runs.items():
        if name == "warm":
            overrides = [*overrides, f"train.init_from={work / 'draft-base'}"]
        common = [*data(kind), f"train.output_dir={work / f'train-{name}'}", *overrides]
        timings[f"train {name}"] = _timed([DSPARK, "train", RECIPE, *common], log)  # capture first, once per kind
        draft = work / f"draft-{name}"
        _timed([DSPARK, "export", str(work / f"train-{name}"), "--recipe", RECIPE, *common, "-o", str(draft)], log)
        bench_dir = work / f"bench-{name}"
        bench = [
            f"bench.datasets=[{held['kind1']}, {held['kind2']}]",
            f"bench.temperatures={temperatures}",
            f"bench.num_prompts={args.eval_prompts}",
            "bench.confidence_thresholds=[0.0]",
            "bench.baselines=[]",
            "bench.context_sweep=false",
            f"bench.output_dir={bench_dir}",
        ]
        timings[f"bench {name}"] = _timed(
            [DSPARK, "bench", str(draft), "--recipe", RECIPE, *common, *bench, "--offline"], log
        )
        manifest = json.loads((work / f"train-{name}" / "manifest.json").read_text())
        summary = manifest["summary"]
        result_runs[name] = {
            "trained_on": kind,
            "init": manifest.get("init"),
            "steps": summary["steps"],
            "train_tokens": summary["tokens"],
            "train_tau_greedy_last": round((summary.get("final_metrics") or {}).get("tau_greedy", 0.0), 3),
            "tau": _bench_numbers(bench_dir, held),
        }
    result = {
        "target": "tiny-mla",
        "recipe": RECIPE,
        "prompt_sets": sets,
        "settings": {
            "base_steps": args.base_steps,
            "steps": args.steps,
            "prompts_per_kind": args.prompts,
            "eval_prompts_per_kind": args.eval_prompts,
            "temperatures": json.loads(temperatures),
        },
        "runs": result_runs,
        "timings_s": timings,
    }
    rec.write(result, markdown)
    print(markdown(result))


def _cell(numbers: dict, kind: str, temperature: str) -> str:
    run = (numbers.get(kind) or {}).get(temperature)
    if run is None:
        return "-"
    low, high = run["ci95"]
    return f"{run['tau']:.2f} [{low:.2f}, {high:.2f}]"


def markdown(result: dict) -> str:
    settings, sets = result["settings"], result["prompt_sets"]
    temps = [f"T={t:g}" for t in settings["temperatures"]]
    header = " | ".join(f"{LABEL[k]} {t}" for k in ("kind2", "kind1") for t in temps)
    describe = {
        "base": f"base: {settings['base_steps']} steps on {LABEL['kind1']}",
        "warm": f"warm: base + {settings['steps']} steps on {LABEL['kind2']} (`init: pretrained`)",
        "cold": f"cold: {settings['steps']} steps on {LABEL['kind2']} (`init: target`)",
    }
    md = [
        f"# Warm start vs training from the target ({result['target']}, {result['recipe']})",
        "",
        f"Kind 1: {LABEL['kind1']} prompts ({sets['kind1']['train_prompts']} for training, "
        f"{sets['kind1']['held_out_prompts']} held out); kind 2: {LABEL['kind2']} prompts "
        f"({sets['kind2']['train_prompts']} for training, {sets['kind2']['held_out_prompts']} held out). "
        "Training prompts from tiny-prompts, held-out from tiny-eval (no id or prompt text in common). "
        "tau: `dspark bench --offline` (the reference engine), mean [95% CI], at confidence threshold 0.",
        "",
        f"| draft | steps | tokens | {header} |",
        "|---|---|---|" + "---|" * (2 * len(temps)),
    ]
    for name, run in result["runs"].items():
        cells = " | ".join(_cell(run["tau"], k, t) for k in ("kind2", "kind1") for t in temps)
        md.append(f"| {describe[name]} | {run['steps']} | {run['train_tokens']:,} | {cells} |")
    times = ", ".join(f"{k} {v:.0f}" for k, v in result["timings_s"].items())
    md += ["", f"Stage times (s): {times}."]
    return "\n".join(md) + "\n"


if __name__ == "__main__":
    main()
