"""A bench report folder (`bench.output_dir`): bench writes only a folder it made, one report per folder.

    output_problem("runs/tiny/bench", "runs/tiny/draft")   # None, or the line saying why not
    owner_mark(Path("runs/tiny/bench"), "runs/tiny/draft")  # {"kind": "dspark.bench", "draft": "../draft"}
    owner_mark(Path("runs/cmp"), ["runs/b/draft", "runs/a/draft"])  # {..., "drafts": ["../a/draft", "../b/draft"]}

A report belongs to the draft it measured, or to the set of drafts a several-draft bench compared (their
sorted list: the same drafts in another order are the same report); a report of other drafts, or of one
of them alone, is not replaced.

What `dspark bench` (bench/run.py) refuses before any work, and `dspark validate` with it
(preflight/paths.py). The owner mark (`.dspark-owner`, as datagen, capture and train leave theirs) also
names the draft benched there, relative to the folder, so a moved run tree still matches; it stays on
this machine (publish uploads bench.json and the files it lists, nothing else). Import-light.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
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


Drafts = str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | None  # one draft, several, or a server alone


def _benched_drafts(out: Path) -> list[Path] | None:
    """The draft(s) the report in `out` measured, as real paths on this machine (sorted); None if unknown."""
    owner = _owner(out)
    recorded = owner.get("drafts", owner.get("draft"))
    if isinstance(recorded, str):
        recorded = [recorded]
    if isinstance(recorded, list) and recorded and all(isinstance(r, str) for r in recorded):
        return sorted(Path(os.path.normpath(_real(out) / r)) for r in recorded)  # relative: a moved tree matches
    data = _earlier_report(out) or {}
    if "draft_sha256" not in data and isinstance(data.get("draft_dir"), str):  # an older dspark: as it was given
        return [_real(data["draft_dir"])]
    return None


def _listed(draft: Drafts) -> list[str | os.PathLike[str]]:
    if draft is None:
        return []
    return [draft] if isinstance(draft, (str, os.PathLike)) else list(draft)


def output_problem(out: str | os.PathLike[str], draft: Drafts) -> str | None:
    """Why `dspark bench` of `draft` (None: a server alone) may not write its report to `out`; None when it may.

    It writes a folder that does not exist, an empty one, or its own earlier report (`.dspark-owner` of kind
    dspark.bench, or a report of an older dspark and nothing else): never a folder holding anything it did not
    make (a bench.md of yours). And one report per folder: a report of another draft (or of other drafts, for
    several: `draft` a list) is not replaced.
    """
    out = Path(out).expanduser()
    if out.is_dir() and not out.is_symlink() and _owner(out).get("kind") is None and _unmarked_report(out):
        problem = None
    else:
        problem = ownership_problem(out, KIND, FIELD)
    drafts = _listed(draft)
    if problem is not None or not drafts or not (out / REPORT).is_file():
        return problem
    earlier = _benched_drafts(out)
    if earlier is None or earlier == sorted(_real(d) for d in drafts):
        return None
    if len(drafts) == 1 and len(earlier) == 1:
        suggestion = Path(drafts[0]).expanduser().parent / f"{_real(drafts[0]).name}-bench"
        return (
            f"{FIELD}: {out} holds the bench report of another draft ({os.path.relpath(earlier[0])}); refusing to "
            f"replace it with the report of {drafts[0]}: pass -o a new directory (e.g. -o {suggestion})"
        )
    theirs = ", ".join(os.path.relpath(p) for p in earlier)
    mine = ", ".join(str(d) for d in drafts)
    return (
        f"{FIELD}: {out} holds the bench report of {'other drafts' if len(earlier) > 1 else 'another draft'} "
        f"({theirs}); refusing to replace it with the report of {mine}: pass -o a new directory"
    )


def owner_mark(out: Path, draft: Drafts) -> dict[str, Any]:
    """What `.dspark-owner` of a report folder says: its kind, and the draft benched there (relative to the
    folder; `drafts`, their sorted list, for several), kept from the earlier report when this run benches a
    server alone."""
    mark: dict[str, Any] = {"kind": KIND}
    drafts = _listed(draft)
    if len(drafts) == 1:
        mark["draft"] = os.path.relpath(_real(drafts[0]), _real(out))
    elif drafts:
        mark["drafts"] = sorted(os.path.relpath(_real(d), _real(out)) for d in drafts)
    else:
        mark.update({k: v for k, v in _owner(out).items() if k in ("draft", "drafts")})
    return mark
