"""A recorded `***` is never sent: the rule for a recipe copied from a run's recipe.yaml.

    no_recorded_secret(recipe, context)   # ["datagen.endpoint: https://user:***@host/v1 holds the `***` ..."]

dspark records every secret inside a URL redacted (`dspark_cli/recipe/secrets.py`), so a recipe taken from
a run's `recipe.yaml` holds `https://user:***@host` where the user's had a password. A stage that would
send or open such a value is refused before any work, naming the key; one that never reads it (export,
or datagen's `capture.stream`) is not.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dspark_cli.recipe.secrets import REDACTED, holds_redacted

if TYPE_CHECKING:
    from dspark_cli.preflight import Context
    from dspark_cli.recipe.schema import Recipe

# the sections whose URLs each stage contacts or opens
STAGE_READS = {
    "datagen": ("target", "datagen"),
    "capture": ("target", "capture"),
    "train": ("capture",),
    "bench": ("target", "bench"),
    "serve": ("target",),
    "publish": ("publish",),
}


def no_recorded_secret(recipe: Recipe, context: Context) -> list[str]:
    """One line per field the stages read that holds the `***` a recorded recipe keeps in place of a secret."""
    dumped = recipe.model_dump(mode="json")
    sections = dict.fromkeys(section for stage in context.stages for section in STAGE_READS.get(stage, ()))
    leaves: list[tuple[str, str]] = []
    for section in sections:
        _strings(dumped.get(section), section, leaves)
    return [
        f"{key}: {value} holds the `{REDACTED}` a recorded recipe keeps in place of a secret; "
        f"set the real value again ({key}=...), or leave the key out"
        for key, value in leaves
        if holds_redacted(value)
    ]


def _strings(tree: Any, prefix: str, out: list[tuple[str, str]]) -> None:
    """(dotted key, value) of every string under `tree` (`datagen.sources[0].path`)."""
    if isinstance(tree, str):
        out.append((prefix, tree))
    elif isinstance(tree, dict):
        for key, value in tree.items():
            _strings(value, f"{prefix}.{key}", out)
    elif isinstance(tree, list):
        for index, value in enumerate(tree):
            _strings(value, f"{prefix}[{index}]", out)
