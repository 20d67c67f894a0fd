"""`run_bench`: offline and/or online benchmarks of one draft (or offline, several), then the report. The CLI calls this.

    from dspark_cli.bench.run import run_bench
    result = run_bench(recipe, draft_dir="runs/tiny/draft", offline=True)     # a dspark export or a published draft
    result = run_bench(recipe, drafts=["runs/a/draft", "dl/theirs"], offline=True)   # result.drafts: one entry each
    result = run_bench(recipe, endpoint="http://127.0.0.1:8000")     # bench.baseline_endpoint for speedups
    result.files         # names of bench.json, bench.md and the plots in result.report_dir; result: a BenchSummary

Without `--recipe`, `dspark bench DRAFT_DIR` benchmarks with the recipe the draft was made with
(`recipe.yaml` in the draft dir, else the `recipe` recorded in its dspark_manifest.json), except for
the fields that grant trust (`dspark_cli/recipe/trust.py`); a published draft carries none. Everything
checkable is checked before any work: every draft, for the recipe's target (`offline.check_draft`), the report folder (`bench.output_dir`: bench writes only a new or empty folder or its own
earlier report of the same draft, `artifacts.bench_output.output_problem`; it marks the folder as its own and
holds its lock while it writes; bench.json is written there at once, marked `"complete": false`, so a
full disk stops the run before the benchmark, naming where) and `bench.baseline_report`. Results
are written as they come (after the offline runs, after every online level), and bench.json before
the plots (which can fail late): a run that fails half-way keeps what it measured. bench.json names no
path of this machine: local paths are relative to the report folder (`../draft`) or names (`portable`).
"""

from __future__ import annotations

import contextlib
import dataclasses
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
    drafts: list[str | Path] | None = None,
    names: dict[str, str] | None = None,
    offline: bool = False,
    endpoint: str | None = None,
    on_progress: Progress | None = None,
) -> BenchSummary:
    """Run what was asked (offline engine on `draft_dir`, online against `endpoint`); write the report.

    `drafts` (instead of `draft_dir`): several drafts, offline, in one report (`BenchSummary.drafts`);
    `names`: the name a draft directory is recorded by when it is not its path (a hub id, `draft_source`)."""
    endpoint = endpoint or recipe.bench.endpoint
    listed = [Path(d) for d in drafts] if drafts else [Path(draft_dir)] if draft_dir is not None else []
    if len(listed) > 1 and (endpoint or not offline):
        raise UsageError(
            "several drafts are compared offline only",
            "drop --endpoint to compare them offline, or bench the server with the one draft it serves",
        )
    if not offline and not endpoint:
        raise UsageError("nothing to benchmark", "pass DRAFT_DIR --offline, or --endpoint URL of a running server")
    if offline and not listed:
        listed = [Path(recipe.stage_dir("export"))]
    from dspark_cli.artifacts.bench_output import FIELD, output_problem

    out_dir = Path(recipe.stage_dir("bench")).expanduser()
    owned_by: Path | list[Path] | None = listed if len(listed) > 1 else listed[0] if listed else None
    problem = output_problem(out_dir, owned_by)
    if problem is not None:
        raise UsageError(problem.removeprefix(f"{FIELD}: "), OUTPUT_HINT)
    baseline = None
    if endpoint and recipe.bench.baseline_report and not recipe.bench.baseline_endpoint:
        from dspark_cli.bench.endpoint import load_baseline_report

        baseline = load_baseline_report(recipe.bench.baseline_report)  # a bad path is refused before the run
        baseline["source"] = portable(baseline["source"], out_dir)
    from dspark_cli.bench.offline import check_draft

    if offline:  # a bad cost model is refused before anything else
        from dspark_cli.bench.adaptive import load_cost_model

        load_cost_model(recipe.bench.cost_model)
    # every draft, for this target, before the report folder is touched (nothing is written for a refused one)
    manifests = [check_draft(d, recipe.target.model) for d in listed]
    from dspark_cli.artifacts.bench_output import owner_mark
    from dspark_cli.artifacts.files import OWNER_NAME, ensure_writable_dir, exclusive_output, write_json_atomic

    fresh = not out_dir.is_dir() or not any(out_dir.iterdir())
    ensure_writable_dir(out_dir, "the bench report")  # before the work, not after
    benched = [_Benched(d, m, (names or {}).get(str(d))) for d, m in zip(listed, manifests, strict=True)]
    with contextlib.ExitStack() as held:
        try:
            try:  # the lock while this process writes, and the folder marked as bench's before anything else
                held.enter_context(exclusive_output(out_dir, FIELD))
                write_json_atomic(out_dir / OWNER_NAME, owner_mark(out_dir, owned_by))
            except OSError as exc:
                raise _write_error(exc, out_dir) from None
            return _bench(recipe, out_dir, benched, offline, endpoint, baseline, on_progress)
        except BaseException:
            if fresh:  # refused before it wrote a report: the folder as it was
                _unclaim(out_dir)
            raise


OUTPUT_HINT = "bench replaces only its own report of the same draft(s): give each its own bench.output_dir (-o)"


@dataclasses.dataclass(frozen=True)
class _Benched:
    """A draft to bench: its directory, the manifest its checks gave, the name it goes by when not a path."""

    directory: Path
    manifest: dict[str, Any]
    name: str | None = None

    def identity(self) -> dict[str, Any]:
        """Which draft this is, wherever it lies: a dspark export by the sha256 of its dspark_manifest.json
        (what publish matches), a published draft by its weights'."""
        from dspark_cli.artifacts.files import sha256_file

        if self.manifest.get("published"):
            return {"draft_published": True, "draft_weights_sha256": self.manifest["files"]["model.safetensors"]}
        return {"draft_sha256": sha256_file(self.directory / "dspark_manifest.json")}

    def recorded(self, out_dir: Path) -> str:
        return self.name or portable(str(self.directory), out_dir)


def draft_labels(benched: list[_Benched]) -> list[str]:
    """A short distinct name per draft for the report: its hub id, else its folder's name (with the folders
    above it where two share one: `a/draft`, `b/draft`)."""
    parts = [list(Path(b.name).parts) if b.name else list(b.directory.resolve().parts) for b in benched]
    depth = 1
    while True:
        labels = ["/".join(p[-depth:]) for p in parts]
        if len(set(labels)) == len(labels) or depth >= max(len(p) for p in parts):
            break
        depth += 1
    return labels if len(set(labels)) == len(labels) else [f"{label} #{i + 1}" for i, label in enumerate(labels)]


def _bench(
    recipe: Recipe,
    out_dir: Path,
    benched: list[_Benched],
    offline: bool,
    endpoint: str | None,
    baseline: dict[str, Any] | None,
    on_progress: Progress | None,
) -> BenchSummary:
    """The benchmark and its report, in `out_dir`: bench's own folder, which this process holds."""
    from dspark_cli.artifacts.bench import KIND, REPORT

    single = benched[0] if len(benched) == 1 else None
    target = portable(recipe.target.model, out_dir)
    result: dict[str, Any] = {
        "kind": KIND,
        "format_version": 1,
        "dspark": __version__,
        "name": recipe.name,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "target": target,
        "draft_dir": single.recorded(out_dir) if single else None,
        **(single.identity() if single else {}),
        "bench": portable_tree(recipe.bench.model_dump(mode="json"), out_dir),
        "serve": portable_tree(recipe.serve.model_dump(mode="json"), out_dir),
        "warnings": [],
        "complete": False,
    }
    report = out_dir / REPORT
    earlier = report.read_bytes() if report.is_file() and not report.is_symlink() else None
    save_partial(result, out_dir)  # a disk that cannot hold the report fails here, not after the benchmark
    try:
        if len(benched) > 1:
            _measure_many(result, recipe, out_dir, benched, on_progress)
        else:
            _measure(result, recipe, out_dir, single, offline, endpoint, baseline, on_progress)
    except BaseException:
        if not {"offline", "online", "drafts"} & set(result):  # refused before measuring: as it was before
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
        write_report(summary, out_dir, profile=_profile(summary, benched, recipe.target.model))
    except OSError as exc:
        raise _write_error(exc, out_dir / REPORT) from None
    return summary


def _measure(
    result: dict[str, Any],
    recipe: Recipe,
    out_dir: Path,
    draft: _Benched | None,
    offline: bool,
    endpoint: str | None,
    baseline: dict[str, Any] | None,
    on_progress: Progress | None,
) -> None:
    """The offline and online runs asked for, each saved into bench.json as soon as it is measured."""
    if offline and draft is not None:
        from dspark_cli.bench.offline import run_offline

        result["offline"] = run_offline(recipe, draft.directory, manifest=draft.manifest, on_progress=on_progress)
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


def _measure_many(
    result: dict[str, Any], recipe: Recipe, out_dir: Path, benched: list[_Benched], on_progress: Progress | None
) -> None:
    """Several drafts offline on the same prompts, seeds and settings: one entry each in `drafts`."""
    from dspark_cli.bench.offline import run_offline_many

    measured = run_offline_many(
        recipe, [b.directory for b in benched], manifests=[b.manifest for b in benched], on_progress=on_progress
    )
    entries = []
    for draft, label, offline in zip(benched, draft_labels(benched), measured, strict=True):
        recorded = draft.recorded(out_dir)
        offline["engine"].update(target=result["target"], draft_dir=recorded)
        result["warnings"] += [f"{label}: {w}" for w in offline["engine"]["warnings"]]
        entries.append(
            {
                "name": label,
                "draft_dir": recorded,
                "published": bool(draft.manifest.get("published")),
                **{k: v for k, v in draft.identity().items() if k != "draft_published"},
                "offline": offline,
            }
        )
    result["drafts"] = entries
    save_partial(result, out_dir)


def _profile(summary: BenchSummary, benched: list[_Benched], target: str) -> dict[str, Any] | None:
    """speculation_profile.json of the offline results (bench/profile.py): the one draft's, or one per draft
    of a several-draft bench (`drafts`, as bench.json's); None without offline results."""
    from dspark_cli.artifacts.profile import FORMAT, VERSION, draft_fingerprint
    from dspark_cli.bench.profile import build_profile

    if summary.drafts is not None:
        docs = [
            {
                **build_profile(
                    entry.offline, draft_fingerprint(b.manifest, b.directory, target), created=summary.created
                ),
                "name": entry.name,
            }
            for entry, b in zip(summary.drafts, benched, strict=True)
        ]
        return {"format": FORMAT, "version": VERSION, "drafts": docs}
    if summary.offline is None or not benched:
        return None
    return build_profile(
        summary.offline, draft_fingerprint(benched[0].manifest, benched[0].directory, target), created=summary.created
    )


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
