"""Ctrl-C in an online run, then the same command again: the run resumes and ends bit for bit as if never stopped.

    .venv/bin/python -m pytest tests/training/test_train_interrupt.py -q -x

A terminal's Ctrl-C is SIGINT to the foreground process group: here `dspark train` runs as the leader of its
own group (with its torchrun, and the producers a single process starts) and the test signals that group.
The interrupted command must end with exit 130 and one line saying how to resume, leave nothing in the
stream that the next run reads as a failure, and the same command (`--resume auto`, the default) must reach
the uninterrupted run's final weights (test_train_stream.py's `uninterrupted`: 2 producers, 2 ranks), tensor
for tensor with `torch.equal`. Three points: while the producers warm up (before the first step), between
the first step and the first checkpoint, and after a checkpoint. The subprocesses run the dspark_cli this
module imported (PYTHONPATH), so the same file runs against another checkout.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

import test_train_stream as stream

import dspark_cli

pytestmark = stream.pytestmark  # slow: each test runs `dspark train` twice
datagen = stream.datagen  # the module's fixtures, shared with the stream tests' helpers
uninterrupted = stream.uninterrupted
CODE = Path(dspark_cli.__file__).resolve().parents[1]  # the checkout under test
RESUME_LINE = "interrupted; run the same command again to resume"


def env() -> dict[str, str]:
    return {**stream.env(), "PYTHONPATH": str(CODE)}


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def started_pids(run_dir: Path) -> set[int]:
    """Every rank (stream-ids logs) and producer (their status) the run started."""
    pids = {pid for rows in stream.step_logs(run_dir / "train").values() for pid, _, _ in rows}
    for status in (run_dir / "hidden-stream" / "producers").glob("*.json"):
        pids.add(json.loads(status.read_text())["producer"]["pid"])
    return pids


def interrupt(cmd: list[str], ready, what: str) -> str:
    """Start `cmd` as its own process group, Ctrl-C it (SIGINT to the group) once `ready()`; its output.
    The command must end by itself with exit 130 and the resume line, every process it started gone."""
    proc = subprocess.Popen(
        cmd, cwd=CODE, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    try:

        def at_point() -> bool:
            assert proc.poll() is None, f"dspark train ended (exit {proc.returncode}) before {what}:\n" + "".join(
                lines[-40:]
            )
            return ready()

        stream.wait_for(at_point, what=what, poll_s=0.005)
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    reader.join(timeout=10)
    out = "".join(lines)
    assert proc.returncode == 130, out[-4000:]
    assert RESUME_LINE in out, out[-4000:]
    return out


def assert_nothing_failed(run_dir: Path) -> None:
    """The interrupted run left every process gone and no producer recorded as failed."""
    deadline = time.monotonic() + 10
    while (left := {pid for pid in started_pids(run_dir) if alive(pid)}) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"processes of the interrupted run still alive: {left}"
    for status in (run_dir / "hidden-stream" / "producers").glob("*.json"):
        assert not json.loads(status.read_text()).get("error"), status.read_text()


def rows(path: Path) -> int:
    try:
        return len(path.read_text().splitlines())
    except FileNotFoundError:
        return 0


def interrupted_then_resumed(datagen, tmp_path: Path, ready_at, what: str, *extra: str) -> dict:
    """The 2-producer, 2-rank run Ctrl-C'd where `ready_at(run_dir)` says, then the same command again;
    checks what both must show and returns the resumed run's summary."""
    overrides = stream.overrides_for(datagen, tmp_path, "train.nproc_per_node=2", *extra)
    run_dir = tmp_path / "run"
    cmd = [str(stream.BIN / "dspark"), "train", "tiny", *overrides]
    interrupt(cmd, lambda: ready_at(run_dir), what)
    assert_nothing_failed(run_dir)
    again = subprocess.run(
        cmd, cwd=CODE, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=400
    )  # the same command: --resume auto is the default
    assert again.returncode == 0, again.stdout[-4000:]
    train_dir = run_dir / "train"
    summary = json.loads((train_dir / "manifest.json").read_text())["summary"]
    ids, _ = stream.trained_ids(train_dir, summary["num_steps"], 2)
    assert ids == Counter(stream.planned_ids(overrides))  # each sample once in the final draft
    assert summary["stream"]["peak_shards"] <= stream.MAX_SHARDS
    return summary


def test_ctrl_c_while_the_producers_warm_up_then_the_same_command_trains_the_same_weights(
    datagen, uninterrupted, tmp_path
):
    """Ctrl-C once producer 0 has opened the stream (its engine loading) and before any step was drawn."""

    def warming_up(run_dir: Path) -> bool:
        try:
            status = json.loads((run_dir / "hidden-stream" / "producers" / "0.json").read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return False
        return not status["shards"] and rows(run_dir / "train" / "stream-ids" / "rank-0.jsonl") == 0

    summary = interrupted_then_resumed(datagen, tmp_path, warming_up, "the producers' warm-up")
    assert summary["resumed_from"] is None
    stream.assert_same_weights(tmp_path / "run" / "train", uninterrupted[1])


def test_ctrl_c_before_the_first_checkpoint_then_the_same_command_trains_the_same_weights(
    datagen, uninterrupted, tmp_path
):
    """Ctrl-C once rank 0 drew its first step, with no checkpoint yet (train.checkpoint_every=4): the
    resumed run starts over and rewinds the stream to shard 0."""

    def first_step(run_dir: Path) -> bool:
        return rows(run_dir / "train" / "stream-ids" / "rank-0.jsonl") >= 1

    summary = interrupted_then_resumed(datagen, tmp_path, first_step, "the first step", "train.checkpoint_every=4")
    assert summary["resumed_from"] is None, "the interrupt came after the first checkpoint"
    stream.assert_same_weights(tmp_path / "run" / "train", uninterrupted[1])


def test_ctrl_c_after_a_checkpoint_then_the_same_command_resumes_from_it_with_the_same_weights(
    datagen, uninterrupted, tmp_path
):
    """Ctrl-C once the checkpoint at step 2 is in place and rank 0 has released a shard it does not cover
    (as it draws step 4): the resumed run continues from that checkpoint and the stream position it
    recorded, so it rewinds the stream and the producers capture that shard again."""
    from dspark_cli.capture import build_plan
    from dspark_cli.recipe import load_recipe
    from dspark_cli.training.stream_source import plan_online

    recipe = load_recipe("tiny", stream.overrides_for(datagen, tmp_path / "plan", "train.nproc_per_node=2"))
    train = recipe.train
    plan = plan_online(
        build_plan(recipe),
        max_seq_len=train.max_seq_len,
        tokens_per_step=train.tokens_per_step,
        world_size=2,
        seed=train.seed,
    )
    covered = plan.release_below(2)
    assert plan.release_below(3) > covered and len(plan.steps) >= 4  # the data gives a rewind to test

    def released_past_the_checkpoint(run_dir: Path) -> bool:
        try:
            consumer = json.loads((run_dir / "hidden-stream" / "consumer.json").read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return False
        return (run_dir / "train" / "checkpoints" / "latest").is_file() and consumer["released_below"] > covered

    summary = interrupted_then_resumed(
        datagen, tmp_path, released_past_the_checkpoint, "a release past the checkpoint at step 2"
    )
    assert summary["resumed_from"].endswith("step-000002") and summary["stream"]["rewinds"] == 1
    stream.assert_same_weights(tmp_path / "run" / "train", uninterrupted[1])


def test_ctrl_c_of_a_single_process_run_stops_its_producers_without_a_failure(datagen, tmp_path):
    """`dspark train` in one process (the default) starts its producers in its own process group, so the
    terminal's SIGINT reaches them too: they stop cleanly (no failure recorded in the stream) and the same
    command resumes and trains every sample once (its weights are not the 2-rank reference's: one rank sums
    the gradient in another order)."""
    overrides = stream.overrides_for(datagen, tmp_path, "train.checkpoint_every=4")
    run_dir = tmp_path / "run"
    cmd = [str(stream.BIN / "dspark"), "train", "tiny", *overrides]

    def first_step() -> bool:
        return rows(run_dir / "train" / "stream-ids" / "rank-0.jsonl") >= 1

    interrupt(cmd, first_step, "the first step")
    assert_nothing_failed(run_dir)
    # and a stream where an earlier run did record a producer's failure (what a Ctrl-C left before, when the
    # producer's KeyboardInterrupt was written as its error): the run restarts that producer, so the old
    # error does not fail it before the producer is back
    status = run_dir / "hidden-stream" / "producers" / "0.json"
    status.write_text(json.dumps({**json.loads(status.read_text()), "error": "KeyboardInterrupt"}))
    again = subprocess.run(
        cmd, cwd=CODE, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=400
    )
    assert again.returncode == 0, again.stdout[-4000:]
    summary = json.loads((run_dir / "train" / "manifest.json").read_text())["summary"]
    ids, _ = stream.trained_ids(run_dir / "train", summary["num_steps"], 4)
    assert ids == Counter(stream.planned_ids(overrides))
