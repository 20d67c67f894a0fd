"""Load a recipe: YAML file < `key=value` overrides < command flags, every problem reported at once.

    recipe = load_recipe("templates/recipes/tiny.yaml", ["train.lr=3e-4", "draft.num_layers=2"])
    write_resolved(recipe, "runs/tiny/train")      # the exact recipe a stage ran with

Errors come back as one `RecipeError` whose `problems` are lines like
`train.lrr: unknown key (did you mean 'train.lr'?)` or `draft.block_size: must be greater than 0 (got 0)`.
"""

from __future__ import annotations

import copy
import difflib
import os
import re
import secrets
import shutil
from pathlib import Path
from typing import Any, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError

from dspark_cli.errors import RecipeError, UsageError
from dspark_cli.recipe.bounded import MAX_RECIPE_BYTES, parse_yaml, read_text
from dspark_cli.recipe.schema import Recipe
from dspark_cli.recipe.secrets import recorded_tree, redact_tree

RESOLVED_NAME = "recipe.yaml"


def template_dir() -> Path:
    """Where the shipped recipe templates live: a source checkout, or the installed data files (under
    the environment's prefix, or beside the package for `pip install --target DIR`)."""
    import sys

    root = Path(__file__).resolve().parents[2]
    for candidate in (
        root / "templates",
        root / "share" / "dspark" / "templates",
        Path(sys.prefix) / "share" / "dspark" / "templates",
    ):
        if (candidate / "recipes").is_dir():
            return candidate / "recipes"
    return Path(sys.prefix) / "share" / "dspark" / "templates" / "recipes"


def template_names() -> list[str]:
    """Names of the shipped templates (`kimi-k3`, `qwen3-8b`, `llama-3.1-8b`, `tiny`)."""
    return sorted(p.stem for p in template_dir().glob("*.yaml"))


def resolve_recipe_path(recipe: str | os.PathLike[str]) -> Path:
    """A recipe file path, or the name of a shipped template (`tiny`, `kimi-k3`, ...)."""
    path = Path(recipe)
    if path.is_file():
        return path
    candidate = template_dir() / f"{path.name}.yaml"
    if path.name == str(recipe) and path.suffix not in (".yaml", ".yml") and candidate.is_file():
        return candidate  # a bare name, dots allowed (`llama-3.1-8b`)
    names = template_names()
    close = difflib.get_close_matches(path.stem, names, n=1)
    hint = f"did you mean the template '{close[0]}'?" if close else f"templates: {', '.join(names)}"
    raise UsageError(f"recipe not found: {recipe}", f"{hint}; `dspark init` copies one to edit")


_KEY_PART = re.compile(r"^([A-Za-z_][\w-]*)((?:\[\d+\])*)$")


def copy_template(template: str, output: Path, *, force: bool = False) -> None:
    """`dspark init`: copy a shipped template to `output` (a file; `force` overwrites a file, never a
    directory), through a temporary file beside it that a failure (disk full, ...) does not leave behind."""
    source = template_dir() / f"{template}.yaml"
    if not source.is_file():
        resolve_recipe_path(template)  # raises with a did-you-mean
    if output.is_dir():
        raise UsageError(f"{output} is a directory", f"pass a file path, e.g. -o {output / 'dspark.yaml'}")
    if output.exists() and not force:
        raise UsageError(f"{output} already exists", "pass --force to overwrite, or -o another path")
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(f".{output.name}.tmp")
    try:
        shutil.copyfile(source, tmp)
        tmp.replace(output)
    except BaseException:
        if tmp.exists():
            tmp.unlink()
        raise


def parse_override(item: str) -> tuple[list[str | int], Any]:
    """`train.lr=3e-4` -> (["train", "lr"], 0.0003); `datagen.sources[0].max_samples=8` ->
    (["datagen", "sources", 0, "max_samples"], 8). Values are YAML: `[2, 23]`, `true`, `null`."""
    key, sep, raw = item.partition("=")
    key = key.strip()
    parts: list[str | int] = []
    for segment in key.split(".") if sep and key else [""]:
        match = _KEY_PART.match(segment)
        if match is None:
            raise RecipeError(
                [
                    (
                        f"{item!r}: overrides look like section.key=value, e.g. train.lr=3e-4 or "
                        "datagen.sources[0].max_samples=8"
                    )
                ],
                "run `dspark validate RECIPE --print` to see the resolved recipe",
            )
        parts.append(match.group(1))
        parts += [int(index) for index in re.findall(r"\[(\d+)\]", match.group(2))]
    value = parse_yaml(raw, f"override {key}") if raw.strip() else ""
    return parts, value


def _default_at(path: list[str | int]) -> Any:
    """The schema's default value at `path` (e.g. the default `datagen.sources` list), or None."""
    node: Any = Recipe().model_dump(mode="json")
    for part in path:
        if isinstance(part, int):
            node = node[part] if isinstance(node, list) and part < len(node) else None
        else:
            node = node.get(part) if isinstance(node, dict) else None
        if node is None:
            return None
    return node


def _set_path(tree: dict[str, Any], path: list[str | int], value: Any, origin: str) -> None:
    """Set `value` at `path` in the YAML tree, creating mappings on the way; list items must exist."""
    node: Any = tree
    for i, part in enumerate(path):
        where = _dotted(tuple(path[: i + 1]))
        last = i == len(path) - 1
        if isinstance(part, int):
            if not isinstance(node, list):
                raise RecipeError([f"{_dotted(tuple(path[:i]))}: is not a list ({origin} indexes it)"])
            if part >= len(node):
                listed = _dotted(tuple(path[:i]))
                raise RecipeError(
                    [f"{where}: out of range, {listed} has {len(node)} item(s) ({origin})"],
                    f"set the whole list instead: {listed}=[...]",
                )
            if last:
                node[part] = value
                return
            child = node[part]
        else:
            if not isinstance(node, dict):
                raise RecipeError(
                    [(f"{_dotted(tuple(path[:i]))}: is a value, not a section ({origin} sets {_dotted(tuple(path))})")]
                )
            if last:
                node[part] = value
                return
            child = node.get(part)
            if child is None:
                wants_list = isinstance(path[i + 1], int)
                default = _default_at(path[: i + 1]) if wants_list else None
                if wants_list and not isinstance(default, list):
                    raise RecipeError(
                        [f"{where}: not set, so it has no item {path[i + 1]} ({origin})"],
                        f"set the whole list instead: {where}=[...]",
                    )
                child = node[part] = copy.deepcopy(default) if wants_list else {}
        if isinstance(path[i + 1], str) and not isinstance(child, dict):
            raise RecipeError([f"{where}: is a value, not a section ({origin} sets {_dotted(tuple(path))})"])
        node = child


def load_recipe(
    recipe: str | os.PathLike[str] | None,
    overrides: list[str] | None = None,
    flags: dict[str, Any] | None = None,
) -> Recipe:
    """Build the recipe: defaults < YAML file < `key=value` overrides < flags (dotted keys; None = unset)."""
    tree: dict[str, Any] = {}
    source = "defaults"
    if recipe is not None:
        path = resolve_recipe_path(recipe)
        source = str(path)
        loaded = parse_yaml(read_text(path, "recipe", MAX_RECIPE_BYTES), source)
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise RecipeError([f"{source}: a recipe is a mapping of sections, got {type(loaded).__name__}"])
        tree = loaded
    for item in overrides or []:
        path_parts, value = parse_override(item)
        _set_path(tree, path_parts, value, f"override {item!r}")
    for key, value in (flags or {}).items():
        if value is not None:
            _set_path(tree, key.split("."), value, f"flag for {key}")
    try:
        return Recipe.model_validate(tree)
    except ValidationError as exc:
        problems = [describe_error(err) for err in exc.errors()]
        raise RecipeError(problems, f"in {source}; `dspark validate` lists every problem") from None


def write_resolved(recipe: Recipe, directory: str | os.PathLike[str], *, keep_secrets: bool = False) -> Path:
    """Write the fully resolved recipe into `directory/recipe.yaml` atomically; return its path.

    What is recorded has every secret inside a URL redacted (`https://user:***@host`, recipe/secrets.py),
    each one logged once per process. `keep_secrets` is for a hand-off file that this run's own processes
    load (torchrun ranks, online producers): the real values, in a file only its owner can read."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tree = recipe.model_dump(mode="json")
    text = "# Resolved by dspark: defaults < recipe file < overrides < flags.\n" + _yaml(
        tree if keep_secrets else recorded_tree(tree)
    )
    # a record is created like any open() (the umask decides, not mkstemp's 0600): for everyone to read
    tmp = directory / f".recipe.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    with open(tmp, "x", encoding="utf-8", opener=_private if keep_secrets else None) as handle:
        handle.write(text)
    final = directory / RESOLVED_NAME
    os.replace(tmp, final)
    return final


def _private(path: str, flags: int) -> int:
    return os.open(path, flags, 0o600)


def dump_recipe(recipe: Recipe, *, keep_secrets: bool = False) -> str:
    """The recipe as YAML, sections in pipeline order; secrets inside URLs redacted unless `keep_secrets`."""
    tree = recipe.model_dump(mode="json")
    return _yaml(tree if keep_secrets else redact_tree(tree)[0])


def _yaml(tree: dict[str, Any]) -> str:
    return yaml.safe_dump(tree, sort_keys=False, default_flow_style=None)


# --- turning pydantic errors into one line each ------------------------------------------

_TYPE_WORDS = {
    "int_type": "an integer",
    "int_parsing": "an integer",
    "float_type": "a number",
    "float_parsing": "a number",
    "bool_type": "true or false",
    "string_type": "a string",
    "list_type": "a list",
    "dict_type": "a mapping",
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
}


def _dotted(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "recipe"


def _model_at(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The section class that owns the key at `loc` (walking lists and optional types)."""
    model: Any = Recipe
    for part in loc:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(part) if isinstance(model, type) else None
        if field is None:
            return None
        model = _inner_model(field.annotation)
        if model is None:
            return None
    return model


def _inner_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation) if get_origin(annotation) is not None else ():
        found = _inner_model(arg)
        if found is not None:
            return found
    return None


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def describe_error(err: dict[str, Any]) -> str:
    """One line for one pydantic error, naming the YAML path."""
    loc = tuple(err.get("loc", ()))
    kind = err.get("type", "")
    value = err.get("input")
    if kind == "extra_forbidden":
        owner = _model_at(loc[:-1])
        valid = list(owner.model_fields) if owner is not None else []
        close = difflib.get_close_matches(str(loc[-1]), valid, n=1, cutoff=0.6)
        what = "unknown section" if len(loc) == 1 else "unknown key"
        if close:
            return f"{_dotted(loc)}: {what} (did you mean '{_dotted((*loc[:-1], close[0]))}'?)"
        return f"{_dotted(loc)}: {what}; valid: {', '.join(valid)}"
    if kind in _TYPE_WORDS:
        return f"{_dotted(loc)}: expected {_TYPE_WORDS[kind]}, got {_shown(value)} ({type(value).__name__})"
    if kind == "missing":
        return f"{_dotted(loc)}: required but missing"
    message = str(err.get("msg", "invalid value"))
    message = message.replace("Input should be", "must be").replace("List should have", "must have")
    message = message.removeprefix("Value error, ")
    return f"{_dotted(loc)}: {message} (got {_shown(value)})"
