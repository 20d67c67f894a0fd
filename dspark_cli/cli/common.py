"""What every command shares: the argument and option types, loading a recipe, `--format`.

Import-light like the rest of the package: `dspark --help` and shell completion load this module,
so torch, transformers and vllm are imported only inside the functions that need them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from dspark_cli.errors import UsageError

RecipeArg = Annotated[str, typer.Argument(help="Recipe YAML file, or a template name (`tiny`, `kimi-k3`, ...).")]
OverridesArg = Annotated[
    list[str] | None,
    typer.Argument(
        help="Overrides `section.key=value`, e.g. `train.lr=3e-4 draft.num_layers=2` "
        "(list items by index: `datagen.sources[0].max_samples=8`).",
        show_default=False,
    ),
]
RecipeOpt = Annotated[str | None, typer.Option("--recipe", "-r", help="Recipe file or template name.")]
DryRunOpt = Annotated[bool, typer.Option("--dry-run", help="Show the plan; write nothing.")]
FormatOpt = Annotated[str, typer.Option("--format", help="Output: `text` (tables) or `json` (machines).")]
DraftDirArg = Annotated[str | None, typer.Argument(help="Exported draft directory.", show_default=False)]


def split_positional(first: str | None, overrides: list[str] | None) -> tuple[str | None, list[str]]:
    """For commands whose first positional is optional: `key=value` there is an override, not a path."""
    rest = list(overrides or [])
    if first is not None and "=" in first and not Path(first).exists():
        return None, [first, *rest]
    return first, rest


def load(recipe: str | None, overrides: list[str] | None, flags: dict[str, Any] | None = None):
    """Load a recipe (types, ranges, unknown keys) and run the rules every stage shares (`preflight/shared.py`),
    once; every problem at once, exit 2. A stage's own rules follow in `preflight_stage`."""
    from dspark_cli.errors import RecipeError
    from dspark_cli.preflight.shared import shared_problems
    from dspark_cli.recipe import load_recipe

    loaded = load_recipe(recipe, overrides or [], flags)
    problems = shared_problems(loaded)
    if problems:
        raise RecipeError(problems, f"fix {recipe or 'the overrides'} and run `dspark validate` again")
    return loaded


def preflight_stage(
    loaded, stages: list[str] | tuple[str, ...], recipe: str | None = None, *, machine: bool = True, **options: Any
) -> None:
    """The preflight of a stage command, before any work: every refusal of `stages` at once, exit 2.

    `options` are the command's flags that change what it refuses (`preflight.StageOptions`); `machine=False`
    judges the recipe alone (dry runs, which need no engine). The shared rules ran in `load`, so they are
    not run again.
    """
    from dspark_cli.preflight import StageOptions, check_preflight

    check_preflight(loaded, stages, StageOptions(**options), machine=machine, shared=False, source=recipe)


def load_beside(
    recipe: str | None,
    directory: str | None,
    overrides: list[str],
    flags: dict[str, Any] | None = None,
    *,
    whole: bool = False,
):
    """The user's `recipe`, else the one draft `directory` carries, minus its trust (recipe/trust.py; `whole`:
    a training run's recipe for export, all but its output directories); None if neither."""
    from dspark_cli.artifacts.draft import recipe_of_dir
    from dspark_cli.recipe.trust import load_beside as load_trusted

    return load_trusted(
        recipe, directory, overrides, lambda path: load(path, overrides, flags), recipe_of_dir, whole=whole
    )


def check_format(output_format: str) -> None:
    if output_format not in ("text", "json"):
        raise UsageError(f"--format must be text or json, got {output_format!r}")


def tensor_rows(tensors: list[dict[str, Any]]) -> list[list[str]]:
    """Table rows (name, `AxB` shape, dtype) for a tensor roster."""
    return [[t["name"], "x".join(map(str, t["shape"])), t["dtype"]] for t in tensors]


def draft_location(source: str) -> str:
    """A draft named on the command line, as a local directory: `source` itself when that path exists or it is
    not a hub id; else (`org/name` and no such local path) the published draft downloaded from the hub
    (`publish.draft_source`), or its one-line error."""
    from dspark_cli.publish import HUB_ID, draft_source

    if Path(source).expanduser().exists() or Path(source).is_symlink() or not HUB_ID.match(source):
        return source
    return str(draft_source(source))
