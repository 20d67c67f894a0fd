"""`dspark validate RECIPE`: every problem of a recipe, and of this machine for it, at once, as text or JSON."""

from __future__ import annotations

from typing import Annotated

import typer

from dspark_cli.cli.common import FormatOpt, OverridesArg, RecipeArg, check_format, load
from dspark_cli.ui import handle_errors, print_json, say, stdout


@handle_errors
def validate(
    recipe: RecipeArg,
    overrides: OverridesArg = None,
    stage: Annotated[
        list[str] | None,
        typer.Option(
            "--stage",
            help="Check only this stage (repeatable), as its own command judges it: datagen, capture, train, "
            "export, bench, serve, publish. Default: the stages `dspark run` runs, as it runs them.",
            show_default=False,
        ),
    ] = None,
    recipe_only: Annotated[
        bool,
        typer.Option(
            "--recipe-only",
            help="Judge the recipe alone: skip the checks of this machine (GPUs, engines, packages, "
            "files, tokens), e.g. a cluster recipe on a laptop.",
        ),
    ] = False,
    show: Annotated[bool, typer.Option("--print", help="Print the resolved recipe.")] = False,
    output_format: FormatOpt = "text",
) -> None:
    """Check a recipe: everything a stage would refuse, before any work, all problems at once.

    Types, ranges, unknown keys and cross-stage rules, then each stage's own refusals (the same
    preflight every stage command and `dspark run` make first): process and GPU counts, engines and
    packages installed, prompt files, output directories. `--recipe-only` skips this machine's
    checks. `--format json` prints the resolved recipe, or `{"ok": false, "problems": [...], "hint": ...}`
    (exit 2) when there are problems.
    """
    from dspark_cli.errors import DsparkError, RecipeError
    from dspark_cli.preflight import RUN_STAGES, StageOptions, check_preflight
    from dspark_cli.recipe import dump_recipe

    check_format(output_format)
    try:
        loaded = load(recipe, overrides)
        # no --stage: judged as `dspark run` runs them (it replaces its own earlier draft); with --stage,
        # as that stage's own command without flags (`dspark export` refuses an earlier draft without --force)
        options = StageOptions() if stage else StageOptions(force=True)
        check_preflight(
            loaded,
            stage or RUN_STAGES,
            options,
            machine=not recipe_only,
            shared=False,  # load ran them
            source=recipe,
        )
    except DsparkError as exc:
        if output_format == "json":
            problems = exc.problems if isinstance(exc, RecipeError) else [exc.message]
            print_json({"ok": False, "recipe": recipe, "problems": problems, "hint": exc.hint})
        raise
    if output_format == "json":
        from dspark_cli.recipe.secrets import redact_tree

        print_json(redact_tree(loaded.model_dump(mode="json"))[0])  # as every recorded recipe: no URL secret
        return
    if show:
        stdout.print(dump_recipe(loaded), markup=False)
    say(f"{recipe}: ok" + (" (recipe only; this machine not checked)" if recipe_only else ""), style="green")
