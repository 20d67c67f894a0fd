"""`dspark run RECIPE`: every stage in order (datagen, capture, train, export, bench, and publish);
`--rehearse`: the same recipe at tiny scale on this machine (rehearsal.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from dspark_cli.cli.common import OverridesArg, RecipeArg, load, preflight_stage
from dspark_cli.ui import handle_errors, print_table, say

if TYPE_CHECKING:
    from dspark_cli.artifacts.results import Record


@handle_errors
def run(
    recipe: RecipeArg,
    overrides: OverridesArg = None,
    publish: Annotated[
        bool,
        typer.Option("--publish", help="Also publish at the end (repo and tokens are checked before the first stage)."),
    ] = False,
    rehearse: Annotated[
        bool,
        typer.Option(
            "--rehearse",
            help="The same recipe at tiny scale on this machine (sizes and hardware only; a table "
            "shows what changed), under OUTPUT_DIR-rehearsal; serve as a dry run, no publish.",
        ),
    ] = False,
) -> None:
    """Run the whole pipeline from one recipe: datagen, capture, train, export, bench (and publish)."""
    from dspark_cli.pipeline import STAGES, run_pipeline

    loaded = load(recipe, overrides)
    if rehearse:
        loaded = _rehearsal(loaded)
        publish = False
    preflight_stage(
        loaded, ["datagen", "capture", "train", "export", "bench"] + ["publish"] * publish, recipe, force=True
    )
    if publish:  # a destination and tokens now, not after hours of training
        from dspark_cli.publish import preflight

        preflight(loaded)
    from dspark_cli.datagen.run import engine_label

    say(f"dspark run: {loaded.name} on target {loaded.target.model}; datagen engine: {engine_label(loaded)}")
    wanted = [s.name for s in STAGES if s.name != "publish" or publish]
    from dspark_cli.ui import progress_bar

    results = run_pipeline(
        loaded,
        stages=wanted,
        on_stage=lambda r: say(f"  {r.name}: {r.status} {r.detail}".rstrip()),
        progress=lambda stage, unit: progress_bar(f"  {stage}", unit=unit),
        log_line=lambda line: say(f"  train: {line}"),
    )
    rows = [[r.name, r.status, r.detail] for r in results]
    if rehearse:
        rows += _serve_dry_run(loaded, results)
    print_table("stages", ["stage", "status", "detail"], rows)
    _say_results({r.name: r.outputs for r in results if r.status == "done"})


def _rehearsal(loaded):
    """The rehearsal of `loaded` (rehearsal.py), its substitution table printed, and the shared rules
    run on it (a recipe of its own: `preflight_stage` runs the stages' rules on it next)."""
    from dspark_cli.errors import RecipeError
    from dspark_cli.preflight.shared import shared_problems
    from dspark_cli.rehearsal import rehearsal_recipe

    rehearsal, changes = rehearsal_recipe(loaded)
    print_table(
        f"rehearsal of {loaded.name}: what changed (sizes and hardware only)",
        ["field", "recipe", "rehearsal", "why"],
        [[c.field, c.real, c.rehearsal, c.why] for c in changes],
    )
    problems = shared_problems(rehearsal)
    if problems:
        raise RecipeError(problems, "the rehearsal of this recipe is refused: fix the recipe, not the rehearsal")
    return rehearsal


def _serve_dry_run(loaded, results) -> list[list[str]]:
    """The serve stage of a rehearsal: the `vllm serve` command the recipe's settings give, not run."""
    from dspark_cli.serving import serve_plan, shell_line

    if not any(r.name == "export" and r.status == "done" for r in results):
        return [["serve", "skipped", "needs export"]]
    argv, env = serve_plan(loaded, loaded.stage_dir("export"))
    say(f"serve (dry run): {shell_line(argv, env)}")
    return [["serve", "dry run", "the vllm serve command (printed above)"]]


def _say_results(outputs: dict[str, Record | None]) -> None:
    """The few numbers a finished run is for: where the draft is and its acceptance length."""
    from dspark_cli.artifacts.results import BenchSummary, ExportSummary

    export, bench = outputs.get("export"), outputs.get("bench")
    if isinstance(export, ExportSummary):
        say(f"draft: {export.output_dir} ({export.architecture})")
    if not isinstance(bench, BenchSummary):
        return
    for line in bench.tau_lines():
        ci = (
            f" [{line.ci95[0]:.2f}, {line.ci95[1]:.2f}]" if line.ci95 and None not in line.ci95 else ""
        )  # one prompt: none
        say(
            f"tau on {line.dataset} at T={line.temperature:g}: {line.tau:.2f}{ci} tokens per verification step",
            style="green",
        )
        extra = [f"{name} {tau:.2f}" for name, tau in line.baselines.items()]
        if line.calibration is not None and line.ece is not None:
            extra.append(f"confidence head {line.calibration} (ECE {line.ece:.3f})")
        if extra:
            say(f"  baselines and head: {', '.join(extra)}")
    if bench.files:
        say(f"report: {bench.local(bench.files['markdown'])}")
