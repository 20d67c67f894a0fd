"""Online capture: producer processes fill a bounded stream while a (slow) consumer drains it; a
producer that dies for good is a one-line error; a restarted producer captures only what it had not
published. (The stream's parts without processes: tests/capture/test_stream_units.py.)

    .venv/bin/python -m pytest tests/capture/test_capture_online.py -q
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
import torch
from capture_support import capture_recipe, start_producers

from dspark_cli.capture import (
    StreamProducer,
    StreamReader,
    build_plan,
    contract_for_recipe,
    iter_captured,
    open_store,
    run_capture,
)
from dspark_cli.capture.stream import producer_key, read_json
from dspark_cli.errors import DataError
from dspark_cli.recipe import write_resolved

pytestmark = (
    pytest.mark.slow
)  # every test here runs dspark stages in processes (torchrun, producers, training): minutes

ROOT = Path(__file__).resolve().parents[2]


def watch(directory: Path, stop: threading.Event, seen: dict[str, int]) -> None:
    """Sample the queue directory every millisecond: most shard files and bytes ever present at once."""
    while not stop.is_set():
        shards = total = 0
        try:
            for entry in os.scandir(directory):
                size = entry.stat().st_size
                total += size
                shards += ".safetensors" in entry.name  # temp files included
        except FileNotFoundError:
            pass  # a shard deleted between listing and stat
        seen["shards"], seen["bytes"] = max(seen["shards"], shards), max(seen["bytes"], total)
        time.sleep(0.001)


def test_two_producers_fill_a_bounded_stream_that_matches_offline(tmp_path):
    recipe = capture_recipe(
        "tiny-gqa",
        tmp_path,
        "capture.shard_tokens=50",
        "capture.queue_max_shards=2",
        "capture.batch_size=2",
        "capture.workers=2",
    )
    run_capture(recipe)
    offline = list(iter_captured(recipe.stage_dir("capture"), expect=contract_for_recipe(recipe)))
    shard_sizes = [
        s["bytes"] for s in json.loads((Path(recipe.stage_dir("capture")) / "manifest.json").read_text())["shards"]
    ]
    assert len(shard_sizes) >= 5  # enough shards for unbounded producers to overrun a bound of 2
    stream_dir = tmp_path / "stream"
    stream_dir.mkdir()
    write_resolved(recipe, tmp_path / "cfg")
    seen, stop = {"shards": 0, "bytes": 0}, threading.Event()
    watcher = threading.Thread(target=watch, args=(stream_dir / "shards", stop, seen), daemon=True)
    watcher.start()
    supervisor = start_producers(tmp_path / "cfg" / "recipe.yaml", stream_dir)
    reader = StreamReader(
        open_store(stream_dir),
        fingerprint=build_plan(recipe).fingerprint,
        workers=2,
        expect=contract_for_recipe(recipe),
        timeout_s=120,
    )
    online = []
    try:
        for index in range(len(shard_sizes)):  # the trainer's order; a slow one: the producers wait for it
            online += reader.read(index)
            time.sleep(0.3)
            reader.release(index + 1, step=index + 1, finished=index + 1 == len(shard_sizes))
        out, err = supervisor.communicate(timeout=60)
    finally:
        stop.set()
        supervisor.kill()
    watcher.join()
    assert supervisor.returncode == 0, err[-2000:]
    assert json.loads(out.strip().splitlines()[-1])["producers"] == 2
    summary = reader.summary()
    assert summary["peak_shards"] <= 2 and seen["shards"] <= 2
    biggest_two = sum(sorted(shard_sizes)[-2:])
    assert summary["peak_bytes"] <= biggest_two + 64 * 1024 and seen["bytes"] <= biggest_two + 64 * 1024
    assert not list(stream_dir.rglob("*.safetensors*"))  # everything consumed was released
    assert [s.id for s in online] == [s.id for s in offline]
    for a, b in zip(online, offline, strict=True):
        for field in ("input_ids", "loss_mask", "aux_hidden", "last_hidden"):
            assert torch.equal(getattr(a, field), getattr(b, field)), (a.id, field)


def test_a_producer_that_died_for_good_is_a_one_line_error_after_what_it_published(tmp_path, monkeypatch):
    """A real producer (the supervisor's `python -m dspark_cli.capture.producers --worker=0`) is SIGKILLed
    while it waits for room; with no restarts left (MAX_RESTARTS lowered to 0 so one kill is enough)
    the supervisor records it in the producer's status and the reader stops with one line."""
    from dspark_cli.capture import Supervisor, producers

    monkeypatch.setattr(producers, "MAX_RESTARTS", 0)
    recipe = capture_recipe(
        "tiny-gqa", tmp_path, "capture.shard_tokens=50", "capture.queue_max_shards=1", "capture.batch_size=2"
    )
    plan = build_plan(recipe)
    assert len(plan.shards) >= 2
    write_resolved(recipe, tmp_path / "cfg")
    store = open_store(tmp_path / "stream")
    environ = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    supervisor = Supervisor(
        tmp_path / "cfg" / "recipe.yaml", str(tmp_path / "stream"), recipe, environ=environ, poll_s=0.05
    ).start()
    try:
        reader = StreamReader(
            store,
            fingerprint=plan.fingerprint,
            workers=1,
            expect=contract_for_recipe(recipe),
            poll_s=0.02,
            timeout_s=120,
        )
        got = [s.id for s in reader.read(0)]  # the producer now waits: shard 1 is outside the 1-shard window
        os.kill(read_json(store, producer_key(0))["producer"]["pid"], signal.SIGKILL)
        reader.timeout_s = 20  # the supervisor notices within its poll; a timeout would fail the match
        with pytest.raises(
            DataError,
            match=r"capture producer 0 failed: capture producer 0 died 1 times "
            r"\(last exit -9\)",
        ) as info:
            reader.read(1)
    finally:
        supervisor.stop()
    assert got == list(plan.shards[0].ids) and "\n" not in str(info.value)
    assert "died 1 times" in (supervisor.error or "")


def test_a_producer_that_dies_before_its_first_status_stops_the_reader_at_once(tmp_path):
    """A producer that exits with an error before it writes anything to the stream (here: its Python cannot
    start: a broken environment) left the trainer waiting for the reader's hour-long timeout; the
    supervisor's reason now ends the wait in one line."""
    from dspark_cli.capture import Supervisor

    recipe = capture_recipe("tiny-gqa", tmp_path, "capture.shard_tokens=50")
    plan = build_plan(recipe)
    write_resolved(recipe, tmp_path / "cfg")
    store = open_store(tmp_path / "stream")
    environ = {**os.environ, "PYTHONHOME": str(tmp_path / "no-python-here")}  # "Fatal Python error", exit 1
    supervisor = Supervisor(
        tmp_path / "cfg" / "recipe.yaml", str(tmp_path / "stream"), recipe, environ=environ, poll_s=0.05
    ).start()
    try:
        reader = StreamReader(
            store, fingerprint=plan.fingerprint, workers=1, poll_s=0.02, timeout_s=300, gave_up=lambda: supervisor.error
        )
        started = time.monotonic()
        with pytest.raises(DataError, match=r"no shard 0: capture producer 0 failed \(exit 1\)") as info:
            reader.read(0)
        assert time.monotonic() - started < 60 and "\n" not in str(info.value)
    finally:
        supervisor.stop()
    assert read_json(store, producer_key(0)) is None  # it never wrote a status: the case the timeout was hit in


def test_restarted_producer_captures_only_what_it_had_not_published(tmp_path):
    from dspark_cli.capture.hf import HFCapturer

    recipe = capture_recipe("tiny-gqa", tmp_path, "capture.shard_tokens=100", "capture.batch_size=8")
    plan = build_plan(recipe)
    assert len(plan.shards) >= 3
    inner = HFCapturer(plan.geometry.location, plan.layer_ids, dtype="float32")

    class DiesAtThirdShard:
        calls = 0

        def describe(self):
            return inner.describe()

        def capture(self, samples):
            self.calls += 1
            if self.calls == 3:
                raise KeyboardInterrupt  # interrupted (Ctrl-C): no failure to record
            return inner.capture(samples)

    store = open_store(tmp_path / "stream")
    reader = StreamReader(
        store, fingerprint=plan.fingerprint, workers=1, expect=contract_for_recipe(recipe), poll_s=0.01, timeout_s=30
    )
    with pytest.raises(KeyboardInterrupt):
        run_capture(
            recipe, queue=StreamProducer(store, worker=0, workers=1, max_shards=10), capturer=DiesAtThirdShard()
        )
    assert sorted(read_json(store, producer_key(0))["shards"]) == ["shard-00000.safetensors", "shard-00001.safetensors"]
    interrupted = read_json(store, producer_key(0))  # an interruption is no failure: a resume goes on from it
    assert interrupted["error"] is None and not interrupted["finished"]
    summary = run_capture(
        recipe, queue=StreamProducer(store, worker=0, workers=1, max_shards=10, restarts=1), capturer=inner
    )
    assert summary.captured_tokens < plan.num_tokens  # only the missing shards were captured again
    status = read_json(store, producer_key(0))
    assert status["finished"] and status["error"] is None and status["restarts"] == 1
    read = [s.id for i in range(len(plan.shards)) for s in reader.read(i)]
    assert read == [i for s in plan.shards for i in s.ids]
