"""The tensors an export writes, listed without allocating them (meta device).

    from dspark_cli.export.roster import tensor_roster
    for t in tensor_roster(cfg):           # cfg: DSparkDraftConfig
        print(t["name"], t["shape"], t["dtype"])
    plan = export_dry_run(recipe.draft.model_dump(), recipe.target.model_dump())  # + config.json

Names are the draft's `state_dict()` keys, which are vLLM's checkpoint names (no "model."
prefix; vLLM's loaders add it, stack gate/up and q/k/v or q_a/kv_a, and for K3 copy every
layer's kv_a_proj_with_mqa into its fused context_kv_proj). The target's embed_tokens and
lm_head are never listed: vLLM aliases them from the target. The confidence head is
float32 (vLLM allocates it with params_dtype=float32); everything else is `dtype`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from dspark_cli.draft.config import DSparkDraftConfig

FP32_PREFIXES = ("confidence_head.",)


def build_meta_model(config: DSparkDraftConfig):
    """The draft on the meta device: shapes and names only, no memory."""
    from dspark_cli.draft.model import meta_model

    return meta_model(config)


def tensor_roster(config: DSparkDraftConfig, dtype: str = "bfloat16") -> list[dict[str, Any]]:
    """[{"name", "shape", "dtype"}] of every tensor the export writes, in state_dict order."""
    if not hasattr(torch, dtype) or not isinstance(getattr(torch, dtype), torch.dtype):
        raise ValueError(f"dtype must be a torch dtype name such as 'bfloat16', got {dtype!r}")
    model = build_meta_model(config)
    return [
        {
            "name": name,
            "shape": list(tensor.shape),
            "dtype": "float32" if name.startswith(FP32_PREFIXES) else dtype,
        }
        for name, tensor in model.state_dict().items()
    ]


def export_dry_run(
    draft: Mapping[str, Any],
    target: Mapping[str, Any],
    target_config: Any = None,
    dtype: str = "bfloat16",
) -> dict[str, Any]:
    """What `dspark export --meta --dry-run` shows: the vLLM config.json and every tensor.

    `draft` / `target` are the recipe sections as plain dicts; `target_config` is the target's
    transformers config when it can be loaded (its geometry then fills unset draft fields).
    """
    from dspark_cli.draft.build import draft_config_from_recipe
    from dspark_cli.draft.config import vllm_config_dict

    config = draft_config_from_recipe(draft, target, target_config)
    tensors = tensor_roster(config, dtype=dtype)
    num_params = sum(math.prod(t["shape"]) for t in tensors)
    num_bytes = sum(math.prod(t["shape"]) * getattr(torch, t["dtype"]).itemsize for t in tensors)
    return {
        "architecture": vllm_config_dict(config, dtype)["architectures"][0],
        "config": vllm_config_dict(config, dtype),
        "num_tensors": len(tensors),
        "num_parameters": num_params,
        "num_bytes": num_bytes,
        "tensors": tensors,
    }
