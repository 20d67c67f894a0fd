"""benchmarks/peers/: the capture handed to SpecForge, and SpecForge's draft mapping onto ours.

    .venv/bin/python -m pytest tests/benchmarks/test_peers.py -q

The whole comparison (`python benchmarks/peers/run.py`, minutes) is a benchmark, not a test; these
pin the two conversions it rests on. The mapping test needs SpecForge's venv
(`bash benchmarks/peers/setup_specforge.sh`) and is skipped without it.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks" / "peers"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import run as peers  # noqa: E402  benchmarks/peers/run.py
from capture_support import capture_recipe  # noqa: E402

VENV_PYTHON = peers.VENV / "bin" / "python"
# The last peers record, retired from benchmarks/results/ until rerun (benchmarks/README.md, "Retired records"):
# a real run's result that the report tests render with their own rows.
PEERS_RECORD = "c71cba9f12bbc093db641b0a693d14aea6ddbfc0:benchmarks/results/peers.json"


def _recorded_peers() -> dict:
    done = subprocess.run(["git", "show", PEERS_RECORD], cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


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
    from dspark_cli.targets import Target, resolve_target

    data = peers.to_specforge(captured, tmp_path / "features")
    files = sorted((tmp_path / "features").glob("data_*.ckpt"))
    assert len(files) == data["sequences"] > 0
    layer_ids = resolve_layer_ids(captured, Target.of(captured).geometry().num_hidden_layers)
    model = AutoModelForCausalLM.from_pretrained(resolve_target("tiny-gqa"), dtype=torch.float32)
    hidden = model.config.hidden_size
    record = torch.load(files[0])
    assert set(record) == {"input_ids", "loss_mask", "hidden_states", "target_last_hidden_states"}
    n = record["input_ids"].shape[0]
    assert record["hidden_states"].shape == (n, len(layer_ids) * hidden)
    assert record["target_last_hidden_states"].shape == (n, hidden)
    assert record["hidden_states"].dtype == record["target_last_hidden_states"].dtype == torch.float32
    outputs = {}
    hooks = [
        model.model.layers[k].register_forward_hook(
            lambda _m, _i, out, k=k: outputs.__setitem__(k, out[0] if isinstance(out, tuple) else out)
        )
        for k in layer_ids
    ]
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
    from dspark_cli.targets import Target
    from dspark_cli.training.run import build_draft_config

    peers.specforge_draft_config(captured, tmp_path / "draft.json")
    code = (
        "import json, sys; from specforge.training.model_loading import load_draft_config_source; "
        "from specforge.modeling.draft.dspark import DSparkDraftModel as M; "
        "m = M(load_draft_config_source(sys.argv[1])); "
        "print(json.dumps({k: list(v.shape) for k, v in m.state_dict().items()}))"
    )
    proc = subprocess.run(
        [str(VENV_PYTHON), "-c", code, str(tmp_path / "draft.json")],
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    theirs = json.loads(proc.stdout.strip().splitlines()[-1])
    ids = resolve_layer_ids(captured, Target.of(captured).geometry().num_hidden_layers)
    model = DSparkDraftModel(build_draft_config(captured, ids))
    ours = {k: list(v.shape) for k, v in model.state_dict().items()}
    assert theirs == ours


def test_train_speed_quotes_the_recorded_peers_run(tmp_path, monkeypatch):
    import train_speed

    assert not hasattr(train_speed, "ISSUE_PEERS")
    monkeypatch.setattr(train_speed, "PEERS_RESULT", tmp_path / "peers.json")
    assert "no recorded side-by-side run" in train_speed.peers_line()
    (tmp_path / "peers.json").write_text(
        json.dumps(
            {
                "date": "2026-12-01",
                "command": "python benchmarks/peers/run.py",
                "target": "tiny-gqa",
                "load_average_start": [2.0, 2.0, 2.0],
                "tokens_per_s": {"dspark": 300.0, "SpecForge 0.2.0": 100.0},
            }
        )
    )
    line = train_speed.peers_line()
    assert "SpecForge 0.2.0 100 tokens/s" in line and "3.00x" in line and "met." in line


def test_the_goals_compare_with_specforge_only_and_name_the_same_time_run():
    """The report's goal lines: each dspark row against the best *SpecForge* row (never against the extra
    dspark run), and the same-time run said to be a different budget from the same-steps comparison."""
    recorded = _recorded_peers()
    same = "dspark, SpecForge's time (600 steps)"
    rows = [
        {
            "trainer": t,
            "dataset": "tiny-eval",
            "temperature": 0.0,
            "tau": tau,
            "ci95": [tau - 0.1, tau + 0.1],
            "turns": 200,
            "steps": 100,
        }
        for t, tau in (("dspark", 2.0), ("SpecForge 0.2.0", 1.6), (same, 2.6))
    ]
    result = {
        **recorded,
        "steps": 160,
        "tau": rows,
        "same_time": {"trainer": same, "steps": 600, "wall_s": 590.0, "peer_wall_s": 601.0},
    }
    text = peers.markdown(result)
    assert "T=0.0: 2.00 vs 1.60 (SpecForge 0.2.0) = 1.25x -- met" in text
    assert "(600 dspark steps in 590 s vs SpecForge's 160 in 601 s), tiny-eval T=0.0: 2.60 vs 1.60 = 1.62x" in text
    assert peers.markdown({**recorded, "tau": rows[:2], "same_time": None}).count("wall-clock budget") == 0


def test_the_objective_table_reads_its_gains_against_each_groups_first_row():
    import objective

    def row(name, overrides, t0, t1):
        return {
            "name": name,
            "overrides": overrides,
            "train_wall_s": 100.0,
            "tau": {"0.0": {"tau": t0, "ci95": [t0 - 0.1, t0 + 0.1]}, "1.0": {"tau": t1, "ci95": [t1 - 0.1, t1 + 0.1]}},
        }

    # the objective group starts from the published objective; the settings group from the recipe as shipped
    assert objective.GROUPS["objective"][0][1] == {
        "train.loss.ce_target": "label",
        "train.loss.slot_weighting": "decay",
    }
    assert objective.GROUPS["settings"][0][1] == {}
    for group in objective.GROUPS.values():  # every later row changes something, and no two rows are the same
        assert all(o for _, o in group[1:]) and len({str(o) for _, o in group}) == len(group)
    base = {
        "command": "python benchmarks/objective.py",
        "date": "2026-12-02",
        "machine": "m",
        "wall_s": 60,
        "data": "d",
        "steps": 160,
        "loss": "ce 0.5",
        "eval_prompts": 200,
    }
    text = objective.markdown(
        {
            **base,
            "rows": [
                row("published", {"train.loss.ce_target": "label"}, 2.0, 1.6),
                row("soft", {"train.loss.ce_target": "target"}, 2.2, 1.5),
            ],
        }
    )
    assert text.startswith("# The training objective's options")
    assert "| published | `train.loss.ce_target=label` | 2.00 [1.90, 2.10] | 1.60 [1.50, 1.70] | 100 |" in text
    assert (
        "| soft | `train.loss.ce_target=target` | 2.20 [2.10, 2.30] (+10.0%) | 1.50 [1.40, 1.60] (-6.2%) | 100 |"
        in text
    )
    text = objective.markdown(
        {
            **base,
            "group": "settings",
            "rows": [row("the tiny recipe", {}, 2.0, 2.0), row("floor", {"train.min_lr_ratio": "0.0"}, 2.1, 1.9)],
        }
    )
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
    floors = {name: text for name, text in peers.unmatched(published, [0.9, 0.999], 0.5)}
    assert floors["cosine floor"].startswith("dspark decays to 0.5 x lr")
    assert "cosine floor" not in names(peers.unmatched(published, [0.9, 0.999], 0.0))  # both go to 0
    assert "learning rate per module" not in names(peers.unmatched(published, [0.9, 0.999], 0.5, {}))
    scaled = dict(peers.unmatched(published, [0.9, 0.999], 0.5, {"markov_head": 5.0}))
    assert scaled["learning rate per module"].startswith("dspark trains its markov_head at 5 x lr")


@pytest.mark.parametrize("floor", [0.0, 0.1, 0.5, 1.0])
def test_speculators_cosine_is_given_cycles_that_end_at_the_floor(floor):
    """speculators has no floor, only transformers' cosine with a number of cycles c: written out here,
    lr / peak = 0.5 (1 + cos(2 pi c p)), it must start at 1 and end (p = 1) at dspark's floor, falling
    all the way."""
    c = peers.cosine_cycles(floor)
    curve = [0.5 * (1 + math.cos(2 * math.pi * c * p / 100)) for p in range(101)]
    assert curve[0] == pytest.approx(1.0) and curve[-1] == pytest.approx(floor, abs=1e-12)
    assert all(a >= b - 1e-12 for a, b in zip(curve, curve[1:]))
    text = dict(peers.unmatched_peer(peers.SPECULATORS, {"min_lr_ratio": floor, "speculators_cosine_cycles": c}))
    assert f"ends at {floor:g} x lr" in text["cosine floor"]
    older = dict(peers.unmatched_peer(peers.SPECULATORS, {}))  # a record from before: its cosine went to 0
    assert older["cosine floor"] == "its cosine goes to 0 (no knob); dspark's to 0.1 x lr"


def _target_states(recipe, input_ids):
    """The target's decoder-layer outputs (forward hooks: pre-final-norm also for the last layer) and its
    post-final-norm last state, for one sequence."""
    from transformers import AutoModelForCausalLM

    from dspark_cli.targets import resolve_target

    model = AutoModelForCausalLM.from_pretrained(resolve_target("tiny-gqa"), dtype=torch.float32)
    outputs = {}
    hooks = [
        layer.register_forward_hook(
            lambda _m, _i, out, k=k: outputs.__setitem__(k, (out[0] if isinstance(out, tuple) else out)[0])
        )
        for k, layer in enumerate(model.model.layers)
    ]
    with torch.no_grad():
        states = model(input_ids[None], output_hidden_states=True).hidden_states
    for hook in hooks:
        hook.remove()
    return model, outputs, states[-1][0]


@pytest.mark.slow  # a real capture (the `captured` fixture): 45 s loaded
def test_features_are_speculators_records_of_our_layers(captured, tmp_path):
    """speculators' offline layout: a datasets save_to_disk (input_ids, loss_mask, seq_len) and
    hidden_states/hs_i.safetensors (token_ids, hidden_states [T, n + 1, H]). Its layer id j is the input of
    decoder layer j (vLLM's aux-hidden-state convention): block j is the output of our layer j - 1, so the
    ids shift by one; its last slot is the verifier's last state *before* the final norm (it applies the
    verifier's norm itself), which the target's norm maps onto its post-norm state."""
    from datasets import load_from_disk
    from safetensors.torch import load_file

    from dspark_cli.capture import iter_captured
    from dspark_cli.capture.plan import resolve_layer_ids
    from dspark_cli.targets import Target

    data = peers.to_speculators(captured, tmp_path / "spec")
    layer_ids = resolve_layer_ids(captured, Target.of(captured).geometry().num_hidden_layers)
    assert data["target_layer_ids"] == [k + 1 for k in layer_ids]
    dataset = load_from_disk(str(tmp_path / "spec"))
    seqs = list(iter_captured(captured.stage_dir("capture")))
    assert len(dataset) == data["sequences"] == len(seqs) > 0
    row, seq = dataset[0], seqs[0]
    record = load_file(str(tmp_path / "spec" / "hidden_states" / "hs_0.safetensors"))
    assert torch.equal(record["token_ids"], row["input_ids"]) and torch.equal(row["input_ids"], seq.input_ids.long())
    assert torch.equal(row["loss_mask"], seq.loss_mask.long()) and int(row["seq_len"]) == seq.num_tokens
    assert 0 < int(row["loss_mask"].sum()) < seq.num_tokens  # answer tokens only, the prompt is not trained
    model, outputs, post_norm = _target_states(captured, row["input_ids"])
    n, hidden = seq.num_tokens, model.config.hidden_size
    assert record["hidden_states"].shape == (n, len(layer_ids) + 1, hidden)
    for slot, j in enumerate(data["target_layer_ids"]):  # its id j: the output of decoder layer j - 1
        torch.testing.assert_close(record["hidden_states"][:, slot], outputs[j - 1], atol=0.05, rtol=0.02)
    last = record["hidden_states"][:, -1]
    torch.testing.assert_close(last, outputs[model.config.num_hidden_layers - 1], atol=0.05, rtol=0.02)
    torch.testing.assert_close(model.model.norm(last), post_norm, atol=0.05, rtol=0.02)


@pytest.mark.slow  # a real capture (the `captured` fixture): 45 s loaded
def test_features_are_nemo_automodel_cache_of_our_layers(captured, tmp_path):
    """NeMo AutoModel's DSpark offline cache: manifest.json (complete, its fields), fixed-width shards of
    padded sequences (padding never trained), and the target's embedding and head. Its layer id k is the
    output of decoder layer k, as ours; target_last_hidden_states is post-final-norm."""
    from safetensors.torch import load_file

    from dspark_cli.capture import iter_captured
    from dspark_cli.capture.plan import resolve_layer_ids
    from dspark_cli.targets import Target, resolve_target

    data = peers.to_nemo_automodel(captured, tmp_path / "nemo", shard_size=4)
    layer_ids = resolve_layer_ids(captured, Target.of(captured).geometry().num_hidden_layers)
    manifest = json.loads((tmp_path / "nemo" / "manifest.json").read_text())
    assert manifest["complete"] is True and manifest["format_version"] == 1 and manifest["dtype"] == "fp32"
    assert manifest["target_layer_ids"] == layer_ids == data["target_layer_ids"]
    assert manifest["num_samples"] == data["sequences"] and manifest["seq_length"] == captured.train.max_seq_len
    shards = sorted((tmp_path / "nemo").glob("shard-*.safetensors"))
    assert len(shards) == -(-data["sequences"] // 4)
    shard = load_file(str(shards[0]))
    seq = next(iter(iter_captured(captured.stage_dir("capture"))))
    n, width = seq.num_tokens, manifest["seq_length"]
    assert shard["input_ids"].shape == shard["loss_mask"].shape == (min(4, data["sequences"]), width)
    assert torch.equal(shard["input_ids"][0, :n], seq.input_ids.long())
    assert torch.equal(shard["loss_mask"][0, :n], seq.loss_mask.long()) and not shard["loss_mask"][0, n:].any()
    model, outputs, post_norm = _target_states(captured, seq.input_ids.long())
    hidden = model.config.hidden_size
    assert shard["target_hidden_states"].shape == (shard["input_ids"].shape[0], width, len(layer_ids) * hidden)
    ours = torch.cat([outputs[k] for k in layer_ids], dim=-1)
    torch.testing.assert_close(shard["target_hidden_states"][0, :n], ours, atol=0.05, rtol=0.02)
    rows = seq.loss_mask.bool()
    torch.testing.assert_close(shard["target_last_hidden_states"][0, :n][rows], post_norm[rows], atol=0.05, rtol=0.02)
    weights = load_file(str(tmp_path / "nemo" / "target_weights.safetensors"))
    target = load_file(str(resolve_target("tiny-gqa") / "model.safetensors"))
    assert torch.equal(weights["embed_tokens.weight"], target["model.embed_tokens.weight"])
    assert torch.equal(weights["lm_head.weight"], target["lm_head.weight"])


SPECULATORS_CHECK = """
import json, sys, torch
from hs_connectors import FileTransfer
from pathlib import Path
from speculators.train.data import ArrowDataset
from speculators.models.dspark import DSparkDraftModel
from speculators.train.cli import create_transformer_layer_config
data, target, ids = sys.argv[1], sys.argv[2], [int(x) for x in sys.argv[3].split(",")]
item = ArrowDataset(datapath=data, max_len=2048, transfer=FileTransfer(Path(data) / "hidden_states"),
                    on_missing="raise", train_ratio=1.0, hidden_states_dtype=torch.float32)[0]
layer = create_transformer_layer_config(target, 2, "qwen3", "silu", 2048, [0, 1])
model = DSparkDraftModel.from_training_args(layer, verifier_name_or_path=target, draft_vocab_size=4096, block_size=7,
                                            target_layer_ids=ids, mask_token_id=5, markov_rank=64)
skip = set(model._keys_to_ignore_on_save) | {"t2d", "d2t", "embed_tokens.weight"}
print(json.dumps({"item": {k: [list(v.shape), float(v.float().sum())] for k, v in item.items()},
                  "names": {k: list(v.shape) for k, v in model.state_dict().items() if k not in skip}}))
"""

NEMO_CHECK = """
import json, sys, torch
from transformers import AutoConfig
from transformers.models.qwen3.configuration_qwen3 import Qwen3Config
from nemo_automodel.components.datasets.llm.dspark_cache import CachedDSparkDataset, read_manifest
from nemo_automodel.components.speculative.dspark.draft_qwen3 import Qwen3DSparkModel
from nemo_automodel.recipes.llm.train_dspark import _validate_cached_dspark_manifest
cache, target, ids = sys.argv[1], sys.argv[2], [int(x) for x in sys.argv[3].split(",")]
config = AutoConfig.from_pretrained(target)
manifest = read_manifest(cache)
_validate_cached_dspark_manifest(cache, manifest, config, ids, target_model=target, target_model_type="qwen3",
                                 seq_length=manifest["seq_length"], compute_dtype=torch.float32)
item = CachedDSparkDataset(cache)[0]
draft = config.to_dict()
draft.update(architectures=["Qwen3DSparkModel"], num_hidden_layers=2, layer_types=["full_attention"] * 2,
             max_window_layers=2, num_target_layers=config.num_hidden_layers, target_layer_ids=ids, block_size=7,
             num_anchors=32, mask_token_id=5, markov_rank=64, markov_head_type="vanilla", enable_confidence_head=True,
             confidence_head_with_markov=True, tie_word_embeddings=False)
model = Qwen3DSparkModel(Qwen3Config.from_dict(draft))
print(json.dumps({"item": {k: [list(v.shape), float(v.float().sum())] for k, v in item.items()},
                  "names": {k: list(v.shape) for k, v in model.state_dict().items()}}))
"""


def _peer_check(venv: Path, code: str, *args: str) -> dict:
    proc = subprocess.run(
        [str(venv / "bin" / "python"), "-c", code, *map(str, args)],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
        env={"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _our_names(captured) -> dict:
    from dspark_cli.capture.plan import resolve_layer_ids
    from dspark_cli.draft.model import DSparkDraftModel
    from dspark_cli.targets import Target
    from dspark_cli.training.run import build_draft_config

    ids = resolve_layer_ids(captured, Target.of(captured).geometry().num_hidden_layers)
    model = DSparkDraftModel(build_draft_config(captured, ids))
    return {k: list(v.shape) for k, v in model.state_dict().items()}


@pytest.mark.slow
@pytest.mark.skipif(
    not (peers.SPECULATORS_VENV / "bin" / "python").is_file(),
    reason="no speculators venv (bash benchmarks/peers/setup_speculators.sh)",
)
def test_speculators_reads_the_conversion_and_its_draft_is_ours(captured, tmp_path):
    """speculators' own dataset reader (ArrowDataset + FileTransfer) takes the conversion: the sample it
    hands its trainer is our sequence (the captured layers, its pre-norm last state, our loss mask), and
    its DSpark draft has our tensor names and shapes (less the verifier's frozen embedding and head)."""
    from dspark_cli.capture import iter_captured
    from dspark_cli.targets import resolve_target

    data = peers.to_speculators(captured, tmp_path / "spec")
    seq = next(iter(iter_captured(captured.stage_dir("capture"))))
    theirs = _peer_check(
        peers.SPECULATORS_VENV,
        SPECULATORS_CHECK,
        tmp_path / "spec",
        resolve_target("tiny-gqa"),
        ",".join(map(str, data["target_layer_ids"])),
    )
    item, n = theirs["item"], seq.num_tokens
    assert item["input_ids"][0] == [n] and item["input_ids"][1] == pytest.approx(float(seq.input_ids.sum()))
    assert item["loss_mask"][1] == pytest.approx(float(seq.loss_mask.sum()))
    assert item["hidden_states"][0] == [n, seq.aux_hidden.shape[-1]]
    assert item["hidden_states"][1] == pytest.approx(float(seq.aux_hidden.float().sum()), rel=1e-4, abs=1e-2)
    assert item["verifier_last_hidden_states"][0] == [n, seq.last_hidden.shape[-1]]
    assert theirs["names"] == _our_names(captured)


@pytest.mark.slow
@pytest.mark.skipif(
    not (peers.NEMO_VENV / "bin" / "python").is_file(),
    reason="no NeMo AutoModel venv (bash benchmarks/peers/setup_nemo_automodel.sh)",
)
def test_nemo_automodel_reads_the_conversion_and_its_draft_is_ours(captured, tmp_path):
    """NeMo AutoModel's own cache checks (read_manifest, the recipe's _validate_cached_dspark_manifest for
    this target and layer ids in fp32) and reader (CachedDSparkDataset) take the conversion, and its Qwen3
    DSpark draft has our tensor names and shapes plus its frozen copies of the target's embedding and head."""
    from dspark_cli.capture import iter_captured
    from dspark_cli.targets import resolve_target

    data = peers.to_nemo_automodel(captured, tmp_path / "nemo")
    seq = next(iter(iter_captured(captured.stage_dir("capture"))))
    theirs = _peer_check(
        peers.NEMO_VENV,
        NEMO_CHECK,
        tmp_path / "nemo",
        resolve_target("tiny-gqa"),
        ",".join(map(str, data["target_layer_ids"])),
    )
    item, width = theirs["item"], data["seq_length"]
    assert item["input_ids"] == [[width], pytest.approx(float(seq.input_ids.sum()))]
    assert item["loss_mask"] == [[width], pytest.approx(float(seq.loss_mask.sum()))]
    assert item["target_hidden_states"][0] == [width, seq.aux_hidden.shape[-1]]
    assert item["target_hidden_states"][1] == pytest.approx(float(seq.aux_hidden.float().sum()), rel=1e-4, abs=1e-2)
    names = dict(theirs["names"])
    assert names.pop("embed_tokens.weight") == names.pop("lm_head.weight") == [4096, 160]
    assert names == _our_names(captured)


def test_the_multi_peer_report_compares_with_the_best_of_all_peers():
    """peers-all.md: each dspark row against the best row of *any* peer at that temperature, tokens/s against
    the fastest peer, and every peer's unmatched settings and CPU changes listed."""
    trainers = ["dspark", peers.SPECFORGE, peers.SPECULATORS, peers.NEMO]
    taus = {0.0: (2.0, 1.6, 1.9, 1.5), 1.0: (2.0, 1.7, 1.6, 1.8)}
    rows = [
        {
            "trainer": t,
            "dataset": "tiny-eval",
            "temperature": temp,
            "tau": tau,
            "ci95": [tau - 0.1, tau + 0.1],
            "turns": 30,
        }
        for temp, values in taus.items()
        for t, tau in zip(trainers, values)
    ]
    training = [
        {
            "trainer": t,
            "run": 0,
            "steps": 24,
            "tokens_per_step": 2000.0,
            "tokens_per_s": speed,
            "wall_s": 60.0,
            "peak_mib": 700.0,
            "final_loss": None if t == peers.NEMO else 2.0,
        }
        for t, speed in zip(trainers, (4000.0, 800.0, 1000.0, 500.0))
    ]
    recorded = _recorded_peers()
    result = {
        **recorded,
        "steps": 24,
        "tau": rows,
        "training": training,
        "peers": trainers[1:],
        "tokens_per_s": {t["trainer"]: t["tokens_per_s"] for t in training},
        "speed_ratio": 4.0,
        "fastest_peer": peers.SPECULATORS,
        "timings": {**recorded["timings"], "convert_s": 30.0},
    }
    text = peers.markdown_all(result)
    assert "T=0.0: 2.00 vs 1.90 (speculators 0.9.0) = 1.05x -- not met" in text
    assert "T=1.0: 2.00 vs 1.80 (NeMo AutoModel 0.7.0) = 1.11x -- met" in text
    assert "tokens/s >= 1.5x the best peer: 4.00x (speculators 0.9.0) -- met" in text
    busiest = max(recorded["load_average_start"][0], recorded["load_average_end"][0])  # no samples in this result
    assert f"its 1-minute load peaking at {busiest:.2f} on 2 cores" in text
    for peer in trainers[1:]:
        assert f"\n{peer}:\n" in text or f"{peer}:" in text
    assert text.count("| trainer | dataset | temperature | tau [95% CI] | turns |") == 1
    assert "| speculators 0.9.0 | tiny-eval | 0.0 | 1.90 [1.80, 2.00] | 30 |" in text
    assert "sampled every minute" not in text  # no samples recorded: nothing said
    during = {"every_s": 60, "samples": 3, "mean": 2.5, "min": 2.1, "max": 3.2}
    sampled = peers.markdown_all({**result, "load_during": during})
    assert "mean 2.5, min 2.1, max 3.2" in sampled and f"peaking at {max(3.2, busiest):.2f} on 2 cores" in sampled
    assert "| 700 | 2.000 | - |" in text  # no load recorded for a trainer: none shown
    loaded = peers.markdown_all({**result, "training": [{**training[0], "load_mean": 3.25}, *training[1:]]})
    assert "| dspark | 0 | 24 | 2000 | 4,000 | 60 | 700 | 2.000 | 3.2 |" in loaded


def test_the_load_sampler_reads_the_load_while_it_runs(monkeypatch):
    import time

    sampler = peers.LoadSampler(every=0.01)
    time.sleep(0.1)
    summary = sampler.summary()
    assert summary["samples"] >= 2 and summary["min"] <= summary["mean"] <= summary["max"]
    # one trainer's load: the samples since it began, and one taken when it ended
    sampler.times, sampler.samples = [10.0, 20.0, 30.0], [1.0, 2.0, 4.0]
    monkeypatch.setattr(peers.os, "getloadavg", lambda: (6.0, 0.0, 0.0))
    assert sampler.mean_since(15.0) == 4.0 and sampler.mean_since(40.0) == 6.0
