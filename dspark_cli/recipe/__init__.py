"""The dspark recipe: typed schema (`schema.py`), loading and overrides (`loader.py`), secrets inside URLs
redacted wherever a recipe is recorded (`secrets.py`).

Types, ranges and unknown keys are checked while loading; every rule across fields, against the target
or the machine is `dspark_cli.preflight`'s."""

from dspark_cli.recipe.loader import (
    RESOLVED_NAME,
    dump_recipe,
    load_recipe,
    resolve_recipe_path,
    template_dir,
    template_names,
    write_resolved,
)
from dspark_cli.recipe.schema import SECTIONS, Recipe
from dspark_cli.recipe.secrets import recorded_tree

__all__ = [
    "RESOLVED_NAME",
    "SECTIONS",
    "Recipe",
    "dump_recipe",
    "load_recipe",
    "recorded_tree",
    "resolve_recipe_path",
    "template_dir",
    "template_names",
    "write_resolved",
]
