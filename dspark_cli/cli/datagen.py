"""`dspark datagen RECIPE`: regenerate the training responses with the target (or show the plan)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from dspark_cli.cli.common import DryRunOpt, OverridesArg, RecipeArg, load, preflight_stage
from dspark_cli.ui import handle_errors, print_table, say

if TYPE_CHECKING:
    from dspark_cli.artifacts.results import DatagenSummary


@handle_errors
def datagen(
    recipe: RecipeArg,
    overrides: OverridesArg = None,
    output_dir: Annotated[str | None, typer.Option("--output-dir", "-o", help="Sets datagen.output_dir.")] = None,
    engine: Annotated[
        str | None, typer.Option(help="Sets datagen.engine: `vllm`, `hf` or `auto` (vllm where installed).")
    ] = None,
    dry_run: DryRunOpt = False,
) -> None:
    """Regenerate responses with the target itself (on-policy training data), resumably."""
    from dspark_cli.datagen.run import run_datagen
    from dspark_cli.ui import progress_bar

    loaded = load(recipe, overrides, {"datagen.output_dir": output_dir, "datagen.engine": engine})
    preflight_stage(loaded, ["datagen"], recipe, machine=not dry_run)
    if dry_run:
        _render_plan(run_datagen(loaded, dry_run=True))
        return
    with progress_bar("datagen", unit="conversations") as update:
        summary = run_datagen(loaded, on_progress=lambda done, total, tokens: update(done, total, tokens=tokens))
    say(
        f"datagen: {summary.conversations} conversations{_held_out(summary)}, {summary.generated_tokens} tokens generated "
        f"({summary.tokens_per_second} tokens/s, {summary.engine}) -> {summary.output_dir}",
        style="green",
    )


def _render_plan(plan: DatagenSummary) -> None:
    counts = plan.counts
    rows = [[source, counts.read.get(source, 0), kept] for source, kept in counts.kept.items()]
    print_table("datagen plan (nothing written)", ["source", "read", "kept"], rows)
    for reason, dropped in counts.dropped.items():
        say(f"dropped ({reason}): {sum(dropped.values())}")
    say(
        f"{plan.conversations} conversations{_held_out(plan)}, {plan.turns} assistant turns to generate, "
        f"{plan.shards} shards ({plan.already_done} already done) -> {plan.output_dir}"
    )
    say(f"engine: {plan.engine}")


def _held_out(summary: DatagenSummary) -> str:
    """` (N held out for validation)` when datagen holds a split out (datagen.validation_fraction)."""
    return f" ({summary.validation} held out for validation)" if summary.validation else ""
