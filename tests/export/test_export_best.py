"""`dspark export` of a training run with a validation split: `best/` by default, `--select final` for the
last step's draft, and dspark_manifest.json's `selected` naming which one and its step.

    .venv/bin/python -m pytest tests/export/test_export_best.py -q
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from reference.tiny_drafts import LAYER_IDS, tiny_model
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from dspark_cli.cli import app
from dspark_cli.draft.config import vllm_config_dict
from dspark_cli.export.writer import export_draft

runner = CliRunner()
BEST = {"step": 6, "metric": "tau_t1", "value": 1.75}


def train_dir(tmp_path: Path, *, best: bool = True) -> Path:
    """A training output dir as `dspark train` leaves it with a validation split: final/ (step 10) and best/
    (step 6: other weights), validation.json, and the manifest's `best` record."""
    train = tmp_path / "train"
    model, _, _ = tiny_model("gqa", block_size=4)
    for name, scale in (("final", 1.0), ("best", 0.5)) if best else (("final", 1.0),):
        (train / name).mkdir(parents=True)
        weights = {k: (v * scale).contiguous() for k, v in model.state_dict().items()}
        save_file(weights, str(train / name / "model.safetensors"))
        (train / name / "config.json").write_text(json.dumps(vllm_config_dict(model.config, "float32")))
    if best:
        (train / "best" / "validation.json").write_text(json.dumps(BEST))
    manifest = {
        "kind": "dspark.train",
        "complete": True,
        "contract": {"target": "synthetic", "target_layer_ids": LAYER_IDS, "block_size": 4},
        "summary": {"steps": 10, "best": BEST if best else None},
        "best": BEST if best else None,
    }
    (train / "manifest.json").write_text(json.dumps(manifest))
    return train


def _weights_equal(a: Path, b: Path) -> bool:
    x, y = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    return x.keys() == y.keys() and all(torch.equal(x[k].float(), y[k].float()) for k in x)


def test_export_takes_best_by_default_and_says_which_step(tmp_path):
    train = train_dir(tmp_path)
    summary = export_draft(train, tmp_path / "draft", dtype="float32")
    assert summary.selected == {"checkpoint": "best", **BEST}
    manifest = json.loads((tmp_path / "draft" / "dspark_manifest.json").read_text())
    assert manifest["selected"] == {"checkpoint": "best", "step": 6, "metric": "tau_t1", "value": 1.75}
    assert _weights_equal(tmp_path / "draft", train / "best")
    assert not _weights_equal(tmp_path / "draft", train / "final")


def test_select_final_takes_the_last_steps_draft(tmp_path):
    train = train_dir(tmp_path)
    result = runner.invoke(
        app, ["export", str(train), "-o", str(tmp_path / "draft"), "--select", "final", "--dtype", "float32"]
    )
    assert result.exit_code == 0, result.output
    assert "draft: final/ (step 10)" in result.output
    manifest = json.loads((tmp_path / "draft" / "dspark_manifest.json").read_text())
    assert manifest["selected"] == {"checkpoint": "final", "step": 10}
    assert _weights_equal(tmp_path / "draft", train / "final")


def test_a_run_without_best_exports_final(tmp_path):
    summary = export_draft(train_dir(tmp_path, best=False), tmp_path / "draft", dtype="float32")
    assert summary.selected == {"checkpoint": "final", "step": 10}


@pytest.mark.parametrize("output_format", ["text", "json"])
def test_dry_run_shows_the_selected_draft(tmp_path, output_format):
    train = train_dir(tmp_path)
    result = runner.invoke(app, ["export", str(train), "--dry-run", "--format", output_format])
    assert result.exit_code == 0, result.output
    if output_format == "json":
        assert json.loads(result.output)["selected"] == {"checkpoint": "best", **BEST}
    else:
        assert "draft: best/ (step 6, validation tau_t1 1.750)" in result.output
    assert not (tmp_path / "draft").exists()


def test_select_is_a_recipe_key_too(tmp_path):
    result = runner.invoke(app, ["export", str(train_dir(tmp_path)), "--dry-run", "--select", "last"])
    assert result.exit_code == 2 and "export.select" in result.output, result.output
