"""`run_bench`: offline and/or online benchmarks of one draft, then the report. The CLI calls this.

    from dspark_cli.bench.run import run_bench
    result = run_bench(recipe, draft_dir="runs/tiny/draft", offline=True)
    result = run_bench(recipe, endpoint="http://127.0.0.1:8000")     # bench.baseline_endpoint for speedups
    result.files         # names of bench.json, bench.md and the plots in result.report_dir; result: a BenchSummary

Without `--recipe`, `dspark bench DRAFT_DIR` benchmarks with the recipe the draft was made with
(`recipe.yaml` in the draft dir, else the `recipe` recorded in its dspark_manifest.json), except for
the fields that grant trust (`dspark_cli/recipe/trust.py`). Everything checkable is checked before
any work: the report folder (`bench.output_dir`: bench writes only a new or empty folder or its own
earlier report of the same draft, `artifacts.bench_output.output_problem`; it marks the folder as its own and
holds its lock while it writes; bench.json is written there at once, marked `"complete": false`, so a
full disk stops the run before the benchmark, naming where) and `bench.baseline_report`. Results
are written as they come (after the offline runs, after every online level), and bench.json before
the plots (which can fail late): a run that fails half-way keeps what it measured. bench.json names no
path of this machine: local paths are relative to the report folder (`../draft`) or names (`portable`).
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
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
    from dspark_cli.artifacts.bench_output import FIELD, output_problem

    out_dir = Path(recipe.stage_dir("bench")).expanduser()
    problem = output_problem(out_dir, draft_dir)
    if problem is not None:
        raise UsageError(problem.removeprefix(f"{FIELD}: "), OUTPUT_HINT)
    baseline = None
    if endpoint and recipe.bench.baseline_report and not recipe.bench.baseline_endpoint:
        from dspark_cli.bench.endpoint import load_baseline_report

        baseline = load_baseline_report(recipe.bench.baseline_report)  # a bad path is refused before the run
        baseline["source"] = portable(baseline["source"], out_dir)
    from dspark_cli.artifacts.bench_output import owner_mark
    from dspark_cli.artifacts.files import OWNER_NAME, ensure_writable_dir, exclusive_output, write_json_atomic

    fresh = not out_dir.is_dir() or not any(out_dir.iterdir())
    ensure_writable_dir(out_dir, "the bench report")  # before the work, not after
    with contextlib.ExitStack() as held:
        try:
            try:  # the lock while this process writes, and the folder marked as bench's before anything else
                held.enter_context(exclusive_output(out_dir, FIELD))
                write_json_atomic(out_dir / OWNER_NAME, owner_mark(out_dir, draft_dir))
            except OSError as exc:
                raise _write_error(exc, out_dir) from None
            return _bench(recipe, out_dir, draft_dir, offline, endpoint, baseline, on_progress)
        except BaseException:
            if fresh:  # refused before it wrote a report (a draft that fails its checks): the folder as it was
                _unclaim(out_dir)
            raise


OUTPUT_HINT = "bench replaces only its own report of the same draft: give each draft its own bench.output_dir (-o)"


def _bench(
    recipe: Recipe,
    out_dir: Path,
    draft_dir: str | Path | None,
    offline: bool,
    endpoint: str | None,
    baseline: dict[str, Any] | None,
    on_progress: Progress | None,
) -> BenchSummary:
    """The benchmark and its report, in `out_dir`: bench's own folder, which this process holds."""
    from dspark_cli.artifacts.bench import KIND, REPORT
    from dspark_cli.artifacts.files import sha256_file

    manifest = Path(draft_dir) / "dspark_manifest.json" if draft_dir else None
    # which draft this is, wherever it lies: what publish matches (a server alone has no manifest here)
    identity = {"draft_sha256": sha256_file(manifest)} if manifest is not None and manifest.is_file() else {}
    target = portable(recipe.target.model, out_dir)
    result: dict[str, Any] = {
        "kind": KIND,
        "format_version": 1,
        "dspark": __version__,
        "name": recipe.name,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "target": target,
        "draft_dir": portable(str(draft_dir), out_dir) if draft_dir else None,
        **identity,
        "bench": portable_tree(recipe.bench.model_dump(mode="json"), out_dir),
        "serve": portable_tree(recipe.serve.model_dump(mode="json"), out_dir),
        "warnings": [],
        "complete": False,
    }
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
    summary.report_dir = out_dir
    summary.reference = reference_rows(summary, recipe.bench.reference)
    summary.complete = True
    try:
        write_report(summary, out_dir)
    except OSError as exc:
        raise _write_error(exc, out_dir / REPORT) from None
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
        engine = result["offline"]["engine"]
        engine.update(target=result["target"], draft_dir=result["draft_dir"])  # the names, not this machine's paths
        result["warnings"] += engine["warnings"]
        save_partial(result, out_dir)
    if endpoint:
        from dspark_cli.bench.endpoint import run_online

        def on_level(online: dict[str, Any]) -> None:
            result["online"] = online
            save_partial(result, out_dir)

        result["online"] = run_online(recipe, endpoint, on_progress=on_progress, baseline=baseline, on_level=on_level)


def _unclaim(out_dir: Path) -> None:
    """Take bench's mark and lock out of `out_dir` when they are all it holds (still holding the lock)."""
    from dspark_cli.artifacts.files import LOCK_NAME, OWNER_NAME

    try:
        names = {p.name for p in out_dir.iterdir()}
    except OSError:  # gone, or unreadable: nothing to take back
        return
    if names <= {OWNER_NAME, LOCK_NAME}:
        (out_dir / OWNER_NAME).unlink(missing_ok=True)
        (out_dir / LOCK_NAME).unlink(missing_ok=True)


def _write_error(exc: OSError, where: Path) -> DsparkError:
    from dspark_cli.errors import os_error

    error = os_error(exc)
    return type(error)(f"cannot write the bench report to {where}: {error.message}", error.hint)


def save_partial(result: dict[str, Any], out_dir: Path) -> None:
    """bench.json with what is measured so far (`"complete": false`); a one-line error naming it if it
    cannot be written."""
    from dspark_cli.artifacts.bench import REPORT
    from dspark_cli.artifacts.files import write_json_atomic

    try:
        write_json_atomic(out_dir / REPORT, result)
    except OSError as exc:
        raise _write_error(exc, out_dir / REPORT) from None


def portable(value: str, out_dir: Path) -> str:
    """A local path as bench.json records it: relative to the report folder when the two share a folder below
    the file system's root (`../draft`, `../../other-run/bench/bench.json`), else its name alone (a bundled
    target's files, `/data/models/qwen` beside `/home/you/runs`: `qwen`), so it never spells a path from `/`;
    anything that is not a local path (a hub id, a bundled target's name, a URL) as it is."""
    path = Path(value).expanduser()
    if not value or "://" in value or not (path.is_absolute() or path.exists()):
        return value
    real, base = os.path.realpath(path), os.path.realpath(out_dir)
    common = Path(os.path.commonpath([real, base]))
    if common.parent == common:  # nothing shared below `/`
        return Path(real).name
    return os.path.relpath(real, base)


def portable_tree(value: Any, out_dir: Path) -> Any:
    """Settings (`bench`, `serve`) with every local path in them `portable`, `--flag=PATH` arguments too. A path
    is a value that starts at `/` or `~` or holds a `/` and exists here: a bare word (`block`, `mt_bench`) is a
    setting even where a file of that name lies in the current directory, and names nothing of this machine."""
    if isinstance(value, dict):
        return {key: portable_tree(item, out_dir) for key, item in value.items()}
    if isinstance(value, list):
        return [portable_tree(item, out_dir) for item in value]
    if isinstance(value, str):
        head, equals, tail = value.partition("=")
        if equals and tail.startswith(("/", "~")):
            return f"{head}={portable(tail, out_dir)}"
        return portable(value, out_dir) if value.startswith(("/", "~")) or "/" in value else value
    return value
