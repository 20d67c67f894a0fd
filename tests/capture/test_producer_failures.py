"""A capture producer that fails gives its supervisor the root cause, and `dspark produce` one line with
it and the producer's log (`<capture dir>/logs/producer-<w>.log`, which holds its output), and its own hint.

    .venv/bin/python -m pytest tests/capture/test_producer_failures.py -q        # ~5 s
"""

from __future__ import annotations

import pytest

from dspark_cli.errors import DsparkError


def test_a_failed_producer_is_its_own_error_with_its_log(tmp_path):
    """The producer (a real `python -m dspark_cli.capture.producers` process) cannot open its stream: a
    scheme no store backend serves. It used to reach the user as `capture producer 0 failed (exit 2)`."""
    from dspark_cli.capture import supervise
    from dspark_cli.recipe import load_recipe, write_resolved

    recipe = load_recipe("tiny", ["capture.mode=online", f"output_dir={tmp_path / 'run'}"])
    recipe_file = write_resolved(recipe, tmp_path / "cfg")
    with pytest.raises(DsparkError) as info:
        supervise(recipe_file, recipe, overrides=[], location="nosuch://stream")
    error = info.value
    log = tmp_path / "run" / "hidden" / "logs" / "producer-0.log"
    assert error.message == (
        f"capture producer 0 failed: stream nosuch://stream: no store backend for nosuch:// (its log: {log})"
    )
    assert error.exit_code == 2 and "use a directory on a shared filesystem" in (error.hint or "")  # its own hint
    assert "Traceback" in log.read_text() and "no store backend for nosuch://" in log.read_text()
