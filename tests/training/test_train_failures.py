"""A failure inside training reaches the terminal as the CLI's one line and a hint, with the root cause:
the first failing rank's own error, not torchrun's summary or a traceback; every rank's output and
traceback is kept in the run's log (`<train dir>/logs/train-<time>.log`), which the hint names.

    .venv/bin/python -m pytest tests/training/test_train_failures.py -q        # ~25 s on 2 cores

The fault is injected from outside dspark: a test-only `sitecustomize.py` put on the ranks' PYTHONPATH
makes `train_session` raise in the rank named by DSPARK_TEST_FAULT_RANK, after the process group is up,
so the other rank meets the failure as a lost peer in its next collective, as a real crash looks.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import train_fixtures

ROOT = Path(__file__).resolve().parents[2]
DSPARK = str(Path(sys.executable).with_name("dspark"))

# Test-only fault injection, loaded by every Python process of the run through PYTHONPATH: only the rank
# torchrun numbers DSPARK_TEST_FAULT_RANK patches anything. Nothing in dspark reads the variable.
FAULT = """
import os

if os.environ.get("RANK") is not None and os.environ.get("RANK") == os.environ.get("DSPARK_TEST_FAULT_RANK"):
    import dspark_cli.training.session as session

    def train_session(*args, **kwargs):
        raise ValueError(f"injected fault on rank {os.environ['RANK']}")

    session.train_session = train_session
"""


@pytest.fixture(scope="module")
def captured(tmp_path_factory):
    """The fixture target and a complete capture of 10 of its sequences, as capture writes it."""
    work = tmp_path_factory.mktemp("train-failures")
    train_fixtures.make_target(work / "target")
    sequences = train_fixtures.make_sequences(work / "target", num=10)
    train_fixtures.write_capture(work, sequences, train_fixtures.cli_overrides(work))
    return work


def _log_named_in(hint: str) -> Path:
    """The log file the hint names (`.../logs/train-<time>.log`)."""
    word = next(w for w in hint.replace(";", " ").split() if "/logs/train-" in w)
    return Path(word)


@pytest.mark.slow  # torchrun with 2 ranks on gloo: ~15 s on 2 quiet cores
def test_a_failing_rank_is_one_line_with_its_cause_and_the_log_has_every_traceback(captured, tmp_path):
    fault = tmp_path / "fault"
    fault.mkdir()
    (fault / "sitecustomize.py").write_text(FAULT)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(fault), *filter(None, [os.environ.get("PYTHONPATH")])]),
        "DSPARK_TEST_FAULT_RANK": "1",
        "OMP_NUM_THREADS": "1",
        "PYTHONWARNINGS": "ignore",
        "COLUMNS": "200",
    }
    out = tmp_path / "t"
    cmd = [DSPARK, "train", "tiny", *train_fixtures.cli_overrides(captured), "-o", str(out), "--nproc", "2"]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)

    assert done.returncode == 1, done.stderr[-3000:]
    assert "Traceback" not in done.stderr + done.stdout and "ChildFailedError" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 2, done.stderr
    error, hint = lines
    assert error == "error: rank 1 failed: ValueError: injected fault on rank 1", done.stderr
    assert hint.startswith("hint: ") and "/logs/train-" in hint, hint
    log = _log_named_in(hint)
    assert log.parent == out / "logs" and log.is_file(), (log, hint)
    text = log.read_text()
    # every rank's traceback: rank 1's own, and rank 0's lost peer in its collective
    assert "[rank1]: Traceback" in text and "[rank1]: ValueError: injected fault on rank 1" in text, text[-3000:]
    assert "[rank0]: Traceback" in text, text[-3000:]


def test_one_process_internal_error_is_the_same_line_with_its_traceback_in_the_log(captured, tmp_path, monkeypatch):
    """World size 1 trains in the launching process, without torchrun: an internal error there reads as a
    failed rank's does, its traceback kept in the same place; `DSPARK_DEBUG=1` still shows it instead."""
    from cli_support import invoke

    import dspark_cli.training.session as session

    def train_session(*args, **kwargs):
        raise ValueError("injected fault")

    monkeypatch.setattr(session, "train_session", train_session)
    monkeypatch.delenv("DSPARK_DEBUG", raising=False)
    out = tmp_path / "t"
    result = invoke("train", "tiny", *train_fixtures.cli_overrides(captured), "-o", str(out))

    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output and "internal error" not in result.output, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 2 and lines[0] == "error: training failed: ValueError: injected fault", result.output
    log = _log_named_in(lines[1])
    assert log.parent == out / "logs" and "ValueError: injected fault" in log.read_text(), result.output
    assert "Traceback" in log.read_text()


def test_the_earliest_recorded_failure_is_the_root_cause_and_none_recorded_is_said(tmp_path):
    """The launcher's reading of torchrun's error files (`<log dir>/<run>/attempt_<n>/<local rank>/error.json`):
    the earliest failure of the last attempt; a dspark error keeps its message, hint and exit code; with
    no file at all (a rank killed outright) the line says so and names the log."""
    import json
    import time

    from dspark_cli.errors import DataError
    from dspark_cli.machine.procs import record_failure
    from dspark_cli.training.launch import rank_failure

    attempt = tmp_path / "torchrun" / "run_x" / "attempt_1"
    for rank in (0, 1):
        (attempt / str(rank)).mkdir(parents=True)
    (tmp_path / "torchrun" / "run_x" / "attempt_0" / "0").mkdir(parents=True)
    old = tmp_path / "torchrun" / "run_x" / "attempt_0" / "0" / "error.json"  # restarted since: not this failure
    record_failure(ValueError("an earlier attempt"), "rank 0", old)
    time.sleep(0.01)
    record_failure(DataError("shard 3: checksum mismatch", "delete it"), "rank 1", attempt / "1" / "error.json")
    time.sleep(0.01)  # then rank 0 loses its peer
    record_failure(RuntimeError("Connection closed by peer"), "rank 0", attempt / "0" / "error.json")
    assert json.loads(old.read_text())["message"]["message"] == "ValueError: an earlier attempt"  # torchrun's part

    log = tmp_path / "train.log"
    error = rank_failure(tmp_path / "torchrun", 1, log)
    assert (error.message, error.hint, error.exit_code) == (
        "rank 1 failed: shard 3: checksum mismatch",
        f"delete it; the full log: {log}",
        1,
    )
    nothing = rank_failure(tmp_path / "nowhere", 1, log)
    assert "no rank recorded why" in nothing.message and str(log) in (nothing.hint or "")
