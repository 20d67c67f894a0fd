"""How long `dspark --help` takes, next to `python -c "import torch"` for scale.

    .venv/bin/python benchmarks/cli_startup.py            # prints a table, writes results/cli_startup.{json,md}

Goal: `dspark --help` <= 0.3 s on the 2-core CI machine, and neither `--help`,
`dspark CMD --help` nor shell completion imports torch, transformers, vllm, datasets or a hub client.
Each command runs `--repeat` times in a fresh process; the median wall time is reported.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import provenance  # benchmarks/provenance.py

HEAVY = ("torch", "transformers", "vllm", "datasets", "huggingface_hub", "modelscope")
PROBE = (
    "import sys, runpy\n"
    "sys.argv = ['dspark'] + sys.argv[1:]\n"
    "try:\n    runpy.run_module('dspark_cli.cli', run_name='__main__')\n"
    "except SystemExit:\n    pass\n"
    f"sys.stderr.write('HEAVY=' + ','.join(m for m in {HEAVY!r} if m in sys.modules) + '\\n')\n"
)


def wall(cmd: list[str], env: dict[str, str] | None = None, repeat: int = 7) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run(cmd, capture_output=True, env=env, check=False)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def heavy_modules(args: list[str], env: dict[str, str] | None = None) -> str:
    proc = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, env=env)
    line = [x for x in proc.stderr.splitlines() if x.startswith("HEAVY=")]
    return line[-1].removeprefix("HEAVY=") if line else "?"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--out", type=Path, default=provenance.RESULTS, help="the folder the record goes to")
    provenance.add_arguments(parser)
    args = parser.parse_args()
    rec = provenance.Recording("cli_startup", allow_dirty=args.allow_dirty, out_dir=args.out)
    dspark = str(Path(sys.executable).with_name("dspark"))
    completion = dict(os.environ, _DSPARK_COMPLETE="complete_bash", COMP_WORDS="dspark tr", COMP_CWORD="1")
    rows = {
        "dspark --help": (wall([dspark, "--help"], repeat=args.repeat), heavy_modules(["--help"])),
        "dspark train --help": (
            wall([dspark, "train", "--help"], repeat=args.repeat),
            heavy_modules(["train", "--help"]),
        ),
        "completion (dspark tr<TAB>)": (
            wall([dspark], env=completion, repeat=args.repeat),
            heavy_modules([], completion),
        ),
        "python -c 'import torch'": (wall([sys.executable, "-c", "import torch"], repeat=args.repeat), "torch"),
        "python -c 'pass'": (wall([sys.executable, "-c", "pass"], repeat=args.repeat), ""),
    }
    print(f"{'command':32} {'median s':>9}  heavy modules imported")
    for name, (seconds, heavy) in rows.items():
        print(f"{name:32} {seconds:9.3f}  {heavy or '-'}")
    record = {
        "repeat": args.repeat,
        "median_seconds": {name: round(s, 4) for name, (s, _) in rows.items()},
        "heavy_modules": {name: h for name, (_, h) in rows.items()},
        "goal_seconds": 0.3,
    }
    rec.write(record, markdown)


def markdown(record: dict) -> str:
    lines = [
        "# `dspark` start-up",
        "",
        f"Median wall time of {record['repeat']} runs, each in a fresh process; goal <= {record['goal_seconds']} s "
        "for `dspark --help` and no heavy module imported.",
        "",
        "| command | median wall time | heavy modules imported |",
        "|---|---|---|",
    ]
    for name, seconds in record["median_seconds"].items():
        lines.append(f"| `{name}` | {seconds:.3f} s | {record['heavy_modules'][name] or 'none'} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
