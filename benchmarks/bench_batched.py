"""`dspark bench --offline` with the reference engine one request at a time vs batched (`bench.batch_size`).

    .venv/bin/python benchmarks/bench_batched.py            # results/bench_batched.{json,md}; ~12 min on 2 quiet cores
    .venv/bin/python benchmarks/bench_batched.py --prompts 4 --sizes 1,4 --out-dir /tmp/bb --allow-dirty   # a check

A small draft is trained first on the demo's recipe and target (`templates/recipes/tiny.yaml`, `tiny-mla`:
`--train-prompts` prompts, `--steps` steps; `dspark datagen`, `dspark train`, `dspark export`), so tau is a
trained draft's. Then the same `dspark bench DRAFT --offline` runs once per batch size, in a fresh process
each, on `--prompts` prompts of tiny-eval and of tiny-requests at T=0 and T=1 with the ngram and untrained
baselines (confidence threshold 0 only, no context sweep): wall seconds of the whole command, generated
tokens over the bench's own measured seconds, and tau per dataset and temperature, which must be equal
across batch sizes (the batched engine is exact request for request: tests/bench/test_bench_batched.py);
the script fails if they are not.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import provenance  # benchmarks/provenance.py
from demo_tau import _timed  # benchmarks/demo_tau.py: one command, logged and timed

RECIPE = "templates/recipes/tiny.yaml"
DSPARK = str(Path(sys.executable).with_name("dspark"))


def numbers(bench_dir: Path) -> dict:
    """Per (dataset, temperature) at threshold 0: tau, tokens, the bench's seconds; and the baselines' taus."""
    report = json.loads((bench_dir / "bench.json").read_text())
    out: dict = {}
    for run in report["offline"]["runs"]:
        if run.get("threshold", 0.0) != 0.0:
            continue
        key = f"{run['dataset']} T={run['temperature']:g}"
        out[key] = {
            "tau": round(run["tau"]["mean"], 4),
            "tokens": run.get("output_tokens"),
            "seconds": run.get("seconds"),
            "tokens_per_s": run.get("tokens_per_second"),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1,16", help="bench.batch_size values (default 1,16)")
    parser.add_argument("--prompts", type=int, default=20, help="prompts per test set (default 20)")
    parser.add_argument("--train-prompts", type=int, default=600, help="training prompts (default 600)")
    parser.add_argument("--steps", type=int, default=200, help="training steps (default 200)")
    parser.add_argument("--work", type=Path, default=None, help="working directory (default: a new temp dir)")
    parser.add_argument("--out-dir", type=Path, default=None, help="write the record here instead of results/")
    provenance.add_arguments(parser)
    args = parser.parse_args()
    rec = provenance.Recording("bench_batched", allow_dirty=args.allow_dirty, out_dir=args.out_dir)
    work = args.work or Path(tempfile.mkdtemp(prefix="dspark-bench-batched-"))
    work.mkdir(parents=True, exist_ok=True)
    log = work / "log.txt"
    base = [
        f"output_dir={work / 'run'}",
        f"datagen.sources=[{{path: tiny-prompts, max_samples: {args.train_prompts}}}]",
        f"train.max_steps={args.steps}",
        "train.log_every=50",
    ]
    timings = {"datagen": _timed([DSPARK, "datagen", RECIPE, *base], log)}
    timings["train"] = _timed([DSPARK, "train", RECIPE, *base], log)
    draft = work / "draft"
    _timed([DSPARK, "export", str(work / "run" / "train"), "--recipe", RECIPE, *base, "-o", str(draft)], log)
    rows = []
    for size in [int(s) for s in args.sizes.split(",")]:
        bench_dir = work / f"bench-{size}"
        bench = [
            "bench.datasets=[tiny-eval, tiny-requests]",
            "bench.temperatures=[0.0, 1.0]",
            f"bench.num_prompts={args.prompts}",
            "bench.confidence_thresholds=[0.0]",
            "bench.baselines=[ngram, untrained]",
            "bench.context_sweep=false",
            f"bench.batch_size={size}",
            f"bench.output_dir={bench_dir}",
        ]
        started = time.perf_counter()
        _timed([DSPARK, "bench", str(draft), "--recipe", RECIPE, *base, *bench, "--offline"], log)
        rows.append({"batch_size": size, "wall_s": round(time.perf_counter() - started, 1), "runs": numbers(bench_dir)})
    taus = [{k: v["tau"] for k, v in row["runs"].items()} for row in rows]
    if any(t != taus[0] for t in taus[1:]):
        sys.exit(f"tau differs between batch sizes: {taus}; see {log}")
    result = {
        "target": "tiny-mla",
        "recipe": RECIPE,
        "settings": {
            "sizes": [r["batch_size"] for r in rows],
            "prompts_per_set": args.prompts,
            "train_prompts": args.train_prompts,
            "steps": args.steps,
        },
        "rows": rows,
        "timings_s": timings,
    }
    rec.write(result, markdown)
    print(markdown(result))


def markdown(result: dict) -> str:
    s = result["settings"]
    rows = result["rows"]
    keys = list(rows[0]["runs"])
    md = [
        f"# `dspark bench --offline`: one request at a time vs batched ({result['target']}, {result['recipe']})",
        "",
        f"A draft trained here ({s['train_prompts']} prompts, {s['steps']} steps), scored on {s['prompts_per_set']} "
        "prompts of tiny-eval and of tiny-requests at T=0 and T=1 with the ngram and untrained baselines, once per "
        "`bench.batch_size`, each a fresh `dspark bench` process. tau is equal at every batch size (the script "
        "checks it); tokens/s is the draft's runs' generated tokens over the bench's measured seconds.",
        "",
        "| batch size | whole command (s) | " + " | ".join(f"{k} tok/s" for k in keys) + " |",
        "|---|---|" + "---|" * len(keys),
    ]
    for row in rows:
        cells = [f"{(row['runs'][k].get('tokens_per_s') or 0):.0f}" for k in keys]
        md.append(f"| {row['batch_size']} | {row['wall_s']:.0f} | " + " | ".join(cells) + " |")
    md += ["", "tau (every batch size): " + ", ".join(f"{k} {rows[0]['runs'][k]['tau']:.2f}" for k in keys) + "."]
    times = ", ".join(f"{k} {v:.0f}" for k, v in result["timings_s"].items())
    md += ["", f"Draft made in (s): {times}."]
    return "\n".join(md) + "\n"


if __name__ == "__main__":
    main()
