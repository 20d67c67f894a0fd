"""`run_bench`: offline and/or online benchmarks of one draft, then the report. The CLI calls this.

    from dspark_cli.bench.run import run_bench
    result = run_bench(recipe, draft_dir="runs/tiny/draft", offline=True)
    result = run_bench(recipe, endpoint="http://127.0.0.1:8000")     # bench.baseline_endpoint for speedups
    result.files         # bench.json, bench.md, plots under recipe.stage_dir("bench"); result: a BenchSummary

Without `--recipe`, `dspark bench DRAFT_DIR` benchmarks with the recipe the draft was made with
(`recipe.yaml` in the draft dir, else the `recipe` recorded in its dspark_manifest.json), except for
the fields that grant trust (`dspark_cli/recipe/trust.py`). Everything checkable is checked before
any work: the report directory (bench.json is written there at once, marked `"complete": false`, so
a full disk stops the run before the benchmark, naming the file) and `bench.baseline_report`. Results
are written as they come (after the offline runs, after every online level), and bench.json before
the plots (which can fail late): a run that fails half-way keeps what it measured.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dspark_cli import __version__
from dspark_cli.artifacts.bench import BenchSummary
from dspark_cli.errors import DsparkError, UsageError
from dspark_cli.recipe import Recipe

log = logging.getLogger(__name__)
Progress = Callable[[int, int, int], None]


def run_bench(
    recipe: Recipe,
    *,
    draft_dir: str | Path | None = None,
    offline: bool = False,
    endpoint: str | None = None,
    on_progress: Progress | None = None,
) -> BenchSummary:
    """Run what was asked (offline engine on `draft_dir`, online against `endpoint`); write the report."""
    endpoint = endpoint or recipe.bench.endpoint
    if not offline and not endpoint:
        raise UsageError("nothing to benchmark", "pass DRAFT_DIR --offline, or --endpoint URL of a running server")
    if offline and draft_dir is None:
        draft_dir = recipe.stage_dir("export")
    from dspark_cli.artifacts.bench import KIND
    from dspark_cli.artifacts.files import ensure_writable_dir

    out_dir = ensure_writable_dir(recipe.stage_dir("bench"), "the bench report")  # before the work, not after
    baseline = None
    if endpoint and recipe.bench.baseline_report and not recipe.bench.baseline_endpoint:
        from dspark_cli.bench.endpoint import load_baseline_report

        baseline = load_baseline_report(recipe.bench.baseline_report)  # a bad path is refused before the run
    result: dict[str, Any] = {
        "kind": KIND,
        "format_version": 1,
        "dspark": __version__,
        "name": recipe.name,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "target": recipe.target.model,
        "draft_dir": str(draft_dir) if draft_dir else None,
        "bench": recipe.bench.model_dump(mode="json"),
        "serve": recipe.serve.model_dump(mode="json"),
        "warnings": [],
        "complete": False,
    }
    from dspark_cli.artifacts.bench import REPORT

    report = out_dir / REPORT
    earlier = report.read_bytes() if report.is_file() and not report.is_symlink() else None
    save_partial(result, out_dir)  # a disk that cannot hold the report fails here, not after the benchmark
    try:
        _measure(result, recipe, out_dir, draft_dir, offline, endpoint, baseline, on_progress)
    except BaseException:
        if "offline" not in result and "online" not in result:  # refused before measuring: as it was before
            if earlier is None:
                report.unlink(missing_ok=True)
            else:
                restore = report.with_name(f".{REPORT}.restore")
                restore.write_bytes(earlier)
                restore.replace(report)
        raise
    from dspark_cli.bench.report import reference_rows, write_report

    summary = BenchSummary.from_dict(result)  # bench.json's records, typed once for the report
    summary.reference = reference_rows(summary, recipe.bench.reference)
    summary.complete = True
    try:
        write_report(summary, out_dir)
    except OSError as exc:
        raise _write_error(exc, out_dir) from None
    return summary


def _measure(
    result: dict[str, Any],
    recipe: Recipe,
    out_dir: Path,
    draft_dir: Any,
    offline: bool,
    endpoint: str | None,
    baseline: dict[str, Any] | None,
    on_progress: Progress | None,
) -> None:
    """The offline and online runs asked for, each saved into bench.json as soon as it is measured."""
    if offline:
        from dspark_cli.bench.offline import run_offline

        result["offline"] = run_offline(recipe, draft_dir, on_progress=on_progress)
        result["warnings"] += result["offline"]["engine"]["warnings"]
        save_partial(result, out_dir)
    if endpoint:
        from dspark_cli.bench.endpoint import run_online

        def on_level(online: dict[str, Any]) -> None:
            result["online"] = online
            save_partial(result, out_dir)

        result["online"] = run_online(recipe, endpoint, on_progress=on_progress, baseline=baseline, on_level=on_level)


def _write_error(exc: OSError, out_dir: Path) -> DsparkError:
    from dspark_cli.artifacts.bench import REPORT
    from dspark_cli.errors import os_error

    error = os_error(exc)
    return type(error)(f"cannot write the bench report to {out_dir / REPORT}: {error.message}", error.hint)


def save_partial(result: dict[str, Any], out_dir: Path) -> None:
    """bench.json with what is measured so far (`"complete": false`); a one-line error naming it if it
    cannot be written."""
    from dspark_cli.artifacts.bench import REPORT
    from dspark_cli.artifacts.files import write_json_atomic

    try:
        write_json_atomic(out_dir / REPORT, result)
    except OSError as exc:
        raise _write_error(exc, out_dir) from None
