"""Hostile recipes: values that passed `dspark validate` and then failed late, or did something else than
written. Each is one `error:` line naming the key, the bound and the fix (and a `hint:`), before any work.

    .venv/bin/python -m pytest tests/cli/test_hostile_recipes.py -q      # the capture cases run a tiny datagen

- a key written twice in a recipe (`train:` twice, `lr:` twice in a section) kept the last value silently;
- `train.lr_scale` names below the top-level module (`layers.99` on a 2-layer draft) were found by training;
- `capture.workers` had no bound: 1,000 engines on a 2-core machine, 6 workers for a 2-shard plan.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
from capture_support import DATAGEN_OVERRIDES, capture_recipe
from cli_support import assert_user_error, invoke

# --- duplicate keys ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "key", "lines"),
    [
        ("name: dup\ntrain:\n  lr: 1.0e-4\n  lr: 2.0e-4\n", "duplicate key train.lr", "lines 3 and 4"),
        ("name: dup\ntrain: {lr: 1.0e-4}\nbench: {}\ntrain: {lr: 2.0e-4}\n", "duplicate key train ", "lines 2 and 4"),
        (
            "name: dup\ndatagen:\n  sources:\n    - {path: a.jsonl, path: b.jsonl}\n",
            "datagen.sources[0].path",
            "line 4",
        ),
    ],
    ids=["lr-twice-in-a-section", "a-section-twice", "in-a-list"],
)
def test_a_key_written_twice_is_refused_naming_both_lines(tmp_path, text, key, lines):
    recipe = tmp_path / "dup.yaml"
    recipe.write_text(text)
    result = invoke("validate", str(recipe), "--recipe-only")
    assert_user_error(result, f"{recipe}:", key, lines)
    assert "keep one" in result.output.splitlines()[1]


def test_a_key_written_twice_in_an_override_or_a_drafts_recipe_is_refused(tmp_path):
    result = invoke("validate", "tiny", "--recipe-only", "train.lr_scale={markov_head: 2, markov_head: 3}")
    assert_user_error(result, "override train.lr_scale", "duplicate key markov_head", "twice on line 1")
    draft = tmp_path / "draft"
    draft.mkdir()
    (draft / "recipe.yaml").write_text("name: d\ndraft: {num_layers: 2}\ndraft: {num_layers: 3}\n")
    (draft / "dspark_manifest.json").write_text("{}")
    result = invoke("bench", str(draft), "--offline")
    assert_user_error(result, "recipe.yaml:3", "duplicate key draft", "lines 2 and 3")


def test_yaml_merge_keys_and_one_anchor_used_twice_are_not_duplicates(tmp_path):
    from dspark_cli.recipe.bounded import parse_yaml

    text = "base: &b {lr: 1, seed: 2}\ntrain:\n  <<: *b\n  lr: 3\nother: *b\n"
    assert parse_yaml(text, "t.yaml") == {
        "base": {"lr": 1, "seed": 2},
        "train": {"lr": 3, "seed": 2},
        "other": {"lr": 1, "seed": 2},
    }


# --- train.lr_scale names resolved against the draft --------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "nearest"),
    [
        ("layers.99", "did you mean layers.1, layers.0"),  # the tiny draft has 2 layers
        ("layers.0.mlpp", "did you mean layers.0.mlp"),
        ("layers.1.self_attn.q_proj", "layers.1.self_attn.q_b_proj"),  # an MLA draft has q_a / q_b
        ("markov_head.w2", "markov_head.markov_w2"),
        ("markov_hed", "did you mean markov_head"),
    ],
)
def test_an_lr_scale_name_the_draft_does_not_have_is_refused(name, nearest):
    result = invoke("validate", "tiny", "--recipe-only", f"train.lr_scale={{{name}: 2.0}}")
    assert_user_error(result, f"train.lr_scale: {name} is not a module of this mla draft", nearest)
    assert "name one of context_proj, context_norm, layers, final_norm, markov_head" in result.output


def test_lr_scale_names_the_draft_has_pass():
    names = "{markov_head: 5, layers.1: 2, layers.0.mlp: 0.5, layers.0.self_attn.q_b_proj: 2, confidence_head: 1}"
    result = invoke("validate", "tiny", "--recipe-only", f"train.lr_scale={names}")
    assert result.exit_code == 0, result.output


def test_validate_resolves_lr_scale_as_training_does():
    """Every module name of the draft training builds passes the preflight, and `lr_groups` takes it."""
    from dspark_cli.preflight.shared import _check_lr_scale, _draft_module_names
    from dspark_cli.recipe import load_recipe
    from dspark_cli.training.session import lr_groups

    recipe = load_recipe("tiny")
    names = _draft_module_names(recipe)
    assert names is not None and "layers.1.mlp.down_proj" in names and "layers.2" not in names
    from dspark_cli.draft.model import meta_model
    from dspark_cli.training.run import build_draft_config

    draft = meta_model(build_draft_config(recipe, [0, 2]))
    for name in names:
        assert lr_groups(draft, {name: 2.0})
        train = recipe.train.model_copy(update={"lr_scale": {name: 2.0}})
        assert _check_lr_scale(recipe.model_copy(update={"train": train})) == []


# --- capture.workers: bounded by the machine and by the plan -------------------------------------------------


def test_more_capture_workers_than_this_machine_has_cores_is_one_line():
    cores = len(os.sched_getaffinity(0))
    result = invoke("validate", "tiny", "capture.workers=1000")
    assert_user_error(
        result,
        f"capture.workers: 1,000 capture engines on this machine without a GPU, which has {cores} CPU core(s)",
        f"set capture.workers<={cores}",
    )
    assert invoke("validate", "tiny", "capture.workers=1000", "--recipe-only").exit_code == 0  # this machine's bound
    assert invoke("validate", "tiny", f"capture.workers={cores}").exit_code == 0


def test_capture_workers_on_gpu_machines_described():
    """GPU engines: one group of engine-size devices each (the machine is described: this one has no GPU)."""
    from dspark_cli.preflight import Machine, preflight
    from dspark_cli.recipe import load_recipe

    def problems(*overrides: str, gpus: int = 4) -> list[str]:
        recipe = load_recipe("tiny", [*overrides])
        found = preflight(recipe, ["capture"], machine=Machine(gpus=gpus, installed={"vllm"}))
        return [p for p in found if p.startswith("capture.workers")]

    assert problems("capture.workers=6", "capture.backend=hf") == [
        "capture.workers: 6 engines x 1 GPU(s) each (engine tensor parallelism) need 6 GPUs, 4 visible here; "
        "set capture.workers<=4"
    ]
    assert problems("capture.workers=3", "capture.backend=vllm", "datagen.tensor_parallel_size=2") == [
        "capture.workers: 3 engines x 2 GPU(s) each (engine tensor parallelism) need 6 GPUs, 4 visible here; "
        "set capture.workers<=2"
    ]
    assert problems("capture.workers=2", "capture.devices=[0]", "capture.backend=hf") == [
        "capture.workers: 2 engines x 1 GPU(s) each (engine tensor parallelism) need 2 GPUs, 1 in capture.devices; "
        "set capture.workers<=1"
    ]
    assert problems("capture.workers=4", "capture.backend=hf") == []
    # online: the producer / trainer device split judges local producers; external ones are not this machine's
    online = ("capture.mode=online", "capture.workers=4", "capture.backend=vllm", "datagen.tensor_parallel_size=8")
    assert problems(*online, "capture.external_producers=true", gpus=8) == []
    # the Kimi-K3 template's four TP8 producers on inference machines pass on the training machine
    k3 = load_recipe("kimi-k3")
    assert [p for p in preflight(k3, ["capture"], machine=Machine(gpus=8, installed={"vllm"})) if "workers" in p] == []


@pytest.mark.slow  # the tiny datagen the capture tests share: ~10 s on 2 cores, once per session
def test_more_capture_workers_than_the_plan_has_shards_is_one_line(tmp_path):
    recipe = capture_recipe("tiny-mla", tmp_path, "capture.workers=2")  # the tiny shard_tokens: one shard
    args = ["target.model=tiny-mla", f"output_dir={tmp_path / 'run'}", *DATAGEN_OVERRIDES]
    result = invoke("validate", "tiny", *args, "capture.workers=2", "--stage=capture", "--recipe-only")
    assert_user_error(
        result,
        "capture.workers: 2 workers but the capture plan has 1 shard",
        "tokens at capture.shard_tokens=",
        "set capture.workers<=1, or lower capture.shard_tokens for more shards",
    )
    assert recipe.capture.workers == 2
    passes = invoke("validate", "tiny", *args, "capture.shard_tokens=150", "capture.workers=2", "--stage=capture")
    assert passes.exit_code == 0, passes.output


@pytest.mark.slow  # a capture by worker processes, each loading the tiny target: ~20 s on 2 cores
def test_a_capture_starts_at_most_one_worker_per_shard(tmp_path, caplog):
    """6 workers for a plan of fewer shards started 6 processes; now one per shard, with a warning."""
    from dspark_cli.capture import build_plan, run_capture

    recipe = capture_recipe("tiny-mla", tmp_path, "capture.shard_tokens=150", "capture.workers=6")
    shards = len(build_plan(recipe).shards)
    assert 1 < shards < 6
    with caplog.at_level(logging.WARNING, logger="dspark_cli.capture.run"):
        summary = run_capture(recipe)
    assert summary.workers == shards and summary.shards == shards
    assert f"capture.workers: 6 workers but the capture plan has {shards} shards" in caplog.text
    assert f"starting {shards}" in caplog.text
    manifest = Path(recipe.stage_dir("capture")) / "manifest.json"
    assert '"complete": true' in manifest.read_text()
