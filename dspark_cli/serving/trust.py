"""Trust is the user's decision, not a file's: what a recipe found in a draft directory may not decide.

`dspark bench DRAFT`, `dspark serve DRAFT` and `dspark publish DRAFT` use the recipe the draft was
exported with (its `recipe.yaml`, else the recipe recorded in `dspark_manifest.json`) when no
`--recipe` is given. Such a recipe may come from someone else, so the fields that run code, hand
vLLM extra arguments or send the user's hub tokens somewhere are refused when they are set there:

    target.trust_remote_code      runs the target's own Python code (bench imports it, vLLM too)
    serve.extra_args              verbatim `vllm serve` arguments (`--trust-remote-code`, plugins, ...)
    publish.hf_endpoint,          where publish sends the Hugging Face / ModelScope token
    publish.modelscope_endpoint

The user keeps them by saying so: an override on the command line (`target.trust_remote_code=true`)
or their own `--recipe`. The environment a draft's manifest asks for is checked in
`dspark_cli.export.integrity` (only the names export itself writes).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Callable

from dspark_cli.artifacts.draft import DRAFT_MANIFEST, read_draft_manifest
from dspark_cli.errors import UsageError

TRUST_FIELDS: dict[str, Any] = {"target.trust_remote_code": False, "serve.extra_args": [],
                                "publish.hf_endpoint": None, "publish.modelscope_endpoint": None}


def recipe_of_dir(directory: str | Path) -> str | None:
    """The recipe file a draft dir carries: its recipe.yaml, else its manifest's recipe written to a temp file;
    None when it has neither. A manifest that is there but broken is its reader's one-line error."""
    import yaml

    directory = Path(directory)
    if (directory / "recipe.yaml").is_file():
        return str(directory / "recipe.yaml")
    if not (directory / DRAFT_MANIFEST).is_file():
        return None
    recipe = read_draft_manifest(directory).get("recipe")
    if not isinstance(recipe, dict) or not recipe:
        return None
    handle = tempfile.NamedTemporaryFile("w", prefix="dspark-draft-recipe-", suffix=".yaml", delete=False)  # noqa: SIM115
    with handle:
        yaml.safe_dump(recipe, handle, sort_keys=False)
    return handle.name


def _value(recipe: Any, dotted: str) -> Any:
    section, key = dotted.split(".")
    return getattr(getattr(recipe, section), key)


def refuse_borrowed_trust(recipe: Any, source: str, overrides: list[str]) -> None:
    """One-line UsageError if `recipe` (loaded from `source`, a file in a draft directory) sets a trust
    field that the user's own `overrides` (`key=value`) do not set."""
    mine = {item.split("=", 1)[0].strip() for item in overrides if "=" in item}
    borrowed = [f"{name}: {_value(recipe, name)!r}" for name, default in TRUST_FIELDS.items()
                if name not in mine and _value(recipe, name) != default]
    if borrowed:
        first = borrowed[0].split(":")[0]
        raise UsageError(f"{source} sets {', '.join(borrowed)}: dspark takes these only from your own recipe or "
                         "overrides, never from a draft directory",
                         f"pass --recipe YOUR_RECIPE, or repeat it yourself ({first}=...) if you trust this draft")


def load_beside(recipe: str | None, directory: str | None, overrides: list[str], load: Callable[[str], Any]) -> Any:
    """`load(recipe)` when the user gave one; else `load` of the recipe `directory` carries, refused when it
    sets a trust field the user's `overrides` do not; None when there is neither."""
    if recipe is not None or directory is None:
        return load(recipe) if recipe is not None else None
    found = recipe_of_dir(directory)
    if found is None:
        return None
    loaded = load(found)
    refuse_borrowed_trust(loaded, found, overrides)
    return loaded
