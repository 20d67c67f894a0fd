"""Wall time of the README's test command (the whole suite, as CI runs it) and of the fast lane, per commit.

Each commit is measured in a fresh clone of this repository, the way CI runs it: the set-up (`.venv`, untimed)
first, then `bash scripts/dev.sh test -m "not slow"` (the fast lane) and `CI=true bash .ci/run` (the suite), one
after the other. Besides the 1-minute load average, the record keeps the CPU time the rest of the machine used
while each command ran (all CPU time in /proc/stat minus the command's own children): on 2 cores, a run with more
than a few percent of foreign CPU is not a measurement, and the record says so.

    .venv/bin/python benchmarks/suite_time.py --commits b144f5b HEAD   # ~45 min on 2 quiet cores
    .venv/bin/python benchmarks/suite_time.py --commits HEAD --keep    # add HEAD beside rows measured earlier
    .venv/bin/python benchmarks/suite_time.py --commits b144f5b --lanes fast_lane --keep   # one lane again

Writes benchmarks/results/suite_time.{json,md} through benchmarks/provenance.py (the run's commit, command, CPU,
load during it): one row per commit; `--keep` keeps the rows already there that were measured on this host within
the last 12 hours (one session), so two commits can be measured apart.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import provenance  # benchmarks/provenance.py

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"


def _cpu_jiffies() -> int:
    """All CPU time the machine has spent busy (user + nice + system + irq + softirq + steal), in jiffies."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return user + nice + system + irq + softirq + steal


def timed(command: list[str], cwd: Path, env: dict[str, str], log: Path) -> dict:
    """Run `command`; its wall time, exit code, pytest's closing counts and the CPU time others used meanwhile."""
    hz = os.sysconf("SC_CLK_TCK")
    before_children = resource.getrusage(resource.RUSAGE_CHILDREN)
    busy_before, load_before, start = _cpu_jiffies(), os.getloadavg()[0], time.monotonic()
    with log.open("w") as out:
        code = subprocess.run(command, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT).returncode
    wall = time.monotonic() - start
    busy = (_cpu_jiffies() - busy_before) / hz
    after_children = resource.getrusage(resource.RUSAGE_CHILDREN)
    own = (after_children.ru_utime - before_children.ru_utime) + (after_children.ru_stime - before_children.ru_stime)
    text = log.read_text(errors="replace")
    counts = {}
    for line in text.splitlines():
        if re.match(r"^=*\s*\d+ (passed|failed)", line.strip("= ")) or re.search(r"\d+ passed.* in [\d.]+s", line):
            counts = {k: int(v) for v, k in re.findall(r"(\d+) (passed|failed|skipped|deselected|errors?)", line)}
            match = re.search(r" in ([\d.]+)s", line)
            if match:
                counts["pytest_s"] = float(match.group(1))
    return {
        "command": " ".join(command),
        "exit_code": code,
        "wall_s": round(wall, 1),
        "own_cpu_s": round(own, 1),
        "foreign_cpu_s": round(max(busy - own, 0.0), 1),
        "foreign_cores": round(max(busy - own, 0.0) / wall, 3) if wall else None,
        "load_before": round(load_before, 2),
        "load_after": round(os.getloadavg()[0], 2),
        **counts,
    }


LANES = {  # lane -> (command, extra environment)
    "fast_lane": (["bash", "scripts/dev.sh", "test", "-m", "not slow"], {}),
    "suite": (["bash", ".ci/run"], {"CI": "true"}),
}


def measure(commit: str, workdir: Path, lanes: list[str]) -> dict:
    sha = subprocess.run(
        ["git", "rev-parse", commit], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.strip()
    clone = workdir / sha[:10]
    if not clone.is_dir():  # a clone left by an earlier run in --workdir is reused (its set-up too)
        subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
        subprocess.run(["git", "checkout", "-q", sha], cwd=clone, check=True)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=clone, capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"], cwd=clone, capture_output=True, text=True
    ).stdout.strip()
    if head != sha or dirty:
        raise SystemExit(f"suite_time: {clone} is not a clean checkout of {sha[:10]}; remove it")
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "DSPARK_VENV", "PYTHONPATH")}
    print(f"suite_time: {sha[:10]}: set-up (untimed)", file=sys.stderr)
    setup = subprocess.run(
        ["bash", "scripts/dev.sh", "test", "--collect-only", "-q"], cwd=clone, env=env, capture_output=True, text=True
    )
    if not (clone / ".venv" / "bin" / "dspark").exists():
        raise SystemExit(f"suite_time: the set-up of {sha[:10]} failed:\n{setup.stdout[-2000:]}{setup.stderr[-2000:]}")
    row: dict = {"commit": sha}
    for lane in lanes:
        command, extra = LANES[lane]
        print(f"suite_time: {sha[:10]}: {lane} ({' '.join(command)})", file=sys.stderr)
        started = datetime.now(timezone.utc).isoformat(timespec="seconds")
        row[lane] = {
            "measured_at": started,
            **timed(command, clone, dict(env, **extra), workdir / f"{sha[:10]}-{lane}.log"),
        }
    return row


def render(record: dict) -> str:
    lines = [
        "# Test suite and fast lane wall time",
        "",
        f"Made by `{record['provenance']['command']}` on {record['provenance']['cpu_model']} "
        f"({record['provenance']['cores']} cores). Each commit in a fresh clone, set-up untimed; "
        "foreign CPU is the CPU time the rest of the machine used meanwhile (cores on average).",
        "",
        "| commit | measured | lane | exit | wall s | pytest s | passed | failed | skipped | foreign cores | load before |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in record["rows"]:
        for lane in [name for name in LANES if name in row]:
            r = row[lane]
            lines.append(
                f"| {row['commit'][:10]} | {r['measured_at']} | {lane.replace('_', ' ')} | {r['exit_code']} "
                f"| {r['wall_s']} | {r.get('pytest_s', '-')} | {r.get('passed', '-')} | {r.get('failed', 0)} "
                f"| {r.get('skipped', 0)} | {r['foreign_cores']} | {r['load_before']} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--commits", nargs="+", default=["HEAD"])
    parser.add_argument("--lanes", nargs="+", choices=list(LANES), default=list(LANES), help="what to time")
    parser.add_argument(
        "--keep", action="store_true", help="keep this host's lanes measured in the last 12 hours (one session)"
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "suite_time", help="the record goes to OUT's folder")
    parser.add_argument("--workdir", type=Path, help="where the clones go (kept; default: a temporary folder)")
    args = parser.parse_args()
    rec = provenance.Recording("suite_time", out_dir=args.out.parent, measures_tree=False)
    rows = []
    out_json = args.out.with_suffix(".json")
    if args.keep and out_json.is_file():
        old = json.loads(out_json.read_text())
        now = datetime.now(timezone.utc)
        same_host = old.get("provenance", {}).get("cpu_model") == provenance.cpu_model()
        for old_row in old["rows"] if same_host else []:
            recent = {
                lane: result
                for lane, result in old_row.items()
                if lane in LANES and (now - datetime.fromisoformat(result["measured_at"])).total_seconds() < 12 * 3600
            }
            if recent:
                rows.append({"commit": old_row["commit"], **recent})
    with tempfile.TemporaryDirectory(prefix="dspark-suite-time-") as tmp:
        for commit in args.commits:
            row = measure(commit, args.workdir or Path(tmp), args.lanes)
            kept = next((r for r in rows if r["commit"] == row["commit"]), {})
            rows = [r for r in rows if r["commit"] != row["commit"]] + [{**kept, **row}]
    record = rec.write({"rows": rows}, render)
    print(render(record))


if __name__ == "__main__":
    main()
