"""What a recipe found in a draft directory may decide: the draft's own description, nothing more.

`dspark bench DRAFT`, `dspark serve DRAFT` and `dspark publish DRAFT` use the recipe the draft was
exported with (its `recipe.yaml`, else the recipe recorded in `dspark_manifest.json`: the caller's
`find_recipe`, `artifacts.draft.recipe_of_dir`) when no `--recipe` is given. Such a recipe may come from someone else, so it is *carried*, not trusted: it
supplies only the fields in `CARRIED` -- the target contract (`target.*`), the draft's geometry
(`draft.*`), the tokenizer / chat settings and serving options export recorded, the K3 AttnRes
flag, the draft's license. Everything else -- where outputs go, which servers are contacted,
hub visibility and repo ids, hosts and ports, bench settings -- comes from the user: defaults, their
`key=value` overrides and flags, or their own `--recipe`. Outputs of a stage run on a draft without
`--recipe` go beside the draft (`output_dir` = the draft directory's parent: `runs/NAME/draft` ->
`runs/NAME/bench`).

`dspark export CHECKPOINT` reads the recipe its training run wrote (`runs/NAME/train/recipe.yaml`) by
the same rule with one difference: the whole recipe is kept (the exported draft records how it was
trained), except where outputs go -- `output_dir` is beside the checkpoint and no section's
`output_dir` is read (`runs/NAME/train` -> `runs/NAME/draft`) -- and the trust fields below.

Fields that run code, hand vLLM extra arguments or send the user's hub tokens somewhere are refused
outright when the carried recipe sets them (so the user sees that the draft asks for them):

    target.trust_remote_code      runs the target's own Python code (bench imports it, vLLM too)
    serve.extra_args              verbatim `vllm serve` arguments (`--trust-remote-code`, plugins, ...)
    publish.hf_endpoint,          where publish sends the Hugging Face / ModelScope token
    publish.modelscope_endpoint

The user keeps them by saying so: an override on the command line (`target.trust_remote_code=true`)
or their own `--recipe`. The environment a draft's manifest asks for is checked in
`dspark_cli.export.integrity` (only the names export itself writes).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dspark_cli.errors import RecipeError, UsageError

TRUST_FIELDS: dict[str, Any] = {
    "target.trust_remote_code": False,
    "serve.extra_args": [],
    "publish.hf_endpoint": None,
    "publish.modelscope_endpoint": None,
}
# The one list of what a carried recipe may supply: a whole section (`target`) or one field (`serve.x`).
# Trust fields inside an allowed section are refused above, never carried.
CARRIED = (
    "target",
    "draft",
    "capture.aux_attn_res_stream",
    "capture.max_seq_len",
    "train.max_seq_len",
    "serve.num_speculative_tokens",
    "serve.attention_backend",
    "serve.draft_sample_method",
    "serve.rejection_sample_method",
    "serve.enable_adaptive_verification",
    "publish.license",
)


def _leaves(tree: Any, prefix: str = "") -> dict[str, Any]:
    """{dotted path: value} of every leaf of a nested mapping (lists are leaves)."""
    if not isinstance(tree, dict):
        return {prefix: tree}
    out: dict[str, Any] = {}
    for key, value in tree.items():
        out.update(_leaves(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def _carried(dotted: str) -> bool:
    return dotted not in TRUST_FIELDS and any(dotted == c or dotted.startswith(c + ".") for c in CARRIED)


def carry(tree: Any, source: str, overrides: list[str], *, whole: bool = False) -> dict[str, Any]:
    """The part of a carried recipe `tree` that `CARRIED` allows (`whole`: all of it but its output
    directories, for a run's own recipe); one-line UsageError if it sets a trust field that the user's own
    `overrides` (`key=value`) do not."""
    if not isinstance(tree, dict):
        return {}
    leaves = _leaves(tree)
    mine = {item.split("=", 1)[0].strip() for item in overrides if "=" in item}
    borrowed = [
        f"{name}: {leaves[name]!r}"
        for name, default in TRUST_FIELDS.items()
        if name not in mine and name in leaves and leaves[name] != default
    ]
    if borrowed:
        first = borrowed[0].split(":")[0]
        raise UsageError(
            f"{source} sets {', '.join(borrowed)}: dspark takes these only from your own recipe or "
            "overrides, never from a draft or run directory",
            f"pass --recipe YOUR_RECIPE, or repeat it yourself ({first}=...) if you trust this draft",
        )
    kept: dict[str, Any] = {}
    for dotted, value in leaves.items():
        if (dotted.split(".")[-1] != "output_dir" and dotted not in TRUST_FIELDS) if whole else _carried(dotted):
            node = kept
            *parents, last = dotted.split(".")
            for part in parents:
                node = node.setdefault(part, {})
            node[last] = value
    return kept


def carried_recipe(
    directory: str | Path,
    overrides: list[str],
    find_recipe: Callable[[str | Path], str | None],
    *,
    whole: bool = False,
) -> str | None:
    """A temp YAML file holding what the recipe in draft `directory` may supply, with `output_dir` beside the
    draft; None when the directory carries no recipe. `find_recipe(directory)`: the recipe file it carries,
    or None (a file outside `directory` is a temp file, removed here). `whole` (export of a training run):
    every field of the run's recipe but its output directories. The caller removes the file."""
    import yaml

    from dspark_cli.recipe.loader import parse_yaml

    found = find_recipe(directory)
    if found is None:
        return None
    try:
        tree = parse_yaml(Path(found).read_text(encoding="utf-8"), found)
    finally:
        if Path(found).parent != Path(directory):  # the manifest's recipe, written to a temp file
            os.unlink(found)
    kept = carry(tree, found, overrides, whole=whole)
    kept["output_dir"] = str(Path(directory).resolve().parent)
    handle = tempfile.NamedTemporaryFile(
        "w",
        prefix=f"dspark-recipe-of-{Path(directory).resolve().name}-",  # noqa: SIM115
        suffix=".yaml",
        delete=False,
    )
    with handle:
        yaml.safe_dump(kept, handle, sort_keys=False)
    return handle.name


def load_beside(
    recipe: str | None,
    directory: str | None,
    overrides: list[str],
    load: Callable[[str], Any],
    find_recipe: Callable[[str | Path], str | None],
    *,
    whole: bool = False,
) -> Any:
    """`load(recipe)` when the user gave one; else `load` of what the recipe `directory` carries
    (`find_recipe`) may supply (`carried_recipe`; refused when it sets a trust field the user's `overrides`
    do not); None when there is neither."""
    if recipe is not None or directory is None:
        return load(recipe) if recipe is not None else None
    path = carried_recipe(directory, overrides, find_recipe, whole=whole)
    if path is None:
        return None
    try:
        return load(path)
    except RecipeError as exc:  # name the draft's recipe, not the temp file holding the part of it used
        raise RecipeError(
            exc.problems,
            f"these come from the recipe {directory} carries and your overrides; "
            "pass --recipe YOUR_RECIPE or fix them with key=value",
        ) from None
    finally:
        os.unlink(path)
