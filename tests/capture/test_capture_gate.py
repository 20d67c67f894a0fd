"""Several machines' launchers on one shared capture directory: one captures, the others wait for it.

    .venv/bin/python -m pytest tests/capture/test_capture_gate.py -q

The two launch-side callers are two threads of this process running `capture_once` (the lock is
a file made with O_EXCL, so threads contend for it as processes on different machines do); the
capture is the real offline hf capture of the shared tiny datagen output.
"""

from __future__ import annotations

import json
import threading

import pytest
from capture_support import capture_recipe

from dspark_cli.capture import capture_pending, ensure_capture
from dspark_cli.capture.gate import LOCK, capture_once
from dspark_cli.targets import BUNDLED_TARGETS

pytestmark = [
    pytest.mark.skipif(not (BUNDLED_TARGETS["tiny-gqa"] / "config.json").is_file(), reason="tiny-gqa is not built"),
    pytest.mark.slow,
]  # real captures by two launchers


def test_two_launchers_on_one_directory_capture_once_and_both_start_after_it_is_complete(tmp_path):
    recipe = capture_recipe("tiny-gqa", tmp_path, "capture.mode=offline", "train.nnodes=2")
    captures, results, lines = [], {}, []
    started = threading.Barrier(2)

    def capture() -> None:
        captures.append(threading.current_thread().name)
        ensure_capture(recipe)

    def launcher(name: str) -> None:
        started.wait()
        captured = capture_once(recipe, capture, say=lines.append, progress_s=0.0, poll_s=0.05)
        results[name] = (captured, capture_pending(recipe))

    threads = [threading.Thread(target=launcher, args=(f"node-{i}",), name=f"node-{i}") for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert len(captures) == 1, captures  # exactly one launcher captured
    assert sorted(c for c, _ in results.values()) == [False, True]
    assert all(pending is None for _, pending in results.values())  # nobody went on before it was complete
    assert any(line.startswith("capture: waiting for the launcher on") for line in lines), lines
    assert not (tmp_path / "run" / "hidden" / LOCK).exists()
    assert capture_once(recipe, capture, say=lines.append) is False and len(captures) == 1  # complete: nothing to do


def test_a_lock_left_by_a_dead_launcher_is_taken_over_and_a_failed_capture_releases_it(tmp_path):
    recipe = capture_recipe("tiny-gqa", tmp_path, "capture.mode=offline", "train.nnodes=2")
    directory = tmp_path / "run" / "hidden"
    directory.mkdir(parents=True)
    lock = directory / LOCK
    lock.write_text(json.dumps({"host": "gone", "pid": 1, "beat": 7}))  # its launcher died: no heartbeat
    lines: list[str] = []

    def failing() -> None:
        raise RuntimeError("the engine did not load")

    with pytest.raises(RuntimeError, match="did not load"):
        capture_once(recipe, failing, say=lines.append, stale_s=0.3, poll_s=0.05)
    assert any("taking over" in line and "gone (pid 1)" in line for line in lines), lines
    assert not lock.exists()  # a failed capture leaves no lock behind, so another launcher can try
    assert capture_once(recipe, lambda: ensure_capture(recipe), say=lines.append) is True
    assert capture_pending(recipe) is None and not lock.exists()
