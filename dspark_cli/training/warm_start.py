"""Warm start (`train.init: pretrained`): a fresh training run that starts from another draft's weights.

    recipe = load_recipe("tiny", ["train.init=pretrained", "train.init_from=runs/base/draft"])
    warm = load_warm_start(recipe, draft_config)        # the weights, checked against the recipe's draft
    warm.apply(model)                                   # before FSDP2 shards it: every rank starts alike
    warm.record                                         # {"kind": "pretrained", "from", "sha256", "published"}

`init_from` is a draft directory `dspark export` wrote, a published DSpark draft (config.json +
model.safetensors, no dspark_manifest.json), or a training output directory (or its `final/`); it is
read with `artifacts.draft.load_draft_dir` and its weights map onto the draft as `build_model` maps
them for bench. Only the weights are taken: the optimiser, the LR schedule, the step count and the
data order start fresh (that is `--resume`'s job). The target's embed_tokens / lm_head come from the
target as always. The source's geometry must be the recipe's draft section's (`geometry_mismatch`:
nothing is adapted or guessed); preflight checks that, and the draft's own integrity
(`export.verify_draft`), before a run starts (`preflight/host.py`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dspark_cli.errors import UsageError

if TYPE_CHECKING:
    import torch

    from dspark_cli.recipe import Recipe

# (draft config field, the recipe key that sets it): what must agree for the weights to mean the same
GEOMETRY = (
    ("arch", "draft.arch"),
    ("num_hidden_layers", "draft.num_layers"),
    ("hidden_size", "target.hidden_size"),
    ("vocab_size", "target.vocab_size"),
    ("intermediate_size", "draft.intermediate_size"),
    ("num_attention_heads", "draft.num_attention_heads"),
    ("num_key_value_heads", "draft.num_key_value_heads"),
    ("head_dim", "draft.head_dim"),
    ("q_lora_rank", "draft.q_lora_rank"),
    ("kv_lora_rank", "draft.kv_lora_rank"),
    ("qk_nope_head_dim", "draft.qk_nope_head_dim"),
    ("qk_rope_head_dim", "draft.qk_rope_head_dim"),
    ("v_head_dim", "draft.v_head_dim"),
    ("block_size", "draft.block_size"),
    ("target_layer_ids", "draft.target_layer_ids"),
    ("markov_rank", "draft.markov_rank"),
    ("enable_confidence_head", "draft.confidence_head"),
    ("confidence_head_with_markov", "draft.confidence_head_with_markov"),
    ("mask_token_id", "draft.mask_token_id"),
    ("rms_norm_eps", "draft.rms_norm_eps"),
    ("rope_theta", "draft.rope_theta"),
)


def geometry_mismatch(source: Any, wanted: Any, where: str) -> str | None:
    """None when the draft config `source` (read from `where`) has the geometry of `wanted` (the recipe's),
    else one line naming the first differing fields with both values."""
    differ = []
    for field, key in GEOMETRY:
        mine, theirs = getattr(wanted, field, None), getattr(source, field, None)
        if isinstance(mine, float) and isinstance(theirs, float):
            same = abs(mine - theirs) <= 1e-9 * max(abs(mine), abs(theirs))
        else:
            same = mine == theirs or (isinstance(mine, list | tuple) and list(mine) == list(theirs or []))
        if not same:
            differ.append(f"{key} {theirs!r} (recipe: {mine!r})")
    if not differ:
        return None
    shown = ", ".join(differ[:3]) + (f" (+{len(differ) - 3} more)" if len(differ) > 3 else "")
    return f"train.init_from: the draft at {where} has another geometry than the recipe's draft: {shown}"


MISMATCH_HINT = (
    "set those fields in the recipe as the draft has them (its config.json), or train from train.init=target"
)


def draft_weights_dir(path: Path) -> Path:
    """The directory holding the weights: `final/` of a training output directory, else `path`."""
    from dspark_cli.artifacts.draft import WEIGHTS

    return path / "final" if (path / "final" / WEIGHTS).is_file() else path


def portable_source(source: Path, out_dir: Path) -> str:
    """`source` as the train manifest records it: relative to the train directory when the two share a
    folder below `/` (`../../base/draft`), else the directory's name, so a manifest never spells a path of
    this machine from the root."""
    real, base = os.path.realpath(source), os.path.realpath(out_dir)
    common = Path(os.path.commonpath([real, base]))
    return Path(real).name if common.parent == common else os.path.relpath(real, base)


@dataclass
class WarmStart:
    """The source draft's weights (as stored) and what the train manifest records of them."""

    state_dict: dict[str, torch.Tensor]
    record: dict[str, Any]

    def apply(self, model: torch.nn.Module) -> None:
        """Copy the weights into `model` (a DSparkDraftModel), cast to its parameters' dtype. Every name
        must match: the draft's state dict maps onto the model as bench's `build_model` maps it."""
        from dspark_cli.artifacts.draft import build_model

        built = build_model(model.config, self.state_dict)  # type: ignore[attr-defined]
        model.load_state_dict(built.state_dict(), strict=True)  # copy_: cast to each parameter's dtype


def load_warm_start(recipe: Recipe, draft_config: Any, out_dir: Path) -> WarmStart:
    """The weights of `train.init_from`, after its geometry was checked against `draft_config` (one-line
    UsageError on a mismatch, as preflight words it)."""
    from dspark_cli.artifacts.draft import DRAFT_MANIFEST, WEIGHTS, load_draft_dir
    from dspark_cli.artifacts.files import sha256_file

    source = recipe.train.init_from
    if not source:
        raise UsageError("train.init: pretrained needs train.init_from", "set train.init_from=DRAFT_DIR")
    loaded = load_draft_dir(source)
    problem = geometry_mismatch(loaded.config, draft_config, source)
    if problem:
        raise UsageError(problem, MISMATCH_HINT)
    published = not loaded.train_manifest and not (loaded.source / DRAFT_MANIFEST).is_file()
    record = {
        "kind": "pretrained",
        "from": portable_source(Path(source), out_dir),
        "sha256": sha256_file(loaded.source / WEIGHTS),
        "published": published,
    }
    return WarmStart(loaded.state_dict, record)
