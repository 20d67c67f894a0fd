"""`dspark export --recipe R --meta --dry-run --format json`: the roster users see equals what vLLM 0.33 loads."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parent))

from reference.vllm_rosters import simulate_load  # noqa: E402

from dspark_cli.cli import app  # noqa: E402

runner = CliRunner()


@pytest.mark.parametrize(("template", "engine", "architecture"),
                         [("kimi-k3", "k3", "K3DSparkModel"), ("qwen3-8b", "qwen3", "Qwen3DSparkModel"),
                          ("llama-3.1-8b", "qwen3", "Qwen3DSparkModel")])
def test_shipped_recipe_rosters_load_exactly_in_vllm(template, engine, architecture):
    result = runner.invoke(app, ["export", "--recipe", f"templates/recipes/{template}.yaml", "--meta", "--dry-run",
                                 "--format", "json"])
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
    assert (config["markov_rank"], config["mask_token_id"], config["kv_lora_rank"]) == (256, 163839, 512)


def test_overrides_reach_the_roster_and_text_output():
    result = runner.invoke(app, ["export", "--recipe", "kimi-k3", "draft.num_layers=2", "--meta", "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "layers.1.mlp.down_proj.weight" in result.output and "layers.2." not in result.output
    assert "nothing written" in result.output


def test_meta_needs_recipe_and_dry_run():
    result = runner.invoke(app, ["export", "--recipe", "kimi-k3", "--meta"])
    assert result.exit_code == 2 and "--meta --dry-run" in result.output
