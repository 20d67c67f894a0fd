"""`dspark train` from the command line: the dry-run plan, torchrun relaunch with --nproc, errors.

    .venv/bin/python -m pytest tests/training/test_train_cli.py -q        # ~40 s on 2 cores

The capture output is written with capture's own shard writer from the fixture target's sequences
(tests/train_fixtures.py), so the command reads exactly what `dspark train` reads after capture.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import train_fixtures
from procs_support import descendants, hold_lock, wait_gone

pytestmark = pytest.mark.slow  # every test uses the module's capture and runs `dspark train` (~40 s on 2 quiet cores)

ROOT = Path(__file__).resolve().parents[2]
DSPARK = str(Path(sys.executable).with_name("dspark"))


def _overrides(work: Path) -> list[str]:
    return [
        f"target.model={work / 'target'}",
        "target.dtype=float32",
        f"output_dir={work / 'run'}",
        "draft.arch=gqa",
        "draft.num_layers=2",
        "draft.block_size=4",
        "draft.markov_rank=16",
        f"draft.mask_token_id={train_fixtures.VOCAB - 1}",
        "draft.target_layer_ids=[0, 2]",
        "train.num_anchors=12",
        "train.max_seq_len=64",
        "train.tokens_per_step=256",
        "train.epochs=2.0",
        "train.max_steps=null",
        "train.warmup_steps=1",
        "train.log_every=2",
        "train.checkpoint_every=4",
        "capture.max_seq_len=64",
    ]


@pytest.fixture(scope="module")
def captured(tmp_path_factory):
    """A complete capture directory for the fixture target, as capture writes it."""
    from dspark_cli.artifacts.files import write_json_atomic
    from dspark_cli.capture.plan import contract_for_recipe
    from dspark_cli.capture.shards import shard_name, write_shard
    from dspark_cli.recipe import load_recipe

    work = tmp_path_factory.mktemp("train-cli")
    train_fixtures.make_target(work / "target")
    sequences = train_fixtures.make_sequences(work / "target", num=10)
    recipe = load_recipe("tiny", _overrides(work))
    out = Path(recipe.stage_dir("capture"))
    out.mkdir(parents=True)
    layer_ids = train_fixtures.LAYER_IDS
    shards = [
        write_shard(
            out / shard_name(i), sequences[i * 5 : (i + 1) * 5], layer_ids=layer_ids, hidden_size=train_fixtures.HIDDEN
        )
        for i in range(2)
    ]
    write_json_atomic(
        out / "manifest.json",
        {
            "kind": "dspark.capture",
            "format_version": 1,
            "complete": True,
            "contract": contract_for_recipe(recipe).to_dict(),
            "layout": {"target_layer_ids": layer_ids, "hidden_size": train_fixtures.HIDDEN},
            "shards": shards,
        },
    )
    return work


def _dspark(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", "COLUMNS": "200"}
    return subprocess.run([DSPARK, *args], capture_output=True, text=True, env=env, timeout=timeout, cwd=ROOT)


def test_dry_run_prints_the_exact_plan_and_writes_nothing(captured):
    out = _dspark("train", "tiny", *_overrides(captured), "--dry-run")
    assert out.returncode == 0, out.stderr
    assert "train plan (exact; nothing written)" in out.stdout
    # 10 sequences of 64 tokens, 4 per step, 2 epochs: 20 sequences -> 5 steps
    table = {
        cells[0]: cells[1]
        for line in out.stdout.splitlines()
        if len(cells := [c.strip() for c in line.strip("│ ").split("│")]) == 2
    }
    assert table["steps"] == "5" and table["sequences per epoch"] == "10" and table["processes"] == "1"
    assert table["tokens per step (all ranks)"] == "256"
    assert not (captured / "run" / "train").exists()


def test_nproc_2_relaunches_under_torchrun_and_trains(captured, tmp_path):
    out = _dspark("train", "tiny", *_overrides(captured), "--nproc", "2")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "launching 2 x 1 processes" in out.stdout
    assert out.stdout.count("train: 5 steps") == 1  # rank 0 alone reports
    train_dir = captured / "run" / "train"
    manifest = json.loads((train_dir / "manifest.json").read_text())
    assert manifest["summary"]["world_size"] == 2 and manifest["summary"]["steps"] == 5
    lines = [json.loads(line) for line in (train_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == [2, 4, 5]
    (tmp_path / "plain").touch()  # the mode open() gives under this umask; safetensors alone would give 0600
    assert (train_dir / "final" / "model.safetensors").stat().st_mode == (tmp_path / "plain").stat().st_mode

    again = _dspark("train", "tiny", *_overrides(captured), "--resume", "never")
    assert again.returncode == 2 and "already holds checkpoints" in again.stderr
    assert len(again.stderr.strip().splitlines()) == 2  # one error line, one hint


def test_resume_from_a_bad_path_is_one_line(captured, tmp_path):
    out = _dspark("train", "tiny", *_overrides(captured), "-o", str(tmp_path / "t"), "--resume", str(tmp_path))
    assert out.returncode == 2
    assert "not a complete dspark checkpoint" in out.stderr and len(out.stderr.strip().splitlines()) == 2


def test_a_rank_reports_its_failure_as_the_cli_does(captured, tmp_path):
    """What torchrun's children run (`-m dspark_cli.training`) says what is wrong in one line and a hint,
    with the CLI's exit codes, never a traceback: the launcher's output carries the rank's own reason."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    rank = [sys.executable, "-m", "dspark_cli.training", "tiny"]
    bad = subprocess.run([*rank, "train.lr=-1"], capture_output=True, text=True, env=env, timeout=120, cwd=ROOT)
    assert bad.returncode == 2 and bad.stderr.splitlines()[0] == "error: train.lr: must be greater than 0 (got -1)"
    resume = subprocess.run(
        [*rank, *_overrides(captured), f"--resume={tmp_path}", f"train.output_dir={tmp_path / 't'}"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=ROOT,
    )
    assert resume.returncode == 2 and "Traceback" not in resume.stderr
    lines = resume.stderr.strip().splitlines()
    assert len(lines) == 2 and "not a complete dspark checkpoint" in lines[0] and lines[1].startswith("hint: ")


def test_plan_lengths_from_shard_metadata_equal_the_prepared_sequences(captured):
    from dspark_cli.capture import captured_lengths, iter_captured
    from dspark_cli.recipe import load_recipe
    from dspark_cli.training.data import prepare

    recipe = load_recipe("tiny", _overrides(captured))
    for max_len in (64, 20):
        prepared = [
            e.num_tokens
            for i, s in enumerate(iter_captured(recipe.stage_dir("capture")))
            if (e := prepare(s, epoch=0, index=i, seed=0, num_anchors=1, max_seq_len=max_len))
        ]
        assert captured_lengths(recipe.stage_dir("capture"), max_len) == prepared
    assert prepared == [] or set(prepared) == {20}  # truncated


def test_an_incomplete_capture_inside_training_is_one_line(captured, tmp_path):
    """Capture is a stage before training (run by `dspark train` / `dspark run` in the launching process);
    training itself, which may be one rank of many, refuses to capture."""
    from dspark_cli.errors import DataError
    from dspark_cli.recipe import load_recipe
    from dspark_cli.training.run import run_train

    recipe = load_recipe(
        "tiny",
        [*_overrides(captured), f"capture.output_dir={tmp_path / 'none'}", f"train.output_dir={tmp_path / 'train'}"],
    )
    with pytest.raises(DataError, match="capture output is not made yet") as err:
        run_train(recipe, resume="never")
    assert "\n" not in str(err.value) and "dspark train RECIPE" in err.value.hint
    assert not (tmp_path / "none").exists()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_sigkilled_launcher_takes_torchrun_and_its_ranks_with_it(captured, tmp_path):
    """`dspark train` killed outright cannot stop torchrun itself: the kernel sends torchrun SIGTERM
    (procs.dies_with_parent), which stops the ranks, instead of training on with nobody watching."""
    import signal
    import time

    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    launcher = subprocess.Popen(
        [
            DSPARK,
            "train",
            "tiny",
            *_overrides(captured),
            "-o",
            str(tmp_path / "t"),
            "--nproc",
            "2",
            "train.max_steps=1000",
            "train.epochs=1000.0",
        ],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 180
    while len(tree := descendants(launcher.pid)) < 3 and time.time() < deadline and launcher.poll() is None:
        time.sleep(0.2)  # torchrun and its 2 ranks
    assert len(tree) >= 3, f"torchrun never started its ranks (exit {launcher.poll()})"
    launcher.send_signal(signal.SIGKILL)
    launcher.wait()
    left = wait_gone(tree, 60)
    assert left == [], f"torchrun or its ranks {left} outlived the killed launcher"


def test_a_rank_that_fails_mid_run_does_not_hang_the_others(captured, tmp_path):
    """Rank 0 fails between two steps (here: its stdout, where it prints the step lines, is closed under
    it) while rank 1 is already in the next step's collective. It used to wait in a barrier beside rank 1
    for gloo's 30-minute timeout, with every process alive; now it leaves at once, rank 1's collective
    fails, torchrun stops the gang, and `dspark train` exits non-zero."""
    import time

    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    with open(tmp_path / "stderr", "w+") as stderr:
        launcher = subprocess.Popen(
            [
                DSPARK,
                "train",
                "tiny",
                *_overrides(captured),
                "-o",
                str(tmp_path / "t"),
                "--nproc",
                "2",
                "train.max_steps=1000",
                "train.epochs=1000.0",
                "train.log_every=1",
                "train.checkpoint_every=1000",
            ],
            env=env,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
        assert launcher.stdout is not None
        tree: list[int] = []
        try:
            for line in launcher.stdout:
                if line.startswith("step "):
                    break
            tree = descendants(launcher.pid)  # torchrun and its two ranks
            assert len(tree) >= 3, f"not under torchrun: {tree}"
            launcher.stdout.close()  # the next step line is rank 0's BrokenPipeError
            started = time.time()
            code = launcher.wait(timeout=120)
            ended = time.time() - started
        finally:
            if launcher.poll() is None:
                launcher.kill()
            for pid in wait_gone(tree, 10):
                os.kill(pid, 9)
        stderr.seek(0)
        text = stderr.read()
    assert code != 0, text[-2000:]
    assert wait_gone(tree, 60) == [], "a rank or torchrun outlived the failed run"
    print(f"dspark train exited {code} {ended:.0f} s after rank 0 failed")


def test_a_second_run_into_a_directory_being_trained_is_refused_and_touches_nothing(captured, tmp_path):
    out = tmp_path / "t"
    (out / "checkpoints" / ".tmp-step-000004").mkdir(parents=True)  # the first run's save in progress
    holder = hold_lock(out)
    try:
        second = _dspark("train", "tiny", *_overrides(captured), "-o", str(out))
    finally:
        holder.kill()
        holder.wait()
    assert second.returncode == 2, second.stderr[-2000:]
    error, hint = second.stderr.strip().splitlines()[-2:]
    assert error.startswith(f"error: train.output_dir: {out} is being written by another dspark process (pid "), error
    assert hint.startswith("hint: wait for it to finish, or set train.output_dir to another directory")
    assert (out / "checkpoints" / ".tmp-step-000004").is_dir()  # not taken for a killed run's temp dir
    assert not (out / "manifest.json").exists()
    again = _dspark("train", "tiny", *_overrides(captured), "-o", str(out), "train.max_steps=2")
    assert again.returncode == 0, again.stderr[-2000:]  # the lock went with its (killed) holder
