"""Validation during training: the logged curve, the best draft, early stopping, resume, 1 vs 2 ranks.

    .venv/bin/python -m pytest tests/training/test_validation.py -q       # ~1 min on 2 cores

Runs train the train_fixtures draft on 16 sequences of the tiny random Qwen3 target and validate on 7
others of mixed lengths (`run_train(validation=...)`, what capture's `<capture dir>/validation/` gives a
recipe run). Numbers are checked against `evaluate_draft` run apart on the weights written to disk.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import train_fixtures
from cli_support import invoke

ROOT = Path(__file__).resolve().parents[2]
WORKER = str(ROOT / "tests" / "training" / "validation_worker.py")
# learning rate 1.0, chosen on greedy tau: a curve that peaks at step 14 of 16 (1.00 1.00 1.35 1.81 2.42 2.21 2.93 2.67)
ERRATIC = ("train.max_steps=16", "train.validate_every=2", "train.lr=1.0", "train.validation_metric=tau_greedy")


slow = pytest.mark.slow  # whole training runs (the data fixture alone: ~20 s of generation on 2 cores)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """(target root, training sequences, validation sequences): the worker's data, made once."""
    root = tmp_path_factory.mktemp("validation-target")
    target = train_fixtures.make_target(root / "target")
    return (
        root,
        train_fixtures.make_sequences(target, num=16, seed=0),
        train_fixtures.make_sequences(target, num=7, seed=1, vary=True),
    )


def _workdir(data, tmp_path: Path, name: str) -> Path:
    work = tmp_path / name
    work.mkdir()
    (work / "target").symlink_to(data[0] / "target")
    return work


class Interrupt(Exception):
    """Raised from on_log to end a run at a step, as a crash would (checkpoints stay as written)."""


def _train(data, work: Path, *overrides: str, stop_at: int | None = None, validation: bool = True):
    """Train in this process; (summary or None when interrupted at `stop_at`, the records logged)."""
    from dspark_cli.training.run import run_train

    torch.set_num_threads(1)
    records: list[dict] = []

    def on_log(record: dict) -> None:
        records.append(record)
        if stop_at is not None and record["step"] == stop_at and record.get("kind") != "validation":
            raise Interrupt

    recipe = train_fixtures.tiny_recipe(work, list(overrides))
    try:
        summary = run_train(
            recipe,
            resume="auto",
            sequences=lambda: iter(data[1]),
            validation=(lambda: data[2]) if validation else None,
            on_log=on_log,
        )
    except Interrupt:
        return None, records
    return summary, records


def _curve(work: Path) -> list[dict]:
    from dspark_cli.training.metrics import read_metrics

    return [r for r in read_metrics(work / "run" / "train" / "metrics.jsonl") if r.get("kind") == "validation"]


def _manifest(work: Path) -> dict:
    return json.loads((work / "run" / "train" / "manifest.json").read_text())


def _close(a: float, b: float, rel: float = 1e-5) -> bool:
    return math.isclose(a, b, rel_tol=rel, abs_tol=rel)


def _evaluate(directory: Path, held_out: list, work: Path) -> dict:
    """`evaluate_draft` on the draft at `directory` (best/ or final/), outside training: no FSDP2, no loop."""
    from dspark_cli.artifacts.draft import build_model, load_draft_dir
    from dspark_cli.targets import Target
    from dspark_cli.training.evaluate import evaluate_draft

    loaded = load_draft_dir(directory)
    model = build_model(loaded.config, loaded.state_dict)
    model.set_target_embeddings(*Target.named(str(work / "target")).embeddings())
    return evaluate_draft(model, held_out, max_seq_len=train_fixtures.LENGTH, batch_size=3)


@slow
def test_best_is_the_argmax_of_the_logged_curve_and_its_numbers_are_evaluate_drafts(data, tmp_path):
    work = _workdir(data, tmp_path, "w")
    # a learning rate far too high: the greedy validation curve jumps up and down (peak at step 14)
    summary, records = _train(data, work, *ERRATIC, "train.log_every=4")
    curve = _curve(work)
    assert [r["step"] for r in curve] == list(range(2, 17, 2))
    assert curve == [r for r in records if r.get("kind") == "validation"]  # what was shown is what was logged
    values = [r["tau_greedy"] for r in curve]
    argmax = curve[values.index(max(values))]["step"]  # the first maximum
    best = {"step": argmax, "metric": "tau_greedy", "value": max(values)}
    assert summary.best == _manifest(work)["best"] == best
    assert argmax not in (2, 16), values  # neither the first nor the last: the choice is a real one
    train_dir = work / "run" / "train"
    assert json.loads((train_dir / "best" / "validation.json").read_text()) == best
    assert "best/model.safetensors" in _manifest(work)["files"]
    # the logged numbers are evaluate_draft's on the weights written, sequence for sequence
    for directory, record in ((train_dir / "best", curve[values.index(max(values))]), (train_dir / "final", curve[-1])):
        alone = _evaluate(directory, data[2], work)
        assert record["sequences"] == alone["sequences"] == 7
        assert _close(record["tau_greedy"], alone["tau_greedy_decode"]), (record, alone)
        assert _close(record["tau_t1"], alone["tau_t1_decode"]), (record, alone)
        assert _close(record["tau_t1_anchors"], alone["tau_t1"])
        for a, b in zip(
            record["accept_t1_slot"] + record["accept_greedy_slot"],
            alone["accept_t1_slot"] + alone["accept_greedy_slot"],
            strict=True,
        ):
            assert _close(a, b), (record, alone)
    assert record["tokens"] == sum(int(s.input_ids.shape[0]) for s in data[2])
    # export takes best/ by default and says which step it is
    from dspark_cli.export.writer import export_draft

    exported = export_draft(train_dir, tmp_path / "draft", dtype="float32")
    assert exported.selected == {"checkpoint": "best", **best}
    assert json.loads((tmp_path / "draft" / "dspark_manifest.json").read_text())["selected"]["step"] == argmax


@slow
def test_early_stop_after_exactly_the_patience_then_resume_trains_no_further(data, tmp_path):
    work = _workdir(data, tmp_path, "w")
    # a min delta nothing reaches: only the first validation improves, so the run stops at the third after it
    stop = (
        "train.max_steps=16",
        "train.validate_every=2",
        "train.early_stop_patience=3",
        "train.validation_min_delta=100",
    )
    summary, records = _train(data, work, *stop)
    assert [r["step"] for r in _curve(work)] == [2, 4, 6, 8]
    assert summary.steps == 8 and summary.stopped == {"reason": "early", "step": 8}
    manifest = _manifest(work)
    assert manifest["stopped"] == {"reason": "early", "step": 8} and manifest["best"]["step"] == 2
    assert max(r["step"] for r in records) == 8
    train_dir = work / "run" / "train"
    assert (train_dir / "checkpoints" / "latest").read_text().strip() == "step-000008"
    assert (train_dir / "final" / "model.safetensors").is_file()
    again, more = _train(data, work, *stop)  # the run ended: resuming it trains nothing more
    assert again.steps == 8 and again.stopped == {"reason": "early", "step": 8} and more == []


@slow
@pytest.mark.parametrize(
    ("settings", "stop_at"),
    [
        # killed at step 15: checkpoint 12 holds the state, the best (validation 14) is lost from it while
        # best/ on disk holds it; the resumed run validates step 14 again
        (ERRATIC, 15),
        # killed at step 7: checkpoint 4 holds one validation without improvement, the resumed run two more
        (
            (
                "train.max_steps=16",
                "train.validate_every=2",
                "train.early_stop_patience=3",
                "train.validation_min_delta=100",
            ),
            7,
        ),
    ],
    ids=["best", "patience"],
)
def test_a_resumed_run_picks_the_best_of_an_uninterrupted_one(data, tmp_path, settings, stop_at):
    from safetensors.torch import load_file

    common = (*settings, "train.checkpoint_every=4")
    whole, _ = _train(data, _workdir(data, tmp_path, "whole"), *common)
    work = _workdir(data, tmp_path, "resumed")
    interrupted, _ = _train(data, work, *common, stop_at=stop_at)
    assert interrupted is None
    resumed, _ = _train(data, work, *common)
    assert resumed.resumed_from.endswith(f"step-{stop_at // 4 * 4:06d}")
    assert resumed.best == whole.best and resumed.stopped == whole.stopped and resumed.steps == whole.steps
    assert [(r["step"], r["tau_t1"]) for r in _curve(work)] == [
        (r["step"], r["tau_t1"]) for r in _curve(tmp_path / "whole")
    ]
    best_whole = load_file(str(tmp_path / "whole" / "run" / "train" / "best" / "model.safetensors"))
    best_resumed = load_file(str(work / "run" / "train" / "best" / "model.safetensors"))
    assert all(torch.equal(best_whole[k], best_resumed[k]) for k in best_whole)


@slow
def test_without_a_validation_split_training_runs_as_before(data, tmp_path, caplog):
    work = _workdir(data, tmp_path, "w")
    with caplog.at_level("INFO", logger="dspark_cli.training.validation"):
        summary, records = _train(data, work, "train.max_steps=4", "train.early_stop_patience=1", validation=False)
    assert summary.steps == 4 and summary.best is None and summary.stopped is None
    assert not any(r.get("kind") == "validation" for r in records)
    assert not (work / "run" / "train" / "best").exists() and _manifest(work)["best"] is None
    assert [r.message for r in caplog.records if "validation" in r.message] == [
        "no validation split: training without validation (train.keep_best and early stop do nothing)"
    ]


def test_early_stop_without_a_split_is_one_line_at_validate_time(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = invoke(
        "validate",
        "tiny",
        f"output_dir={tmp_path / 'run'}",
        "datagen.validation_fraction=0",
        "train.early_stop_patience=2",
        "--stage=train",
    )
    assert result.exit_code == 2, result.output
    assert "error: train.early_stop_patience: set, but datagen.validation_fraction is 0" in result.output
    assert not (tmp_path / "run").exists()


def _run_worker(work: Path, *args: str, nproc: int) -> tuple[list[dict], dict]:
    cmd = [sys.executable, WORKER, str(work), *args]
    if nproc > 1:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", *cmd[1:]]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    return [x for x in lines if x.get("kind") == "validation"], next(x["summary"] for x in lines if "summary" in x)


@pytest.mark.slow
def test_two_fsdp2_processes_validate_as_one(data, tmp_path):
    # 7 held-out sequences of mixed lengths: rank 0 scores 4 in 4 forwards, rank 1 3 and one empty forward
    args = ("train.max_steps=8", "train.validate_every=3", "train.log_every=4")
    one, summary_one = _run_worker(_workdir(data, tmp_path, "one"), *args, nproc=1)
    two, summary_two = _run_worker(_workdir(data, tmp_path, "two"), *args, nproc=2)
    assert summary_two["world_size"] == 2
    assert [r["step"] for r in one] == [r["step"] for r in two] == [3, 6, 8]
    # both train the same weights up to fp32 summation order (test_train_runs.py: ~1e-7 relative), and sum the
    # validation over other shares of the sequences
    for a, b in zip(one, two, strict=True):
        assert (a["sequences"], a["tokens"], a["anchors"]) == (b["sequences"], b["tokens"], b["anchors"])
        for key in ("tau_greedy", "tau_t1", "tau_greedy_anchors", "tau_t1_anchors", "loss"):
            assert _close(a[key], b[key]), (key, a, b)
        for x, y in zip(
            a["accept_t1_slot"] + a["accept_greedy_slot"], b["accept_t1_slot"] + b["accept_greedy_slot"], strict=True
        ):
            assert _close(x, y), (a, b)
    assert summary_one["best"]["step"] == summary_two["best"]["step"]
