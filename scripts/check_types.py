"""Type-check dspark_cli/ with mypy and fail on any change from the baseline, which only ever shrinks.

    .venv/bin/python scripts/check_types.py                # what `bash scripts/dev.sh test` runs (~1 min cold, ~2 s warm)
    .venv/bin/python scripts/check_types.py --update       # drop the baseline entries that no longer occur
    .venv/bin/python scripts/check_types.py --update --allow-new   # regenerate it from scratch (maintainer only)
    .venv/bin/python -m mypy dspark_cli/capture/plan.py    # one file's findings, with line numbers

mypy's settings are in pyproject.toml (`[tool.mypy]`). Each finding is normalised to `path: error-code: message`
without its line number, so edits that move code do not churn `.mypy-baseline.txt`; the baseline is a multiset (the
same line twice is two findings, so a second copy of a known error is new). The check fails when mypy reports a
finding the baseline lacks (one line each, and the command that shows it), and also when a baseline entry no
longer occurs, asking for `--update`, which only removes entries unless `--allow-new` is given. Standard library
only: mypy runs as `python -m mypy` with this interpreter.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASELINE = ROOT / ".mypy-baseline.txt"
HEADER = (
    "# mypy findings on dspark_cli/ accepted for now: `path: error-code: message`, sorted, one per occurrence.\n"
    "# Only ever shrinks: written by scripts/check_types.py --update (see its docstring); fix one, then remove it.\n"
)
# path:line[:column]: error: message  [code]   (the code is absent on a few findings, e.g. syntax errors)
_ERROR = re.compile(
    r"^(?P<path>[^:\s][^:]*):(?P<line>\d+)(?::\d+)?: error: (?P<message>.*?)(?:  \[(?P<code>[\w-]+)\])?$"
)
_LINE_REF = re.compile(r"\bon line \d+\b")  # "defined on line 12" moves with the code too


def normalise(output: str) -> list[str]:
    """mypy's text output -> sorted `path: error-code: message` entries, one per error (notes dropped)."""
    entries = []
    for raw in output.splitlines():
        match = _ERROR.match(raw.rstrip())
        if match is None:
            continue
        path = match["path"].replace("\\", "/")
        message = _LINE_REF.sub("on line N", match["message"])
        entries.append(f"{path}: {match['code'] or 'error'}: {message}")
    return sorted(entries)


def read_baseline(path: Path) -> list[str]:
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    return [line for line in lines if line.strip() and not line.startswith("#")]


def write_baseline(path: Path, entries: Counter[str]) -> None:
    body = "".join(f"{entry}\n" for entry in sorted(entries.elements()))
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(HEADER + body, encoding="utf-8")
    tmp.replace(path)


def run_mypy() -> tuple[int, str]:
    """mypy's exit status and output for the files pyproject.toml names (0 clean, 1 findings, 2 it could not run)."""
    if importlib.util.find_spec("mypy") is None:
        return 2, f"mypy is not installed in {sys.executable}: pip install -e '.[dev]' (or mypy==2.4.1)"
    command = [sys.executable, "-m", "mypy", "--no-pretty", "--no-color-output", "--show-error-codes"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    return done.returncode, done.stdout + done.stderr


def check(
    mypy_status: int, mypy_output: str, baseline_path: Path, *, update: bool = False, allow_new: bool = False
) -> tuple[int, list[str]]:
    """Compare mypy's findings with the baseline -> (exit status, lines to print); `update` rewrites the baseline."""
    current = Counter(normalise(mypy_output))
    if mypy_status not in (0, 1) or (mypy_status == 1 and not current):
        tail = mypy_output.strip().splitlines()[-20:]
        return 1, [f"type check: mypy could not run (exit status {mypy_status}):", *tail]
    baseline = Counter(read_baseline(baseline_path))
    new = current - baseline
    fixed = baseline - current
    try:
        shown = baseline_path.relative_to(ROOT)
    except ValueError:
        shown = baseline_path
    lines = []
    if update:
        kept = current if allow_new else baseline & current
        if kept != baseline or not baseline_path.exists():
            write_baseline(baseline_path, kept)
            lines.append(f"type check: {shown} now holds {sum(kept.values())} entries (was {sum(baseline.values())})")
        fixed = Counter()
        if allow_new:
            new = Counter()
    python = _shown_python()
    for entry in sorted(new.elements()):
        path = entry.split(": ", 1)[0]
        lines.append(f"new type error: {entry}  (see it: {python} -m mypy {path})")
    for entry in sorted(fixed.elements()):
        lines.append(f"no longer occurs, remove it from {shown}: {entry}")
    if fixed:
        lines.append(f"type check: the baseline only shrinks; run: {python} scripts/check_types.py --update")
    if new or fixed:
        return 1, lines
    lines.append(f"type check: {sum(current.values())} known mypy findings, none new ({shown})")
    return 0, lines


def _shown_python() -> str:
    """This interpreter, relative to the checkout when it is the project's venv (`.venv/bin/python`)."""
    try:
        return str(Path(sys.executable).relative_to(ROOT))
    except ValueError:
        return sys.executable


def main(argv: list[str] | None = None, *, mypy_result: tuple[int, str] | None = None) -> int:
    """The command; `mypy_result` (exit status, output) replaces the mypy run (the tests feed canned output)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--update", action="store_true", help="rewrite the baseline: remove entries no longer seen")
    parser.add_argument("--allow-new", action="store_true", help="with --update: also add the new findings")
    parser.add_argument("--baseline", type=Path, default=BASELINE, help="default: %(default)s")
    args = parser.parse_args(argv)
    if args.allow_new and not args.update:
        parser.error("--allow-new only goes with --update")
    status, output = mypy_result if mypy_result is not None else run_mypy()
    code, lines = check(status, output, args.baseline, update=args.update, allow_new=args.allow_new)
    print("\n".join(lines), file=sys.stderr if code else sys.stdout)
    return code


if __name__ == "__main__":
    sys.exit(main())
