"""A bench report, read back: `bench.json` of a `dspark bench` run (publish puts it on the model card,
a later bench uses its online runs as the baseline).

    report = read_bench_report("runs/tiny/bench/bench.json")   # the report, or one line saying why not

Written by `dspark_cli.bench` (`bench/report.py`: bench.json, bench.md and the plots; bench.json is
written first, with kind dspark.bench, so a report whose plots failed is still a report).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from dspark_cli.errors import DataError, UsageError

KIND = "dspark.bench"
REPORT = "bench.json"


def read_bench_report(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The bench report in the file `path`; one-line UsageError when there is none, DataError when it
    is unreadable or not a dspark bench report."""
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"no bench report at {path}", "run `dspark bench` first (it writes bench.json)")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}: invalid JSON ({exc.msg})", "run `dspark bench` again") from None
    if not isinstance(data, dict) or data.get("kind") != KIND:
        kind = data.get("kind") if isinstance(data, dict) else None
        raise DataError(f"{path} is not a dspark bench report (kind {kind!r})", "run `dspark bench` again")
    return data
