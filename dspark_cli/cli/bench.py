"""`dspark bench DRAFT_DIR --offline` / `dspark bench --endpoint URL`: acceptance length and throughput."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from dspark_cli.cli.common import (
    FormatOpt,
    OverridesArg,
    RecipeOpt,
    check_format,
    draft_location,
    load,
    load_beside,
    preflight_stage,
)
from dspark_cli.errors import UsageError
from dspark_cli.ui import handle_errors, print_json, print_table, say

DraftsArg = Annotated[
    str | None,
    typer.Argument(
        help="Draft: a directory (`dspark export`'s, or a published one: config.json + model.safetensors) or a "
        "hub id (org/name). Several drafts, before any key=value, are compared in one report.",
        show_default=False,
    ),
]


def split_drafts(first: str | None, overrides: list[str] | None) -> tuple[list[str], list[str]]:
    """The leading positionals that are drafts (no `=`, or an existing path), then the `key=value` overrides."""
    items = [*([first] if first is not None else []), *(overrides or [])]
    drafts: list[str] = []
    for item in items:
        if "=" in item and not Path(item).exists():
            break
        drafts.append(item)
    return drafts, items[len(drafts) :]


@handle_errors
def bench(
    draft_dir: DraftsArg = None,
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

    A published draft (a directory without dspark_manifest.json, or a hub id `org/name`) carries no recipe:
    name its target with `--recipe R` or `target.model=...` (else the recipe defaults apply; a draft that does
    not fit the target is refused in one line), and -o for the report (default `runs/dspark-run/bench`).
    `dspark bench A B ... --offline` compares drafts in one report: the same prompts, seeds and settings
    (your --recipe, else the first dspark draft's, else the defaults), every draft for that target.
    """
    from dspark_cli.bench.report import terminal_tables
    from dspark_cli.bench.run import run_bench
    from dspark_cli.ui import progress_bar

    check_format(output_format)
    sources, rest = split_drafts(draft_dir, overrides)
    drafts, names = resolve_drafts(sources)
    flags = {"bench.endpoint": endpoint, "bench.baseline_endpoint": baseline_endpoint, "bench.output_dir": output_dir}
    carrier = next((d for d in drafts if not is_published(d)), None)  # a published draft's own recipe is not read
    loaded = load_beside(recipe, carrier, rest, flags) or load(recipe, rest, flags)
    offline = offline or (bool(drafts) and loaded.bench.endpoint is None)
    # the report folder's owner and the thresholds' rule judge one draft here; several, in run_bench
    benched = (drafts[0] if len(drafts) == 1 else "") if drafts else (loaded.stage_dir("export") if offline else "")
    preflight_stage(loaded, ["bench"], recipe, inputs={"bench": benched})  # "": a server alone, no draft
    one = drafts[0] if len(drafts) == 1 else None
    several: list[str | Path] | None = list(drafts) if len(drafts) > 1 else None
    if output_format == "json":
        summary = run_bench(loaded, draft_dir=one, drafts=several, names=names, offline=offline)
        print_json({**summary.to_dict(), "report_dir": str(summary.report_dir)})  # bench.json's names are in it
        return
    with progress_bar("bench", unit="turns") as update:
        result = run_bench(loaded, draft_dir=one, drafts=several, names=names, offline=offline, on_progress=update)
    for title, columns, rows in terminal_tables(result):
        print_table(title, columns, rows)
    for warning in result.warnings:
        say(f"warning: {warning}", style="yellow")
    files = result.files or {}
    where = f"{result.local(files['markdown'])} and {result.local(files['json'])}"
    say(f"report: {where}, {len(files['plots'])} plot(s)", style="green")


def is_published(directory: str) -> bool:
    from dspark_cli.export import is_published as published

    return published(directory)


def resolve_drafts(sources: list[str]) -> tuple[list[str], dict[str, str]]:
    """Each draft as a local directory (`draft_location`: a hub id becomes its download), and the hub ids by
    the directory they resolved to (the report names a hub draft by its id)."""
    drafts, names = [], {}
    for source in sources:
        path = draft_location(source)
        if not Path(path).expanduser().is_dir():
            raise UsageError(f"draft directory not found: {source}", "pass a draft directory or a hub id (org/name)")
        if path != source:
            names[path] = source
        drafts.append(path)
    if len(set(map(os.path.realpath, drafts))) < len(drafts):
        raise UsageError("the same draft is given twice", "name each draft once")
    return drafts, names
