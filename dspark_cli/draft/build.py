"""Building a `DSparkDraftConfig` from a recipe, a target config, or plain values.

    from dspark_cli.draft.build import draft_config_from_recipe
    cfg = draft_config_from_recipe(recipe["draft"], recipe["target"])          # no target needed
    cfg = draft_config_from_recipe(recipe["draft"], recipe["target"], target_config=hf_config)

Geometry precedence: recipe override > the target's config (when given) > defaults.
Defaults without a target config: MLA takes the Kimi-K3 draft geometry (`MLA_DEFAULTS`);
GQA takes Qwen3-style geometry derived from the hidden size (`gqa_defaults`: head_dim 128,
hidden // 128 heads, a quarter as many KV heads, MLP 3x hidden, theta 1e6), which is exactly
Qwen3-8B's for hidden 4096. Both are logged when used.
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Mapping
from typing import Any

from transformers import PretrainedConfig

from dspark_cli.contract import default_target_layer_ids
from dspark_cli.draft.config import GQA_FIELDS, MLA_FIELDS, DraftConfigError, DSparkDraftConfig

logger = logging.getLogger(__name__)

# Geometry a recipe may override; anything else is a typo.
GEOMETRY_FIELDS = (
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "rms_norm_eps",
    "rope_theta",
    "max_position_embeddings",
    "rope_scaling",
    *MLA_FIELDS,
    *GQA_FIELDS,
)
# MLA geometry when neither the target nor the recipe says otherwise: the published Kimi-K3 draft's
# (q_lora_rank + kv_lora_rank + qk_rope_head_dim = 1536 + 512 + 64 = 2112, as in vLLM's
# dspark_mla.py comment; 64 heads, MLP 14336).
MLA_DEFAULTS = {
    "num_attention_heads": 64,
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "intermediate_size": 14336,
    "rope_theta": 50000.0,  # K3DSparkConfig's default theta
}
# Recipe `draft` keys that are not config fields.
RECIPE_RUNTIME_KEYS = ("attention",)


def gqa_defaults(hidden_size: int) -> dict[str, Any]:
    head_dim = 128 if hidden_size % 128 == 0 else 64
    heads = max(1, hidden_size // head_dim)
    return {
        "head_dim": head_dim,
        "num_attention_heads": heads,
        "num_key_value_heads": max(1, heads // 4) if heads % 4 == 0 else heads,
        "intermediate_size": 3 * hidden_size,
        "rope_theta": 1e6,
    }


def _check_geometry_names(geometry: Mapping[str, Any]) -> None:
    unknown = sorted(set(geometry) - set(GEOMETRY_FIELDS))
    if unknown:
        close = difflib.get_close_matches(unknown[0], GEOMETRY_FIELDS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise DraftConfigError(f"draft.{unknown[0]}: unknown field{hint}")


def draft_config_from_values(
    *,
    arch: str,
    target_hidden_size: int,
    vocab_size: int,
    num_layers: int,
    block_size: int,
    target_layer_ids: list[int],
    target_num_hidden_layers: int | None = None,
    markov_rank: int = 256,
    enable_confidence_head: bool = True,
    confidence_head_with_markov: bool = True,
    mask_token_id: int | None = None,
    **geometry: Any,
) -> DSparkDraftConfig:
    """Build a draft config from plain values (a recipe's `draft` and `target` sections).

    `arch` is "mla" or "gqa" ("auto" needs a target config: see `draft_config_from_target`).
    `geometry` takes the names in `GEOMETRY_FIELDS`; None means "not set" (module docstring
    says what unset fields default to). `mask_token_id=None` picks `vocab_size - 1` with a
    warning.
    """
    _check_geometry_names(geometry)
    values = {k: v for k, v in geometry.items() if v is not None}
    if arch == "auto":
        raise DraftConfigError("draft.arch: 'auto' needs the target's config; set 'mla' or 'gqa'")
    defaults = MLA_DEFAULTS if arch == "mla" else gqa_defaults(target_hidden_size)
    missing = {k: v for k, v in defaults.items() if k not in values}
    if missing:
        logger.info("draft geometry not given, using %s defaults: %s", arch, missing)
        values.update(missing)
    values.setdefault("hidden_size", target_hidden_size)
    if mask_token_id is None:
        mask_token_id = vocab_size - 1
        logger.warning(
            "draft.mask_token_id not set; using the last vocabulary row %d. Set it "
            "to an unused/reserved token id of the target's tokenizer.",
            mask_token_id,
        )
    return DSparkDraftConfig(
        arch=arch,
        vocab_size=vocab_size,
        target_hidden_size=target_hidden_size,
        num_hidden_layers=num_layers,
        block_size=block_size,
        target_layer_ids=target_layer_ids,
        target_num_hidden_layers=target_num_hidden_layers,
        markov_rank=markov_rank,
        enable_confidence_head=enable_confidence_head,
        confidence_head_with_markov=confidence_head_with_markov,
        mask_token_id=mask_token_id,
        **values,
    )


def _target_text_config(target_config: Any) -> dict[str, Any]:
    if isinstance(target_config, PretrainedConfig):
        text = target_config.get_text_config()
        values = text.to_dict()
        rope = getattr(text, "rope_parameters", None) or {}
    else:
        values = dict(target_config)
        if isinstance(values.get("text_config"), Mapping):
            values = dict(values["text_config"])
        rope = values.get("rope_parameters") or values.get("rope_scaling") or {}
    if values.get("rope_theta") is None and "rope_theta" in rope:
        values["rope_theta"] = rope["rope_theta"]
    return values


def draft_config_from_target(
    target_config: PretrainedConfig | Mapping[str, Any],
    *,
    arch: str = "auto",
    num_layers: int,
    block_size: int,
    target_layer_ids: list[int] | None,
    markov_rank: int = 256,
    enable_confidence_head: bool = True,
    confidence_head_with_markov: bool = True,
    mask_token_id: int | None = None,
    **geometry_overrides: Any,
) -> DSparkDraftConfig:
    """Build a draft config whose geometry defaults to the target's (a config or config.json dict).

    `arch="auto"` picks "mla" when the target uses MLA (has `kv_lora_rank`), else "gqa".
    The draft copies the target's attention geometry (as DeepSpec does for Qwen3 drafts);
    `geometry_overrides` (names in `GEOMETRY_FIELDS`, None = unset) win over it.
    `target_layer_ids=None` takes `contract.default_target_layer_ids` (five layers, spread).
    """
    _check_geometry_names(geometry_overrides)
    target = _target_text_config(target_config)
    for field in ("hidden_size", "vocab_size", "num_hidden_layers"):
        if not target.get(field):
            raise DraftConfigError(f"target.{field}: missing from the target config")
    if arch == "auto":
        arch = "mla" if target.get("kv_lora_rank") else "gqa"
    inherited = (
        "intermediate_size",
        "num_attention_heads",
        "rms_norm_eps",
        "rope_theta",
        "max_position_embeddings",
        *(MLA_FIELDS if arch == "mla" else GQA_FIELDS),
    )
    geometry = {f: target[f] for f in inherited if target.get(f) is not None}
    if arch == "mla" and not target.get("q_lora_rank"):  # a GQA target or a full-rank-q MLA
        geometry = {f: v for f, v in geometry.items() if f not in MLA_FIELDS}
    geometry.update({k: v for k, v in geometry_overrides.items() if v is not None})
    depth = int(target["num_hidden_layers"])
    return draft_config_from_values(
        arch=arch,
        target_hidden_size=int(target["hidden_size"]),
        vocab_size=int(target["vocab_size"]),
        num_layers=num_layers,
        block_size=block_size,
        target_layer_ids=target_layer_ids or default_target_layer_ids(depth),
        target_num_hidden_layers=depth,
        markov_rank=markov_rank,
        enable_confidence_head=enable_confidence_head,
        confidence_head_with_markov=confidence_head_with_markov,
        mask_token_id=mask_token_id,
        **geometry,
    )


def draft_config_from_recipe(
    draft: Mapping[str, Any],
    target: Mapping[str, Any],
    target_config: PretrainedConfig | Mapping[str, Any] | None = None,
) -> DSparkDraftConfig:
    """Recipe `draft` section (+ `target` section, + the target's config if loadable) -> config.

    `draft` keys: arch, num_layers, block_size, target_layer_ids, markov_rank, confidence_head,
    confidence_head_with_markov, mask_token_id, attention (runtime only), and geometry
    overrides. `target` keys read: hidden_size, vocab_size, num_hidden_layers (the declared
    geometry, used when `target_config` is None).
    """
    values = {k: v for k, v in draft.items() if k not in RECIPE_RUNTIME_KEYS}
    common = dict(
        num_layers=values.pop("num_layers", 5),
        block_size=values.pop("block_size", 7),
        target_layer_ids=values.pop("target_layer_ids", None),
        markov_rank=values.pop("markov_rank", 256),
        enable_confidence_head=values.pop("confidence_head", True),
        confidence_head_with_markov=values.pop("confidence_head_with_markov", True),
        mask_token_id=values.pop("mask_token_id", None),
    )
    arch = values.pop("arch", "auto")
    _check_geometry_names(values)
    if target_config is not None:
        return draft_config_from_target(target_config, arch=arch, **common, **values)
    missing = [f for f in ("hidden_size", "vocab_size", "num_hidden_layers") if not target.get(f)]
    if missing:
        raise DraftConfigError(
            f"target.{missing[0]}: needed to build the draft without "
            "loading the target (declare it in the recipe's target section)"
        )
    if arch == "auto":
        arch = "mla" if any(values.get(f) is not None for f in MLA_FIELDS) else "gqa"
    depth = int(target["num_hidden_layers"])
    if common["target_layer_ids"] is None:
        common["target_layer_ids"] = default_target_layer_ids(depth)
    return draft_config_from_values(
        arch=arch,
        target_hidden_size=int(target["hidden_size"]),
        vocab_size=int(target["vocab_size"]),
        target_num_hidden_layers=depth,
        **common,
        **values,
    )
