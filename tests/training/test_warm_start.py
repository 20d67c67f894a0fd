"""Warm start (`train.init: pretrained`): training starts from another draft's weights.

    .venv/bin/python -m pytest tests/training/test_warm_start.py -q          # ~30 s on 2 cores (slow ones too)

On the tiny fixture target (tests/train_fixtures.py) with a random draft that `dspark export` wrote in
bf16 (tests/bench_support.py): the training module's draft at step 0 holds the source's weights cast to
fp32 (in one process, and gathered from 2 FSDP2 ranks on gloo), a published draft (the same files, no
dspark_manifest.json) starts alike, `dspark validate` refuses what cannot work in one line each, the
train manifest and the export record the source, and `--resume` of a warm-started run takes its
checkpoint's weights (the source is not read again).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import train_fixtures
from bench_support import export_random_draft
from cli_support import invoke
from safetensors.torch import load_file

from dspark_cli.training.distributed import DistEnv
from dspark_cli.training.run import recipe_draft_config
from dspark_cli.training.session import build_step_module
from dspark_cli.training.warm_start import load_warm_start

ROOT = Path(__file__).resolve().parents[2]
WARM = ("train.init=pretrained",)


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """The fixture target, its captured sequences, and a random draft for it exported in bf16 (`src`)."""
    from dspark_cli.export import export_draft

    work = tmp_path_factory.mktemp("warm")
    train_fixtures.make_target(work / "target")
    recipe = train_fixtures.tiny_recipe(work)
    export_random_draft(recipe, work / "src32", seed=3)  # also writes the training run it came from: src32-train
    export_draft(work / "src32-train", work / "src", recipe=recipe, dtype="bfloat16", force=True)
    published = work / "published"
    published.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy2(work / "src" / name, published / name)
    return work


@pytest.fixture(scope="module")
def sequences(work):
    return train_fixtures.make_sequences(work / "target", num=8)


def _start(work: Path, source: Path) -> tuple[dict[str, torch.Tensor], dict]:
    """The training module's draft state at step 0 (one process), and the init record."""
    recipe = train_fixtures.tiny_recipe(work, [*WARM, f"train.init_from={source}"])
    config = recipe_draft_config(recipe)
    warm = load_warm_start(recipe, config, work / "run" / "train")
    env = DistEnv(0, 1, 0, torch.device("cpu"))
    module = build_step_module(recipe, config, env, torch.float32, warm=warm)
    return module.draft.state_dict(), warm.record


def _equal_to_source(state: dict[str, torch.Tensor], source: Path) -> None:
    want = load_file(str(source / "model.safetensors"))
    assert sorted(state) == sorted(want)
    assert want["fc.weight"].dtype == torch.bfloat16  # export keeps the confidence head in fp32, the rest in bf16
    for name, tensor in want.items():
        assert state[name].dtype == torch.float32 and torch.equal(state[name], tensor.to(torch.float32)), name


def test_an_exported_draft_is_the_start_cast_to_the_training_dtype(work):
    state, record = _start(work, work / "src")
    _equal_to_source(state, work / "src")
    fresh = build_step_module(
        train_fixtures.tiny_recipe(work),
        recipe_draft_config(train_fixtures.tiny_recipe(work)),
        DistEnv(0, 1, 0, torch.device("cpu")),
        torch.float32,
    ).draft.state_dict()
    assert not all(torch.equal(fresh[k], state[k]) for k in state)  # not what the seed draws
    assert record["kind"] == "pretrained" and record["published"] is False
    assert (
        record["sha256"]
        == json.loads((work / "src" / "dspark_manifest.json").read_text())["files"]["model.safetensors"]
    )


def test_a_published_draft_starts_alike_and_is_left_untouched(work):
    before = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in (work / "published").iterdir()}
    state, record = _start(work, work / "published")
    _equal_to_source(state, work / "published")
    assert record["published"] is True and record["from"] == "../../published"
    assert {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in (work / "published").iterdir()} == before


@pytest.mark.slow
def test_two_fsdp2_ranks_start_from_the_source(work):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    worker = ROOT / "tests" / "training" / "warm_start_worker.py"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    out = subprocess.run(
        [*cmd, str(worker), str(work), str(work / "src")], capture_output=True, text=True, env=env, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result == {"world_size": 2, "tensors": result["tensors"], "equal": True} and result["tensors"] > 10


# -- dspark validate: one line each ----------------------------------------------------------------------------


def _validate(work: Path, *extra: str):
    return invoke("validate", "tiny", *train_fixtures.cli_overrides(work), *extra, "--stage", "train")


def _one_error(result, *needles: str) -> str:
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 2, result.output
    assert lines[0].startswith("error: ") and lines[1].startswith("hint: "), result.output
    for needle in needles:
        assert needle in lines[0], (needle, result.output)
    return lines[0]


@pytest.mark.parametrize("source", ["src", "published", "src32-train", "src32-train/final"])
def test_validate_accepts_every_kind_of_source(work, source):
    result = _validate(work, *WARM, f"train.init_from={work / source}")
    assert result.exit_code == 0, result.output


def test_validate_refuses_a_draft_of_another_geometry_naming_both_values(work):
    line = _one_error(
        _validate(work, *WARM, f"train.init_from={work / 'published'}", "draft.markov_rank=8"),
        "train.init_from",
        "draft.markov_rank 16 (recipe: 8)",
        "set those fields in the recipe as the draft has them",
    )
    assert "num_layers" not in line


def test_validate_refuses_a_draft_trained_for_another_target(work, tmp_path):
    other = tmp_path / "other-target"
    shutil.copytree(work / "target", other)
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "initializer_range": 0.1}))  # another target's config
    overrides = [o for o in train_fixtures.cli_overrides(work) if not o.startswith("target.model=")]
    result = invoke(
        "validate",
        "tiny",
        *overrides,
        f"target.model={other}",
        *WARM,
        f"train.init_from={work / 'src'}",
        "--stage",
        "train",
    )
    _one_error(result, "train.init_from", "trained for target", "not training from it")


def test_validate_refuses_init_pretrained_without_a_source_and_a_source_without_it(work):
    _one_error(_validate(work, *WARM), "train.init: pretrained", "train.init_from=DRAFT_DIR")
    _one_error(
        _validate(work, f"train.init_from={work / 'src'}"), "train.init_from: only read with train.init: pretrained"
    )


# -- the record, and resume ---------------------------------------------------------------------------------------


def _train(work: Path, sequences: list, out: Path, source: Path, *extra: str, resume: str = "auto"):
    from dspark_cli.training.run import run_train

    overrides = [*WARM, f"train.init_from={source}", f"train.output_dir={out}", "train.max_steps=4", *extra]
    return run_train(
        train_fixtures.tiny_recipe(work, ["train.checkpoint_every=2", *overrides]),
        resume=resume,
        sequences=lambda: iter(sequences),
    )


@pytest.fixture(scope="module")
def warm_run(work, sequences):
    """Four warm-started steps from a copy of the exported draft (checkpoints at steps 2 and 4)."""
    source = work / "runs" / "base"
    shutil.copytree(work / "src", source)
    _train(work, sequences, work / "runs" / "warm", source)
    return work / "runs" / "warm", source


def test_the_manifest_and_the_export_record_the_source(work, warm_run):
    from dspark_cli.export import export_draft

    out, source = warm_run
    init = json.loads((out / "manifest.json").read_text())["init"]
    digest = json.loads((source / "dspark_manifest.json").read_text())["files"]["model.safetensors"]
    assert init == {"kind": "pretrained", "from": "../base", "sha256": digest, "published": False}
    export_draft(out, work / "warm-draft", recipe=train_fixtures.tiny_recipe(work), dtype="float32", force=True)
    assert json.loads((work / "warm-draft" / "dspark_manifest.json").read_text())["init"] == init


def test_resume_of_a_warm_started_run_continues_from_its_checkpoint(work, sequences, warm_run, tmp_path):
    """Cut the run back to its step-2 checkpoint and move the source away: resume finishes with the
    uninterrupted run's weights, having read only the checkpoint."""
    out, source = warm_run
    cut = tmp_path / "warm"
    shutil.copytree(out, cut, ignore=shutil.ignore_patterns("step-000004"))
    shutil.rmtree(cut / "final")
    (cut / "manifest.json").unlink()
    (cut / "checkpoints" / "latest").write_text("step-000002")
    hidden = source.with_name("base-hidden")
    source.rename(hidden)
    try:
        summary = _train(work, sequences, cut, source)
    finally:
        hidden.rename(source)
    assert summary.resumed_from and summary.resumed_from.endswith("step-000002") and summary.steps == 4
    final, resumed = (
        load_file(str(out / "final" / "model.safetensors")),
        load_file(str(cut / "final" / "model.safetensors")),
    )
    assert all(torch.equal(final[k], resumed[k]) for k in final)
    assert (
        json.loads((cut / "manifest.json").read_text())["init"]
        == json.loads((out / "manifest.json").read_text())["init"]
    )
