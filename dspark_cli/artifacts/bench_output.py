"""A bench report folder (`bench.output_dir`): bench writes only a folder it made, one draft's report per folder.

    output_problem("runs/tiny/bench", "runs/tiny/draft")   # None, or the line saying why not
    owner_mark(Path("runs/tiny/bench"), "runs/tiny/draft")  # {"kind": "dspark.bench", "draft": "../draft"}

What `dspark bench` (bench/run.py) refuses before any work, and `dspark validate` with it
(preflight/paths.py). The owner mark (`.dspark-owner`, as datagen, capture and train leave theirs) also
names the draft benched there, relative to the folder, so a moved run tree still matches; it stays on
this machine (publish uploads bench.json and the files it lists, nothing else). Import-light.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from dspark_cli.artifacts.bench import KIND, REPORT
from dspark_cli.artifacts.files import OWNER_NAME, ownership_problem
from dspark_cli.recipe.bounded import read_json

FIELD = "bench.output_dir"


def _real(path: str | os.PathLike[str]) -> Path:
    return Path(os.path.realpath(os.path.expanduser(path)))


def _owner(out: Path) -> dict[str, Any]:
    try:
        data = read_json(out / OWNER_NAME)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _earlier_report(out: Path) -> dict[str, Any] | None:
    """bench.json of an earlier bench in `out` ({} if there is none, None if it is not a dspark bench report)."""
    if not (out / REPORT).is_file():
        return {}
    try:
        data = read_json(out / REPORT)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("kind") == KIND else None


def _unmarked_report(out: Path) -> bool:
    """`out` holds a report an older dspark wrote before it marked its folders: bench.json of kind dspark.bench
    and nothing but the files it lists (bench.md, the plots) beside hidden ones (its temp files, the lock)."""
    data = _earlier_report(out)
    if not data:
        return False
    try:
        entries = list(out.iterdir())
    except OSError:
        return False
    listed = ((data.get("files") or {}).get("checksums") or {}) if isinstance(data.get("files"), dict) else {}
    names = {p.name for p in entries if not p.name.startswith(".")}
    return names <= {REPORT, *(listed if isinstance(listed, dict) else ())}


def _benched_draft(out: Path) -> Path | None:
    """The draft the report in `out` measured, as a real path on this machine; None if unknown."""
    recorded = _owner(out).get("draft")
    if isinstance(recorded, str):  # relative to the folder, so a moved run tree still matches
        return Path(os.path.normpath(_real(out) / recorded))
    data = _earlier_report(out) or {}
    if "draft_sha256" not in data and isinstance(data.get("draft_dir"), str):  # an older dspark: as it was given
        return _real(data["draft_dir"])
    return None


def output_problem(out: str | os.PathLike[str], draft: str | os.PathLike[str] | None) -> str | None:
    """Why `dspark bench` of `draft` (None: a server alone) may not write its report to `out`; None when it may.

    It writes a folder that does not exist, an empty one, or its own earlier report (`.dspark-owner` of kind
    dspark.bench, or a report of an older dspark and nothing else): never a folder holding anything it did not
    make (a bench.md of yours). And one draft's report per folder: a report of another draft is not replaced.
    """
    out = Path(out).expanduser()
    if out.is_dir() and not out.is_symlink() and _owner(out).get("kind") is None and _unmarked_report(out):
        problem = None
    else:
        problem = ownership_problem(out, KIND, FIELD)
    if problem is not None or draft is None or not (out / REPORT).is_file():
        return problem
    earlier = _benched_draft(out)
    if earlier is None or earlier == _real(draft):
        return None
    suggestion = Path(draft).expanduser().parent / f"{_real(draft).name}-bench"
    return (
        f"{FIELD}: {out} holds the bench report of another draft ({os.path.relpath(earlier)}); refusing to replace "
        f"it with the report of {draft}: pass -o a new directory (e.g. -o {suggestion})"
    )


def owner_mark(out: Path, draft: str | os.PathLike[str] | None) -> dict[str, Any]:
    """What `.dspark-owner` of a report folder says: its kind, and the draft benched there (relative to the
    folder), kept from the earlier report when this run benches a server alone."""
    mark: dict[str, Any] = {"kind": KIND}
    if draft is not None:
        mark["draft"] = os.path.relpath(_real(draft), _real(out))
    elif isinstance(_owner(out).get("draft"), str):
        mark["draft"] = _owner(out)["draft"]
    return mark
