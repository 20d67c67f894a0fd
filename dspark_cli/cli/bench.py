"""`dspark bench DRAFT_DIR --offline` / `dspark bench --endpoint URL`: acceptance length and throughput."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from dspark_cli.cli.common import (
    DraftDirArg,
    FormatOpt,
    OverridesArg,
    RecipeOpt,
    check_format,
    load,
    load_beside,
    preflight_stage,
    split_positional,
)
from dspark_cli.errors import UsageError
from dspark_cli.ui import handle_errors, print_json, print_table, say


@handle_errors
def bench(
    draft_dir: DraftDirArg = None,
    overrides: OverridesArg = None,
    recipe: RecipeOpt = None,
    offline: Annotated[bool, typer.Option("--offline", help="Run dspark's reference engine (no server).")] = False,
    endpoint: Annotated[str | None, typer.Option(help="Sets bench.endpoint (an OpenAI-compatible server).")] = None,
    baseline_endpoint: Annotated[
        str | None,
        typer.Option(
            help="Sets bench.baseline_endpoint: the same target without speculation (`dspark serve --method none`)."
        ),
    ] = None,
    output_dir: Annotated[str | None, typer.Option("--output-dir", "-o", help="Sets bench.output_dir.")] = None,
    output_format: FormatOpt = "text",
) -> None:
    """Measure acceptance length (tau) offline, or throughput and tau of a running server.

    `dspark bench DRAFT_DIR --offline` runs dspark's reference engine (the draft's own description
    from the recipe it carries, your bench settings, unless `--recipe`); `dspark bench --endpoint URL` drives a server (`--baseline-endpoint URL`
    or `bench.baseline_report=FILE` adds speedups: tau, tokens/s, TTFT and speedup in one report). Writes bench.json, bench.md and plots to
    `bench.output_dir` (-o): a new or empty folder, or this draft's own earlier report there.
    """
    from dspark_cli.bench.report import terminal_tables
    from dspark_cli.bench.run import run_bench
    from dspark_cli.ui import progress_bar

    check_format(output_format)
    draft_dir, rest = split_positional(draft_dir, overrides)
    if draft_dir is not None and not Path(draft_dir).is_dir():
        raise UsageError(f"draft directory not found: {draft_dir}", "pass the directory `dspark export` wrote")
    flags = {"bench.endpoint": endpoint, "bench.baseline_endpoint": baseline_endpoint, "bench.output_dir": output_dir}
    loaded = load_beside(recipe, draft_dir, rest, flags) or load(recipe, rest, flags)
    offline = offline or (draft_dir is not None and loaded.bench.endpoint is None)
    benched = draft_dir or (loaded.stage_dir("export") if offline else "")  # "": a server alone, no draft
    preflight_stage(loaded, ["bench"], recipe, inputs={"bench": benched})
    if output_format == "json":
        summary = run_bench(loaded, draft_dir=draft_dir, offline=offline)
        print_json({**summary.to_dict(), "report_dir": str(summary.report_dir)})  # bench.json's names are in it
        return
    with progress_bar("bench", unit="turns") as update:
        result = run_bench(loaded, draft_dir=draft_dir, offline=offline, on_progress=update)
    for title, columns, rows in terminal_tables(result):
        print_table(title, columns, rows)
    for warning in result.warnings:
        say(f"warning: {warning}", style="yellow")
    files = result.files or {}
    where = f"{result.local(files['markdown'])} and {result.local(files['json'])}"
    say(f"report: {where}, {len(files['plots'])} plot(s)", style="green")
