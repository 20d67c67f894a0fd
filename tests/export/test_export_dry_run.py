"""`dspark export --recipe R --meta --dry-run --format json`: the roster users see equals what vLLM 0.33 loads."""

from __future__ import annotations

import json

import pytest
from reference.vllm_rosters import simulate_load
from typer.testing import CliRunner

from dspark_cli.cli import app

runner = CliRunner()


@pytest.mark.parametrize(
    ("template", "engine", "architecture"),
    [
        ("kimi-k3", "k3", "K3DSparkModel"),
        ("qwen3-8b", "qwen3", "Qwen3DSparkModel"),
        ("llama-3.1-8b", "qwen3", "Qwen3DSparkModel"),
    ],
)
def test_shipped_recipe_rosters_load_exactly_in_vllm(template, engine, architecture):
    result = runner.invoke(
        app, ["export", "--recipe", f"templates/recipes/{template}.yaml", "--meta", "--dry-run", "--format", "json"]
    )
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert plan["architecture"] == architecture and plan["config"]["architectures"] == [architecture]
    checkpoint = {t["name"]: tuple(t["shape"]) for t in plan["tensors"]}
    dtypes = {t["name"]: t["dtype"] for t in plan["tensors"]}
    report = simulate_load(engine, plan["config"], checkpoint, dtypes)
    assert report.problems == []
    assert len(checkpoint) == plan["num_tensors"]


def test_k3_roster_carries_the_recipe():
    result = runner.invoke(app, ["export", "--recipe", "kimi-k3", "--meta", "--dry-run", "--format", "json"])
    config = json.loads(result.stdout)["config"]
    assert config["model_type"] == "k3_dspark" and config["target_layer_ids"] == [2, 23, 47, 71, 89]
    assert (config["num_target_layers"], config["num_hidden_layers"], config["block_size"]) == (5, 5, 7)
    assert (config["markov_rank"], config["mask_token_id"], config["kv_lora_rank"]) == (256, 163837, 512)
    assert config["rope_parameters"] == {
        "rope_type": "yarn",
        "rope_theta": 50000.0,
        "factor": 32.0,
        "original_max_position_embeddings": 32768,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "mscale": 1.0,
        "mscale_all_dim": 0.0,
    }
    assert config["max_position_embeddings"] == 1_048_576


def published_k3_roster() -> dict[str, tuple[list[int], str]]:
    """The published Inferact/Kimi-K3-DSpark draft's 67 tensors (its embed_tokens, the 68th, is the
    target's), from its geometry: hidden 7168, MLP 14336, 5 layers, 64 heads, q/kv LoRA 1536/512,
    nope/rope/v 128/64/128, vocab 163840, 5 target layers, Markov rank 256, confidence head."""
    h, heads, vocab = 7168, 64, 163840
    layer = {
        "input_layernorm.weight": [h],
        "self_attn.q_a_proj.weight": [1536, h],
        "self_attn.q_a_layernorm.weight": [1536],
        "self_attn.q_b_proj.weight": [heads * 192, 1536],
        "self_attn.kv_a_proj_with_mqa.weight": [512 + 64, h],
        "self_attn.kv_a_layernorm.weight": [512],
        "self_attn.kv_b_proj.weight": [heads * (128 + 128), 512],
        "self_attn.o_proj.weight": [h, heads * 128],
        "post_attention_layernorm.weight": [h],
        "mlp.gate_proj.weight": [14336, h],
        "mlp.up_proj.weight": [14336, h],
        "mlp.down_proj.weight": [h, 14336],
    }
    roster = {
        "context_proj.weight": ([h, 5 * h], "bfloat16"),
        "context_norm.weight": ([h], "bfloat16"),
        "final_norm.weight": ([h], "bfloat16"),
        "markov_head.markov_w1.weight": ([vocab, 256], "bfloat16"),
        "markov_head.markov_w2.weight": ([vocab, 256], "bfloat16"),
        "confidence_head.proj.weight": ([1, h + 256], "float32"),
        "confidence_head.proj.bias": ([1], "float32"),
    }
    for i in range(5):
        roster.update({f"layers.{i}.{name}": (shape, "bfloat16") for name, shape in layer.items()})
    return roster


def test_k3_dry_run_lists_the_published_tensors():
    result = runner.invoke(
        app, ["export", "--recipe", "templates/recipes/kimi-k3.yaml", "--meta", "--dry-run", "--format", "json"]
    )
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    listed = {t["name"]: (t["shape"], t["dtype"]) for t in plan["tensors"]}
    assert plan["num_tensors"] == 67 and listed == published_k3_roster()


def test_overrides_reach_the_roster_and_text_output():
    result = runner.invoke(app, ["export", "--recipe", "kimi-k3", "draft.num_layers=2", "--meta", "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "layers.1.mlp.down_proj.weight" in result.output and "layers.2." not in result.output
    assert "nothing written" in result.output


def test_meta_needs_recipe_and_dry_run():
    result = runner.invoke(app, ["export", "--recipe", "kimi-k3", "--meta"])
    assert result.exit_code == 2 and "--meta --dry-run" in result.output
