"""`run_bench`: offline and/or online benchmarks of one draft, then the report. The CLI calls this.

    from dspark_cli.bench.run import run_bench
    result = run_bench(recipe, draft_dir="runs/tiny/draft", offline=True)
    result = run_bench(recipe, endpoint="http://127.0.0.1:8000")     # bench.baseline_endpoint for speedups
    result["files"]      # bench.json, bench.md, plots under recipe.stage_dir("bench")

Without `--recipe`, `dspark bench DRAFT_DIR` benchmarks with the recipe the draft was made with
(`recipe.yaml` in the draft dir, else the `recipe` recorded in its dspark_manifest.json), except for
the fields that grant trust (`dspark_cli/serving/trust.py`). The report directory is checked
writable before any work, and bench.json is written before the plots (which can fail late).
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dspark_cli import __version__
from dspark_cli.errors import UsageError
from dspark_cli.recipe import Recipe

log = logging.getLogger(__name__)
Progress = Callable[[int, int, int], None]


def run_bench(recipe: Recipe, *, draft_dir: str | Path | None = None, offline: bool = False,
              endpoint: str | None = None, on_progress: Progress | None = None) -> dict[str, Any]:
    """Run what was asked (offline engine on `draft_dir`, online against `endpoint`); write the report."""
    endpoint = endpoint or recipe.bench.endpoint
    if not offline and not endpoint:
        raise UsageError("nothing to benchmark", "pass DRAFT_DIR --offline, or --endpoint URL of a running server")
    if offline and draft_dir is None:
        draft_dir = recipe.stage_dir("export")
    from dspark_cli.artifacts.bench import KIND
    from dspark_cli.artifacts.files import ensure_writable_dir

    out_dir = ensure_writable_dir(recipe.stage_dir("bench"), "the bench report")  # before the work, not after
    result: dict[str, Any] = {
        "kind": KIND, "format_version": 1, "dspark": __version__, "name": recipe.name,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "target": recipe.target.model, "draft_dir": str(draft_dir) if draft_dir else None,
        "bench": recipe.bench.model_dump(mode="json"), "serve": recipe.serve.model_dump(mode="json"),
        "warnings": [],
    }
    if offline:
        from dspark_cli.bench.offline import run_offline

        result["offline"] = run_offline(recipe, draft_dir, on_progress=on_progress)
        result["warnings"] += result["offline"]["engine"]["warnings"]
    if endpoint:
        from dspark_cli.bench.online import run_online

        result["online"] = run_online(recipe, endpoint, on_progress=on_progress)
    from dspark_cli.bench.report import reference_rows, write_report

    result["reference"] = reference_rows(result, recipe.bench.reference)
    write_report(result, out_dir)
    return result
