"""benchmarks/peers/: the capture handed to SpecForge, and SpecForge's draft mapping onto ours.

    .venv/bin/python -m pytest tests/test_peers.py -q

The whole comparison (`python benchmarks/peers/run.py`, minutes) is a benchmark, not a test; these
pin the two conversions it rests on. The mapping test needs SpecForge's venv
(`bash benchmarks/peers/setup_specforge.sh`) and is skipped without it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT / "benchmarks" / "peers"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import run as peers  # noqa: E402  benchmarks/peers/run.py
from capture_support import capture_recipe  # noqa: E402

VENV_PYTHON = peers.VENV / "bin" / "python"


@pytest.fixture(scope="module")
def captured(tmp_path_factory):
    from dspark_cli.capture import run_capture

    recipe = capture_recipe("tiny-gqa", tmp_path_factory.mktemp("peers"), "draft.arch=gqa")
    run_capture(recipe)
    return recipe


@pytest.mark.slow  # a real capture (the `captured` fixture)
def test_features_are_specforge_dspark_records_of_our_layers(captured, tmp_path):
    """Each file is what SpecForge's DSpark offline reader takes; hidden_states' k-th block is the output
    of decoder layer k (SpecForge's extract_context_feature reads hidden_states[k + 1], the output of
    layer k, before the final norm also for the last layer); target_last_hidden_states is post-final-norm."""
    from transformers import AutoModelForCausalLM

    from dspark_cli.capture.plan import resolve_layer_ids
    from dspark_cli.targets import resolve_target, target_geometry

    data = peers.to_specforge(captured, tmp_path / "features")
    files = sorted((tmp_path / "features").glob("data_*.ckpt"))
    assert len(files) == data["sequences"] > 0
    layer_ids = resolve_layer_ids(captured, target_geometry(captured).num_hidden_layers)
    model = AutoModelForCausalLM.from_pretrained(resolve_target("tiny-gqa"), dtype=torch.float32)
    hidden = model.config.hidden_size
    record = torch.load(files[0])
    assert set(record) == {"input_ids", "loss_mask", "hidden_states", "target_last_hidden_states"}
    n = record["input_ids"].shape[0]
    assert record["hidden_states"].shape == (n, len(layer_ids) * hidden)
    assert record["target_last_hidden_states"].shape == (n, hidden)
    assert record["hidden_states"].dtype == record["target_last_hidden_states"].dtype == torch.float32
    outputs = {}
    hooks = [model.model.layers[k].register_forward_hook(
        lambda _m, _i, out, k=k: outputs.__setitem__(k, out[0] if isinstance(out, tuple) else out)) for k in layer_ids]
    with torch.no_grad():
        states = model(record["input_ids"][None], output_hidden_states=True).hidden_states
    for hook in hooks:
        hook.remove()
    ours = torch.cat([outputs[k][0] for k in layer_ids], dim=-1)
    torch.testing.assert_close(record["hidden_states"], ours, atol=0.05, rtol=0.02)  # stored in bf16
    rows = record["loss_mask"].bool()
    torch.testing.assert_close(record["target_last_hidden_states"][rows], states[-1][0][rows], atol=0.05, rtol=0.02)


@pytest.mark.skipif(not VENV_PYTHON.is_file(), reason="no SpecForge venv (bash benchmarks/peers/setup_specforge.sh)")
@pytest.mark.slow  # a real capture (the `captured` fixture)
def test_specforge_draft_has_our_tensor_names_and_shapes(captured, tmp_path):
    from dspark_cli.capture.plan import resolve_layer_ids
    from dspark_cli.draft.model import DSparkDraftModel
    from dspark_cli.targets import resolve_target, target_geometry
    from dspark_cli.training.run import build_draft_config

    peers.specforge_draft_config(captured, tmp_path / "draft.json")
    code = ("import json, sys; from specforge.training.model_loading import load_draft_config_source; "
            "from specforge.modeling.draft.dspark import DSparkDraftModel as M; "
            "m = M(load_draft_config_source(sys.argv[1])); "
            "print(json.dumps({k: list(v.shape) for k, v in m.state_dict().items()}))")
    proc = subprocess.run([str(VENV_PYTHON), "-c", code, str(tmp_path / "draft.json")], capture_output=True,
                          text=True, timeout=300, env={"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    theirs = json.loads(proc.stdout.strip().splitlines()[-1])
    target_dir = resolve_target("tiny-gqa")
    ids = resolve_layer_ids(captured, target_geometry(captured).num_hidden_layers)
    model = DSparkDraftModel(build_draft_config(captured, target_dir, ids))
    ours = {k: list(v.shape) for k, v in model.state_dict().items()}
    assert theirs == ours


def test_train_speed_quotes_the_recorded_peers_run(tmp_path, monkeypatch):
    import train_speed

    assert not hasattr(train_speed, "ISSUE_PEERS")
    monkeypatch.setattr(train_speed, "PEERS_RESULT", tmp_path / "peers.json")
    assert "no recorded side-by-side run" in train_speed.peers_line()
    (tmp_path / "peers.json").write_text(json.dumps({
        "date": "2026-12-01", "command": "python benchmarks/peers/run.py", "target": "tiny-gqa",
        "load_average_start": [2.0, 2.0, 2.0], "tokens_per_s": {"dspark": 300.0, "SpecForge 0.2.0": 100.0}}))
    line = train_speed.peers_line()
    assert "SpecForge 0.2.0 100 tokens/s" in line and "3.00x" in line and "met." in line


def test_the_goals_compare_with_specforge_only_and_name_the_same_time_run():
    """The report's goal lines: each dspark row against the best *SpecForge* row (never against the extra
    dspark run), and the same-time run said to be a different budget from the same-steps comparison."""
    recorded = json.loads((ROOT / "benchmarks" / "results" / "peers.json").read_text())
    same = "dspark, SpecForge's time (600 steps)"
    rows = [{"trainer": t, "dataset": "tiny-eval", "temperature": 0.0, "tau": tau, "ci95": [tau - 0.1, tau + 0.1],
             "turns": 200, "steps": 100} for t, tau in (("dspark", 2.0), ("SpecForge 0.2.0", 1.6), (same, 2.6))]
    result = {**recorded, "steps": 160, "tau": rows, "same_time": {"trainer": same, "steps": 600, "wall_s": 590.0,
                                                      "peer_wall_s": 601.0}}
    text = peers.markdown(result)
    assert "T=0.0: 2.00 vs 1.60 (SpecForge 0.2.0) = 1.25x -- met" in text
    assert "(600 dspark steps in 590 s vs SpecForge's 160 in 601 s), tiny-eval T=0.0: 2.60 vs 1.60 = 1.62x" in text
    assert peers.markdown({**recorded, "tau": rows[:2], "same_time": None}).count("wall-clock budget") == 0


def test_the_objective_table_reads_its_gains_against_each_groups_first_row():
    import objective

    def row(name, overrides, t0, t1):
        return {"name": name, "overrides": overrides, "train_wall_s": 100.0,
                "tau": {"0.0": {"tau": t0, "ci95": [t0 - 0.1, t0 + 0.1]}, "1.0": {"tau": t1, "ci95": [t1 - 0.1, t1 + 0.1]}}}

    # the objective group starts from the published objective; the settings group from the recipe as shipped
    assert objective.GROUPS["objective"][0][1] == {"train.loss.ce_target": "label", "train.loss.slot_weighting": "decay"}
    assert objective.GROUPS["settings"][0][1] == {}
    for group in objective.GROUPS.values():  # every later row changes something, and no two rows are the same
        assert all(o for _, o in group[1:]) and len({str(o) for _, o in group}) == len(group)
    base = {"command": "python benchmarks/objective.py", "date": "2026-12-02", "machine": "m", "wall_s": 60, "data": "d",
            "steps": 160, "loss": "ce 0.5", "eval_prompts": 200}
    text = objective.markdown({**base, "rows": [row("published", {"train.loss.ce_target": "label"}, 2.0, 1.6),
                                                row("soft", {"train.loss.ce_target": "target"}, 2.2, 1.5)]})
    assert text.startswith("# The training objective's options")
    assert "| published | `train.loss.ce_target=label` | 2.00 [1.90, 2.10] | 1.60 [1.50, 1.70] | 100 |" in text
    assert "| soft | `train.loss.ce_target=target` | 2.20 [2.10, 2.30] (+10.0%) | 1.50 [1.40, 1.60] (-6.2%) | 100 |" in text
    text = objective.markdown({**base, "group": "settings", "rows": [row("the tiny recipe", {}, 2.0, 2.0),
                                                                     row("floor", {"train.min_lr_ratio": "0.0"}, 2.1, 1.9)]})
    assert text.startswith("# Training settings, one at a time")
    assert "| the tiny recipe | none | 2.00 [1.90, 2.10] | 2.00 [1.90, 2.10] | 100 |" in text
    assert "| floor | `train.min_lr_ratio=0.0` | 2.10 [2.00, 2.20] (+5.0%) | 1.90 [1.80, 2.00] (-5.0%) | 100 |" in text
    assert "Gains are against the first row (the tiny recipe)." in text


def test_the_unmatched_list_names_only_what_differs_in_the_run():
    published = {"ce_target": "label", "slot_weighting": "decay"}
    names = lambda rows: {name for name, _ in rows}  # noqa: E731
    assert {"objective", "AdamW betas"}.isdisjoint(names(peers.unmatched(published, [0.9, 0.999])))
    assert {"objective", "AdamW betas"} <= names(peers.unmatched({"ce_target": "target"}, [0.9, 0.95]))
    assert "AdamW betas" in names(peers.unmatched(published))  # an older record without betas: 0.9/0.95
