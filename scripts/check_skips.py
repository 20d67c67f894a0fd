"""Fail on any skip of a test run that tests/skips_allowed.txt does not list (run by `scripts/dev.sh test`).

    .venv/bin/python -m pytest -q --record-skips=/tmp/skips.jsonl tests/capture
    python scripts/check_skips.py /tmp/skips.jsonl

The record is pytest's (tests/requirements_support.py): one JSON object a line, `{"nodeid": ..., "reason": ...}`.
Each unlisted skip is named on one line and the exit status is 1; a malformed allow-list exits 2. Only the
skips of this run matter: allow-list entries that did not run are fine. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ALLOWED = ROOT / "tests" / "skips_allowed.txt"


@dataclass(frozen=True)
class Entry:
    pattern: str  # a node id; `*` matches any run of characters
    reason: str  # what the skip must say (a part of its reason): another skip of the same test is not allowed
    line: int

    def matches(self, nodeid: str, reason: str) -> bool:
        regex = ".*".join(re.escape(part) for part in self.pattern.split("*"))
        return re.fullmatch(regex, nodeid) is not None and self.reason in " ".join(reason.split())


def read_allowed(path: Path) -> list[Entry]:
    """The allow-list's entries: `<node id pattern> | <the skip's reason>` a line; `#` starts a comment line."""
    entries = []
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        text = raw.strip()
        if not text or text.startswith("#"):
            continue
        pattern, bar, reason = (part.strip() for part in text.partition("|"))
        if not bar or not pattern or not reason:
            raise ValueError(f"{path}:{number}: expected `<node id pattern> | <the reason the skip gives>`")
        entries.append(Entry(pattern, reason, number))
    return entries


def read_skips(path: Path) -> list[dict[str, str]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def unlisted(skips: list[dict[str, str]], entries: list[Entry]) -> list[dict[str, str]]:
    return [skip for skip in skips if not any(entry.matches(skip["nodeid"], skip["reason"]) for entry in entries)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("skips", type=Path, help="the run's record (pytest --record-skips=PATH)")
    parser.add_argument("--allowed", type=Path, default=ALLOWED, help="the allow-list (default: %(default)s)")
    args = parser.parse_args(argv)
    try:
        entries = read_allowed(args.allowed)
        skips = read_skips(args.skips)
    except (OSError, ValueError) as exc:  # json.JSONDecodeError is a ValueError
        print(f"check_skips: {exc}", file=sys.stderr)
        return 2
    shown = args.allowed.relative_to(ROOT) if args.allowed.is_relative_to(ROOT) else args.allowed
    bad = unlisted(skips, entries)
    for skip in bad:
        reason = " ".join(skip["reason"].split())  # one line each
        print(f"unlisted skip: {skip['nodeid']}: {reason}", file=sys.stderr)
    if bad:
        print(
            f"check_skips: {len(bad)} of {len(skips)} skips are not in {shown}: install what they need "
            "(scripts/dev.sh), or list them there with the reason they may skip everywhere",
            file=sys.stderr,
        )
        return 1
    print(f"check_skips: {len(skips)} skips, all in {shown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
