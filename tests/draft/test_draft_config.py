"""The draft config: recipes build it, vLLM 0.33's own config code accepts what we export."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from requirements_support import require_module

from dspark_cli.contract import spread_layer_ids
from dspark_cli.draft.build import (
    draft_config_from_recipe,
    draft_config_from_target,
    draft_config_from_values,
)
from dspark_cli.draft.config import DraftConfigError, DSparkDraftConfig, vllm_config_dict
from dspark_cli.errors import ContractError

K3_DRAFT = dict(
    arch="mla",
    num_layers=5,
    block_size=7,
    target_layer_ids=[2, 23, 47, 71, 89],
    markov_rank=256,
    confidence_head=True,
    confidence_head_with_markov=True,
    mask_token_id=163837,
    attention="auto",
    num_attention_heads=64,
    q_lora_rank=1536,
    kv_lora_rank=512,
    qk_nope_head_dim=128,
    qk_rope_head_dim=64,
    v_head_dim=128,
    intermediate_size=14336,
    rms_norm_eps=1e-6,
    rope_theta=50000.0,
)
K3_TARGET = dict(hidden_size=7168, vocab_size=163840, num_hidden_layers=93)
QWEN3_8B_DRAFT = dict(
    arch="gqa",
    num_layers=5,
    block_size=7,
    target_layer_ids=[1, 9, 17, 25, 33],
    markov_rank=256,
    confidence_head=True,
    mask_token_id=151669,
)
QWEN3_8B_TARGET = dict(hidden_size=4096, vocab_size=151936, num_hidden_layers=36)


def small(**overrides):
    values = dict(
        arch="gqa",
        target_hidden_size=64,
        vocab_size=100,
        num_layers=2,
        block_size=4,
        target_layer_ids=[0, 2],
        target_num_hidden_layers=4,
        mask_token_id=99,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        intermediate_size=128,
    )
    values.update(overrides)
    return draft_config_from_values(**values)


def test_k3_recipe_config_is_accepted_by_vllm_k3dsparkconfig():
    k3_config = require_module("vllm.transformers_utils.configs.k3_dspark", "vllm")
    cfg = draft_config_from_recipe(K3_DRAFT, K3_TARGET)
    exported = vllm_config_dict(cfg)
    assert exported["architectures"] == ["K3DSparkModel"]
    vcfg = k3_config.K3DSparkConfig(**exported)
    assert (vcfg.num_target_layers, list(vcfg.target_layer_ids)) == (5, [2, 23, 47, 71, 89])
    assert vcfg.target_hidden_size * vcfg.num_target_layers == 5 * 7168  # context_proj input
    assert (vcfg.q_lora_rank, vcfg.kv_lora_rank, vcfg.qk_rope_head_dim) == (1536, 512, 64)
    assert vcfg.rope_parameters == {"rope_type": "default", "rope_theta": 50000.0}
    assert vcfg.draft_vocab_size == vcfg.vocab_size == 163840
    assert vcfg.enable_confidence_head and vcfg.confidence_head_with_markov
    assert (vcfg.mask_token_id, vcfg.markov_rank, vcfg.hidden_act) == (163837, 256, "silu")
    assert vcfg.n_routed_experts == 0


def test_k3dsparkconfig_rejects_what_our_config_rejects():
    """Our checks mirror the ones that make vLLM's loading fail."""
    k3_config = require_module("vllm.transformers_utils.configs.k3_dspark", "vllm")
    exported = vllm_config_dict(draft_config_from_recipe(K3_DRAFT, K3_TARGET))
    with pytest.raises(ValueError, match="num_target_layers"):
        k3_config.K3DSparkConfig(**{**exported, "num_target_layers": 4})
    with pytest.raises(ValueError, match="q_lora_rank"):
        k3_config.K3DSparkConfig(**{**exported, "q_lora_rank": None})
    with pytest.raises(DraftConfigError, match="num_target_layers"):
        DSparkDraftConfig(**{**draft_config_from_recipe(K3_DRAFT, K3_TARGET).to_dict(), "num_target_layers": 4})


@pytest.mark.slow  # imports vLLM's config classes: 16 s loaded
def test_qwen3_8b_recipe_config_is_read_by_vllm_as_intended():
    require_module("vllm", "vllm")
    from transformers import Qwen3Config
    from vllm.model_executor.models.qwen3_dflash import dflash_has_any_non_causal
    from vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils import (
        get_eagle3_aux_layers_from_config,
    )
    from vllm.v1.worker.gpu.spec_decode.utils import get_parallel_drafting_token_id

    cfg = draft_config_from_recipe(QWEN3_8B_DRAFT, QWEN3_8B_TARGET)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.intermediate_size, cfg.rope_theta) == (
        32,
        8,
        128,
        12288,
        1e6,
    )  # = Qwen3-8B
    exported = vllm_config_dict(cfg)
    assert exported["architectures"] == ["Qwen3DSparkModel"] and exported["model_type"] == "qwen3"
    hf = Qwen3Config(**exported)
    spec = SimpleNamespace(draft_model_config=SimpleNamespace(hf_config=hf))
    # vLLM captures aux id k+1 for our 0-based "output of layer k"
    assert get_eagle3_aux_layers_from_config(spec) == (2, 10, 18, 26, 34)
    assert get_parallel_drafting_token_id(hf) == 151669
    assert dflash_has_any_non_causal(hf)  # the block attends non-causally
    assert hf.markov_rank == 256 and hf.enable_confidence_head and hf.confidence_head_with_markov


def test_from_target_copies_the_targets_geometry():
    from transformers import Qwen3Config

    target = Qwen3Config(
        hidden_size=4096,
        num_hidden_layers=36,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        intermediate_size=12288,
        vocab_size=151936,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6},
    )
    from_target = draft_config_from_target(
        target, num_layers=5, block_size=7, target_layer_ids=None, mask_token_id=151669
    )
    from_recipe = draft_config_from_recipe(QWEN3_8B_DRAFT, QWEN3_8B_TARGET)
    assert from_target.arch == "gqa"
    assert vllm_config_dict(from_target) == vllm_config_dict(from_recipe)
    mla_target = dict(
        hidden_size=256,
        vocab_size=1000,
        num_hidden_layers=6,
        num_attention_heads=4,
        q_lora_rank=96,
        kv_lora_rank=64,
        qk_nope_head_dim=32,
        qk_rope_head_dim=16,
        v_head_dim=32,
        intermediate_size=512,
        rope_parameters={"rope_theta": 1e4},
    )
    mla = draft_config_from_target(
        {"text_config": mla_target},
        num_layers=2,
        block_size=4,
        target_layer_ids=[1, 4],
        mask_token_id=3,
        intermediate_size=384,
    )
    assert (mla.arch, mla.kv_lora_rank, mla.q_lora_rank, mla.intermediate_size, mla.rope_theta) == (
        "mla",
        64,
        96,
        384,
        1e4,
    )


def test_config_round_trips_through_config_json(tmp_path):
    cfg = draft_config_from_recipe(K3_DRAFT, K3_TARGET)
    cfg.save_pretrained(tmp_path)
    loaded = DSparkDraftConfig.from_pretrained(tmp_path)
    assert loaded.to_dict() == cfg.to_dict()
    assert DSparkDraftConfig.from_dict(small().to_dict()).to_dict() == small().to_dict()


def test_without_confidence_head_markov_flag_is_off_in_the_export():
    cfg = small(enable_confidence_head=False, confidence_head_with_markov=True)
    exported = vllm_config_dict(cfg)
    assert exported["enable_confidence_head"] is False
    assert exported["confidence_head_with_markov"] is False


def test_spread_layer_ids_follows_dflash():
    assert spread_layer_ids(36, 5) == [1, 9, 17, 25, 33]
    assert spread_layer_ids(32, 5) == [1, 8, 15, 22, 29]
    assert spread_layer_ids(6, 4) == [0, 2, 3, 5]
    with pytest.raises(ContractError):
        spread_layer_ids(3, 4)


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        (dict(arch="moe"), "draft.arch"),
        (dict(hidden_size=128), "draft.hidden_size"),
        (dict(target_layer_ids=[2, 0]), "draft.target_layer_ids"),
        (dict(target_layer_ids=[]), "draft.target_layer_ids"),
        (dict(target_layer_ids=[0, 4]), "draft.target_layer_ids"),  # 4 layers: ids 0..3
        (dict(target_layer_ids=[-1, 2]), "draft.target_layer_ids"),
        (dict(mask_token_id=100), "draft.mask_token_id"),
        (dict(num_key_value_heads=3), "draft.num_key_value_heads"),
        (dict(head_dim=15), "draft.head_dim"),
        (dict(kv_lora_rank=16), "draft.kv_lora_rank"),  # MLA field on a GQA draft
        (dict(markov_rank=0), "draft.markov_rank"),
        (dict(block_size=0), "draft.block_size"),
        (dict(num_kv_heads=2), "draft.num_kv_heads"),  # typo
        (dict(arch="auto"), "draft.arch"),
        (
            dict(
                arch="mla",
                q_lora_rank=24,
                kv_lora_rank=16,
                qk_nope_head_dim=8,
                qk_rope_head_dim=7,
                v_head_dim=8,
                num_key_value_heads=None,
                head_dim=None,
            ),
            "draft.qk_rope_head_dim",
        ),
        (dict(arch="mla", num_key_value_heads=2, head_dim=None), "draft.num_key_value_heads"),
    ],
)
def test_invalid_combinations_fail_with_one_line(overrides, field):
    with pytest.raises(DraftConfigError) as info:
        small(**overrides)
    message = str(info.value)
    assert message.startswith(field) and "\n" not in message
    assert isinstance(info.value, ValueError)


def test_config_level_checks():
    base = small().to_dict()
    for bad, field in [
        ({"draft_vocab_size": 50}, "draft_vocab_size"),
        ({"rope_parameters": {"rope_type": "linear", "factor": 4.0}}, "rope_type"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        (
            {
                "arch": "mla",
                "q_lora_rank": None,
                "kv_lora_rank": 8,
                "qk_nope_head_dim": 8,
                "qk_rope_head_dim": 8,
                "v_head_dim": 8,
                "num_key_value_heads": None,
                "head_dim": None,
            },
            "q_lora_rank",
        ),
    ]:
        with pytest.raises(DraftConfigError, match=field):
            DSparkDraftConfig(**{**base, **bad})
    with pytest.raises(DraftConfigError, match="did you mean 'num_key_value_heads'"):
        small(num_key_value_head=2)


def test_importing_the_draft_package_does_not_import_torch():
    import subprocess
    import sys

    code = "import sys, dspark_cli.draft; print('torch' in sys.modules, 'transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
