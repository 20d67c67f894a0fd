"""The demo's draft quality: which settings of templates/recipes/tiny.yaml give the best held-out tau in
the demo's time budget (`dspark run templates/recipes/tiny.yaml`, <= 10 minutes on 2 cores).

    .venv/bin/python benchmarks/demo_tau.py data d2000 datagen.sources[0].max_samples=2000
    .venv/bin/python benchmarks/demo_tau.py train base --data d2000 train.max_steps=300
    .venv/bin/python benchmarks/demo_tau.py train b999 --data d2000 "train.betas=[0.9, 0.999]"
    .venv/bin/python benchmarks/demo_tau.py demo final           # the whole `dspark run`, timed
    .venv/bin/python benchmarks/demo_tau.py rebench final --t1   # its draft on all 200 tiny-eval prompts
    .venv/bin/python benchmarks/demo_tau.py table                # results/demo_tau.{json,md}

`data` runs datagen + capture once (the recipe plus overrides, under WORK/data-NAME); `train` trains on
that capture with the overrides (under WORK/exp-NAME), exports and benches the draft with dspark's
reference engine on the recipe's held-out prompts (bench.datasets: tiny-eval). Every stage is a
`dspark` command (or, for capture alone, the pipeline's capture stage), timed by wall clock, and every
result is a row of results/demo_tau.json with its command lines and its own provenance (benchmarks/provenance.py:
commit, load around and during it); rows recorded before provenance existed are dropped at the next write.
`demo` records the datagen time (the command's start to datagen's manifest: start-up and preflight included)
and the capture backend the run used.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import provenance  # benchmarks/provenance.py

ROOT = Path(__file__).resolve().parents[1]
RECIPE = "templates/recipes/tiny.yaml"
RESULTS = provenance.RESULTS / "demo_tau.json"
DSPARK = str(Path(sys.executable).with_name("dspark"))


def _timed(argv: list[str], log: Path) -> float:
    started = time.perf_counter()
    with log.open("a") as out:
        out.write("$ " + " ".join(argv) + "\n")
        out.flush()
        done = subprocess.run(
            argv, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "COLUMNS": "200"}
        )
    if done.returncode != 0:
        sys.exit(f"failed ({done.returncode}): {' '.join(argv)}; see {log}")
    return round(time.perf_counter() - started, 1)


def _rows() -> list[dict]:
    """The recorded rows that carry their provenance."""
    data = json.loads(RESULTS.read_text()) if RESULTS.is_file() else {}
    return [r for r in (data.get("rows", []) if isinstance(data, dict) else []) if "provenance" in r]


def _record(rec: provenance.Recording, entry: dict, *, new: bool = True) -> None:
    """`entry` as a row (replacing the row of its name); a new row gets this run's provenance."""
    if new:
        entry = {"provenance": rec.provenance(), **entry}
    rows = [r for r in _rows() if r["name"] != entry["name"]] + [entry]
    rec.write({"rows": rows}, markdown)


def _bench_numbers(bench_dir: Path) -> dict:
    """tau per temperature at threshold 0: `T=0` for the first dataset (tiny-eval), `DATASET T=0` for the others."""
    report = json.loads((bench_dir / "bench.json").read_text())
    out = {}
    runs = report["offline"]["runs"]
    first = runs[0]["dataset"] if runs else None
    for run in runs:
        if run.get("threshold", 0.0) == 0.0:
            prefix = "" if run["dataset"] == first else f"{run['dataset']} "
            out[f"{prefix}T={run['temperature']:g}"] = {
                "tau": round(run["tau"]["mean"], 3),
                "ci95": [round(x, 3) for x in run["tau"]["ci95"]],
                "turns": run["num_turns"],
                "steps": run["num_steps"],
                "output_tokens": run["output_tokens"],
            }
    return out


def data(args) -> None:
    base = args.work / f"data-{args.name}"
    base.mkdir(parents=True, exist_ok=True)
    log = base / "log.txt"
    overrides = [f"output_dir={base}", *args.overrides]
    rec = provenance.Recording("demo_tau", allow_dirty=args.allow_dirty)
    datagen_cmd = [DSPARK, "datagen", RECIPE, *overrides]
    datagen_s = _timed(datagen_cmd, log)
    capture_code = (
        "import sys; from dspark_cli.pipeline import run_capture; from dspark_cli.recipe import load_recipe; "
        f"run_capture(load_recipe({RECIPE!r}, sys.argv[1:]))"
    )
    capture_cmd = [sys.executable, "-c", capture_code, *overrides]
    capture_s = _timed(capture_cmd, log)
    data_manifest = json.loads((base / "data" / "manifest.json").read_text())
    hidden = json.loads((base / "hidden" / "manifest.json").read_text())
    generated = sum(s["tokens"] for s in data_manifest["shards"])
    _record(
        rec,
        {
            "name": f"data-{args.name}",
            "kind": "data",
            "overrides": args.overrides,
            "commands": [" ".join(datagen_cmd), "pipeline.run_capture(recipe, overrides)"],
            "engine": data_manifest["engine"],
            "conversations": data_manifest["num_conversations"],
            "sample_tokens": generated,
            "capture_tokens": hidden["num_tokens"],
            "loss_tokens": hidden["num_loss_tokens"],
            "datagen_s": datagen_s,
            "capture_s": capture_s,
            "capture_backend": hidden.get("backend", {}).get("backend"),
        },
    )
    print(json.dumps(_rows()[-1], indent=1))


def train(args) -> None:
    base = args.work / f"data-{args.data}"
    exp = args.work / f"exp-{args.name}"
    exp.mkdir(parents=True, exist_ok=True)
    log = exp / "log.txt"
    common = [f"output_dir={base}", f"train.output_dir={exp / 'train'}", *args.overrides]
    bench = [
        "bench.temperatures=[0.0, 1.0]" if args.t1 else "bench.temperatures=[0.0]",
        "bench.confidence_thresholds=[0.0]",
    ]
    rec = provenance.Recording("demo_tau", allow_dirty=args.allow_dirty)
    train_cmd = [DSPARK, "train", RECIPE, *common]
    train_s = _timed(train_cmd, log)
    export_cmd = [
        DSPARK,
        "export",
        str(exp / "train" / "final"),
        "--recipe",
        RECIPE,
        *common,
        "-o",
        str(exp / "draft"),
        "--force",
    ]
    export_s = _timed(export_cmd, log)
    bench_cmd = [
        DSPARK,
        "bench",
        str(exp / "draft"),
        "--recipe",
        RECIPE,
        *common,
        f"bench.output_dir={exp / 'bench'}",
        *bench,
        "--offline",
    ]
    bench_s = _timed(bench_cmd, log)
    summary = json.loads((exp / "train" / "manifest.json").read_text())["summary"]
    final = summary.get("final_metrics", {})
    _record(
        rec,
        {
            "name": args.name,
            "kind": "train",
            "data": f"data-{args.data}",
            "overrides": args.overrides,
            "commands": [" ".join(c) for c in (train_cmd, export_cmd, bench_cmd)],
            "train_s": train_s,
            "export_s": export_s,
            "bench_s": bench_s,
            "steps": summary["steps"],
            "train_tokens": summary["tokens"],
            "train_tau_greedy": round(final.get("tau_greedy", 0), 3),
            "tokens_per_s_last": round(final.get("tokens_per_s", 0)),
            "bench": _bench_numbers(exp / "bench"),
        },
    )
    print(json.dumps(_rows()[-1], indent=1))


def demo(args) -> None:
    """The whole `dspark run` of the recipe, with the overrides, timed end to end (stage times from its artifacts)."""
    out = args.work / f"demo-{args.name}"
    log = out.with_suffix(".log")
    rec = provenance.Recording("demo_tau", allow_dirty=args.allow_dirty)
    # a fresh run every time: `dspark run` resumes what an earlier run left there, which would time nothing
    shutil.rmtree(out, ignore_errors=True)
    log.unlink(missing_ok=True)
    cmd = [DSPARK, "run", RECIPE, f"output_dir={out}", *args.overrides]
    started = time.time()
    wall = _timed(cmd, log)
    data_manifest = json.loads((out / "data" / "manifest.json").read_text())
    hidden = json.loads((out / "hidden" / "manifest.json").read_text())
    summary = json.loads((out / "train" / "manifest.json").read_text())["summary"]
    mtime = {
        k: (out / p).stat().st_mtime
        for k, p in {
            "datagen": "data/manifest.json",
            "capture": "hidden/manifest.json",
            "train": "train/manifest.json",
            "export": "draft/dspark_manifest.json",
            "bench": "bench/bench.json",
        }.items()
    }
    _record(
        rec,
        {
            "name": f"demo-{args.name}",
            "kind": "demo",
            "overrides": args.overrides,
            "commands": [" ".join(cmd)],
            "wall_s": wall,
            "stage_end_s": {k: round(v - started, 1) for k, v in mtime.items()},  # since the command started
            "datagen_s": round(mtime["datagen"] - started, 1),
            "capture_backend": hidden.get("backend", {}).get("backend"),
            "engine": data_manifest["engine"],
            "conversations": data_manifest["num_conversations"],
            "capture_tokens": hidden["num_tokens"],
            "loss_tokens": hidden["num_loss_tokens"],
            "steps": summary["steps"],
            "train_tokens": summary["tokens"],
            "bench": _bench_numbers(out / "bench"),
            "printed": _closing_lines(log),
        },
    )
    print(json.dumps(_rows()[-1], indent=1))


def _closing_lines(log: Path) -> list[str]:
    """What `dspark run` printed last, from the draft line to the report line (the README shows these)."""
    lines = log.read_text(errors="replace").splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("draft: ")]
    return lines[starts[-1] :] if starts else []


def rebench(args) -> None:
    """Bench a run's draft again on more held-out prompts (T=0, threshold 0), recorded on its row as `bench_N`.

    20 prompts are too few to rank settings: a few long code answers hold most verification steps, and the
    95% CI is +-0.5 (the same drafts ranked differently on the first 20, 60 and 200 prompts)."""
    rec = provenance.Recording("demo_tau", allow_dirty=args.allow_dirty)
    entry = next((r for r in _rows() if r["name"] == args.name), None)
    if entry is None:
        raise SystemExit(f"demo_tau.json has no row {args.name!r} (with provenance): record it first")
    draft = args.work / (f"{args.name}/draft" if entry["kind"] == "demo" else f"exp-{args.name}/draft")
    data = args.work / (args.name if entry["kind"] == "demo" else entry["data"])
    out = draft.parent / f"bench{args.prompts}"
    cmd = [
        DSPARK,
        "bench",
        str(draft),
        "--recipe",
        RECIPE,
        f"output_dir={data}",
        f"bench.output_dir={out}",
        "bench.temperatures=[0.0, 1.0]" if args.t1 else "bench.temperatures=[0.0]",
        "bench.confidence_thresholds=[0.0]",
        f"bench.num_prompts={args.prompts}",
        "--offline",
    ]
    seconds = _timed(cmd, draft.parent / f"rebench{args.prompts}.log")
    entry[f"bench_{args.prompts}"] = {
        "provenance": rec.provenance(),
        **_bench_numbers(out),
        "seconds": seconds,
        "command": " ".join(cmd),
    }
    _record(rec, entry, new=False)
    print(json.dumps(entry[f"bench_{args.prompts}"], indent=1))


def _tau(entry: dict, key: str, bench: str = "bench") -> str:
    b = entry.get(bench, {}).get(key)
    return f"{b['tau']:.2f} [{b['ci95'][0]:.2f}, {b['ci95'][1]:.2f}]" if b else "-"


def table(_args) -> None:
    """demo_tau.md again from demo_tau.json (after a change of this script's rendering only)."""
    data = json.loads(RESULTS.read_text())
    if not isinstance(data, dict) or "provenance" not in data:
        raise SystemExit("demo_tau.json has no provenance: record a row first")
    provenance.write_record(RESULTS.parent, "demo_tau", data, markdown(data))


def _load(r: dict) -> str:
    return f"{r['provenance']['load']['during_mean']} / {r['provenance']['load']['during_max']}"


def markdown(data: dict) -> str:
    rows = data["rows"]
    lines = [
        "# Demo draft: held-out tau per setting (tiny-mla, bench.datasets: [tiny-eval])",
        "",
        "Command: `python benchmarks/demo_tau.py ...` (see the module docstring); every row's exact commands are "
        "in demo_tau.json.",
        "",
        "## Data (datagen + capture)",
        "",
        "| data | overrides | engine | conversations | tokens (loss) | datagen s | capture s | capture backend | "
        "load mean / max |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r["kind"] == "data":
            lines.append(
                f"| {r['name']} | {' '.join(r['overrides']) or '-'} | {r['engine']['engine']} | {r['conversations']} | "
                f"{r['capture_tokens']} ({r['loss_tokens']}) | {r['datagen_s']} | {r['capture_s']} | "
                f"{r['capture_backend']} | {_load(r)} |"
            )
    lines += [
        "",
        "## Training runs on one capture (train + export + bench)",
        "",
        "| run | data | overrides | steps | tokens | train s | tau T=0 [95% CI] | tau T=1 | T=0, all 200 prompts "
        "| train-log tau | load mean / max |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r["kind"] == "train":
            lines.append(
                f"| {r['name']} | {r['data']} | {' '.join(r['overrides']) or '-'} | {r['steps']} | {r['train_tokens']} | "
                f"{r['train_s']} | {_tau(r, 'T=0')} | {_tau(r, 'T=1')} | {_tau(r, 'T=0', 'bench_200')} | "
                f"{r['train_tau_greedy']} | {_load(r)} |"
            )
    lines += [
        "",
        "## Whole demo (`dspark run`)",
        "",
        "| run | overrides | wall s | datagen s | capture backend | stage ends (s after start) | tokens (loss) | "
        "steps | tau T=0 [95% CI] | tau T=1 [95% CI] | tiny-requests T=0 / T=1 | all 200 prompts: T=0 / T=1 | "
        "tiny-requests, all 60: T=0 / T=1 | load mean / max |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r["kind"] == "demo":
            ends = ", ".join(f"{k} {v}" for k, v in r["stage_end_s"].items())
            lines.append(
                f"| {r['name']} | {' '.join(r['overrides']) or '-'} | {r['wall_s']} | {r['datagen_s']} | "
                f"{r['capture_backend']} | {ends} | {r['capture_tokens']} "
                f"({r['loss_tokens']}) | {r['steps']} | {_tau(r, 'T=0')} | {_tau(r, 'T=1')} | "
                f"{_tau(r, 'tiny-requests T=0')} / {_tau(r, 'tiny-requests T=1')} | "
                f"{_tau(r, 'T=0', 'bench_200')} / {_tau(r, 'T=1', 'bench_200')} | "
                f"{_tau(r, 'tiny-requests T=0', 'bench_200')} / {_tau(r, 'tiny-requests T=1', 'bench_200')} | "
                f"{_load(r)} |"
            )
    for r in rows:
        if r["kind"] == "demo" and r.get("printed"):
            lines += ["", f"What `{r['name']}` printed at its end:", "", "```", *r["printed"], "```"]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=Path(os.environ.get("DEMO_TAU_WORK", "/tmp/demo_tau")))
    sub = parser.add_subparsers(dest="what", required=True)
    p = sub.add_parser("data")
    p.add_argument("name")
    p.add_argument("overrides", nargs="*")
    p.set_defaults(func=data)
    p = sub.add_parser("train")
    p.add_argument("name")
    p.add_argument("--data", required=True)
    p.add_argument("--t1", action="store_true", help="also bench at T=1")
    p.add_argument("overrides", nargs="*")
    p.set_defaults(func=train)
    p = sub.add_parser("demo")
    p.add_argument("name")
    p.add_argument("overrides", nargs="*")
    p.set_defaults(func=demo)
    p = sub.add_parser("rebench")
    p.add_argument("name", help="a train or demo row of demo_tau.json")
    p.add_argument("--prompts", type=int, default=200)
    p.add_argument("--t1", action="store_true", help="also bench at T=1")
    p.set_defaults(func=rebench)
    for command in sub.choices.values():
        provenance.add_arguments(command)
    sub.add_parser("table").set_defaults(func=table)
    args, extra = parser.parse_known_args()  # overrides may follow --data
    if extra and not hasattr(args, "overrides"):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if extra:
        args.overrides += extra
    args.work.mkdir(parents=True, exist_ok=True)
    args.func(args)


if __name__ == "__main__":
    main()
