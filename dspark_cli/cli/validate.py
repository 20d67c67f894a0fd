"""`dspark validate RECIPE`: every problem of a recipe at once, as text or JSON."""

from __future__ import annotations

from typing import Annotated

import typer

from dspark_cli.cli.common import FormatOpt, OverridesArg, RecipeArg, check_format, load
from dspark_cli.ui import handle_errors, print_json, say, stdout


@handle_errors
def validate(
    recipe: RecipeArg,
    overrides: OverridesArg = None,
    show: Annotated[bool, typer.Option("--print", help="Print the resolved recipe.")] = False,
    output_format: FormatOpt = "text",
) -> None:
    """Check a recipe: types, ranges, unknown keys and cross-stage rules, all problems at once.

    `--format json` prints the resolved recipe, or `{"ok": false, "problems": [...], "hint": ...}`
    (exit 2) when there are problems.
    """
    from dspark_cli.errors import DsparkError, RecipeError
    from dspark_cli.recipe import dump_recipe

    check_format(output_format)
    try:
        loaded = load(recipe, overrides)
    except DsparkError as exc:
        if output_format == "json":
            problems = exc.problems if isinstance(exc, RecipeError) else [exc.message]
            print_json({"ok": False, "recipe": recipe, "problems": problems, "hint": exc.hint})
        raise
    if output_format == "json":
        print_json(loaded.model_dump(mode="json"))
        return
    if show:
        stdout.print(dump_recipe(loaded), markup=False)
    say(f"{recipe}: ok", style="green")
