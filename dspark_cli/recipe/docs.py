"""Generate docs/recipe.md from the schema, so the reference cannot drift from the code.

    python -m dspark_cli.recipe.docs > docs/recipe.md

A test compares the committed file with this output.
"""

from __future__ import annotations

import json
import types
import typing
from typing import Any, get_args, get_origin

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from dspark_cli.recipe.loader import _inner_model
from dspark_cli.recipe.schema import Recipe

HEADER = """# Recipe reference

A recipe is one YAML file with a section per stage. Every field is optional: a missing field
takes the default shown here. Precedence: defaults < recipe file < `section.key=value`
overrides < command flags; list items take overrides by index (`datagen.sources[0].max_samples=100`).
`dspark validate RECIPE` checks a recipe and reports every problem at once: types and ranges,
then rules across sections (layer ids against the target's depth, `capture.max_seq_len` and
`train.max_seq_len` within `target.max_model_len`, output directories that a file stands in the
way of, a `publish.repo_id` the hubs would refuse, a local target's `config.json` and weights),
then everything each stage would refuse before doing any work (the same preflight every stage
command and `dspark run` make first): online producers and trainers sharing devices, processes per GPU,
engines and packages installed, prompt files, output directories another stage wrote. Add
`--recipe-only` to skip this machine's checks (a cluster recipe on a laptop).
Every integer must fit a signed 64-bit integer (up to 9,223,372,036,854,775,807), and a seed
(`seed`, `datagen.seed`, `train.seed`) 0 to 4,294,967,295, the range numpy, torch and vLLM all take;
`dspark validate` names a key outside its range, and the range. A key written twice in one mapping
(`train:` twice, or `lr:` twice in a section) is refused with both line numbers, in a recipe file, an
override's value and a draft's `recipe.yaml` alike: YAML would silently keep the last one.
Every stage writes the resolved recipe (`recipe.yaml`) into its output directory.

A secret inside a URL -- the password of `scheme://user:PASSWORD@host`, or a query parameter named like a
credential (`key`, `api_key`, `token`, `secret`, `password`, `sig`, `X-Amz-Signature`, anything ending in
`_key` or `_token`, ...) -- is recorded redacted wherever dspark records a recipe (`recipe.yaml`, the
manifests, a draft, the metrics sinks' run config): `https://user:***@host/v1?api_key=***`, with one
warning per key a run. The run itself uses the real value; a later run takes it from your recipe or
overrides again, and a stage refuses a recipe that would send a recorded `***` (a recipe copied from a
run's `recipe.yaml`), naming the key. Keep credentials out of recipes: hub tokens come from `HF_TOKEN` /
`MODELSCOPE_API_TOKEN`; the `datagen.endpoint` and `bench.endpoint` clients have no credential setting.

This page is generated from the schema (`python -m dspark_cli.recipe.docs > docs/recipe.md`).
"""


def _type_name(annotation: Any) -> str:
    origin = get_origin(annotation)
    if origin is typing.Literal:
        return " \\| ".join(f"`{a}`" for a in get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in get_args(annotation))
    if origin is list:
        return f"list of {_type_name(get_args(annotation)[0])}"
    if origin is dict:
        key, value = get_args(annotation)
        return f"map {_type_name(key)} → {_type_name(value)}"
    if annotation is type(None):
        return "null"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "mapping"
    return getattr(annotation, "__name__", str(annotation))


def _default(field: Any) -> str:
    if field.default is not PydanticUndefined:
        value = field.default
    elif field.default_factory is not None:
        value = field.default_factory()
    else:
        return "required"
    if isinstance(value, BaseModel):
        return "see below"
    return f"`{json.dumps(value)}`"


def _section(title: str, model: type[BaseModel], prefix: str) -> list[str]:
    lines = [
        f"## `{title}`",
        "",
        (model.__doc__ or "").strip(),
        "",
        "| key | type | default | description |",
        "|---|---|---|---|",
    ]
    nested: list[tuple[str, type[BaseModel]]] = []
    for name, field in model.model_fields.items():
        inner = _inner_model(field.annotation)
        if inner is not None and get_origin(field.annotation) is None:
            nested.append((name, inner))
            continue
        description = (field.description or "").replace("|", "\\|")
        lines.append(f"| `{prefix}{name}` | {_type_name(field.annotation)} | {_default(field)} | {description} |")
    lines.append("")
    for name, inner in nested:
        lines += _section(f"{prefix}{name}", inner, f"{prefix}{name}.")
    return lines


def recipe_reference() -> str:
    """The whole reference page as Markdown."""
    lines = [HEADER]
    top = [(n, f) for n, f in Recipe.model_fields.items() if _inner_model(f.annotation) is None]
    lines += ["## top level", "", "| key | type | default | description |", "|---|---|---|---|"]
    for name, field in top:
        lines.append(f"| `{name}` | {_type_name(field.annotation)} | {_default(field)} | {field.description} |")
    lines.append("")
    for name, field in Recipe.model_fields.items():
        inner = _inner_model(field.annotation)
        if inner is not None:
            lines += _section(name, inner, f"{name}.")
    lines += [
        "## `datagen.sources[]`",
        "",
        "Each source is a mapping with the keys of the table below.",
        "",
    ]
    from dspark_cli.recipe.schema import PromptSource

    lines += _section("datagen.sources[]", PromptSource, "")[2:]
    return "\n".join(lines).rstrip() + "\n"


if __name__ == "__main__":
    print(recipe_reference(), end="")
