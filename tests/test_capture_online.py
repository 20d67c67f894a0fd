"""Online capture: producer processes fill a bounded stream while a (slow) consumer drains it; the
older single-producer queue (capture/queue.py).

    .venv/bin/python -m pytest tests/test_capture_online.py -q
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from capture_support import capture_recipe

from dspark_cli.capture import OnlineQueue, contract_for_recipe, iter_captured, iter_queue, run_capture
from dspark_cli.capture.queue import read_status
from dspark_cli.capture.types import CapturedSequence
from dspark_cli.contract import Contract
from dspark_cli.errors import ContractError, DataError
from dspark_cli.recipe import write_resolved

ROOT = Path(__file__).resolve().parents[1]


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
    from dspark_cli.capture import StreamReader, build_plan, open_store

    recipe = capture_recipe("tiny-gqa", tmp_path, "capture.shard_tokens=50", "capture.queue_max_shards=2",
                            "capture.batch_size=2", "capture.workers=2")
    run_capture(recipe)
    offline = list(iter_captured(recipe.stage_dir("capture"), expect=contract_for_recipe(recipe)))
    shard_sizes = [s["bytes"] for s in json.loads((Path(recipe.stage_dir("capture")) / "manifest.json").read_text())["shards"]]
    assert len(shard_sizes) >= 5  # enough shards for unbounded producers to overrun a bound of 2
    stream_dir = tmp_path / "stream"
    stream_dir.mkdir()
    write_resolved(recipe, tmp_path / "cfg")
    seen, stop = {"shards": 0, "bytes": 0}, threading.Event()
    watcher = threading.Thread(target=watch, args=(stream_dir / "shards", stop, seen), daemon=True)
    watcher.start()
    supervisor = subprocess.Popen([sys.executable, "-m", "dspark_cli.capture.online", str(tmp_path / "cfg" / "recipe.yaml"),
                                   str(stream_dir)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    reader = StreamReader(open_store(stream_dir), fingerprint=build_plan(recipe).fingerprint, workers=2,
                          expect=contract_for_recipe(recipe), timeout_s=120)
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


def _sequence(name: str, hidden: int = 8, layers: int = 2, length: int = 5) -> CapturedSequence:
    mask = torch.tensor([0, 0, 1, 1, 1][:length], dtype=torch.bool)
    last = torch.randn(length, hidden).to(torch.bfloat16)
    last[~mask] = 0
    return CapturedSequence(name, torch.arange(length), mask, torch.randn(length, layers * hidden).to(torch.bfloat16), last)


def _open(directory: Path, max_shards: int = 2, num_shards: int = 3) -> tuple[OnlineQueue, Contract]:
    contract = Contract(target="t", target_config_sha256="abc", target_layer_ids=(0, 1))
    queue = OnlineQueue(directory, max_shards, poll_s=0.01)
    queue.open(fingerprint="f", contract=contract, num_shards=num_shards,
               layout={"target_layer_ids": [0, 1], "hidden_size": 8})
    return queue, contract


def test_a_dead_or_failed_producer_is_one_line_error(tmp_path):
    queue, contract = _open(tmp_path / "q")
    queue.put(0, [_sequence("a/0"), _sequence("b/0")])
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    queue.status["producer"]["pid"] = dead.pid
    queue._save()
    got = []
    with pytest.raises(DataError, match="died before shard 1") as info:
        for seq in iter_queue(tmp_path / "q", expect=contract, poll_s=0.01):
            got.append(seq.id)
    assert got == ["a/0", "b/0"] and "\n" not in str(info.value)
    failed, _ = _open(tmp_path / "q2")
    failed.fail("CUDA out of memory")
    with pytest.raises(DataError, match="producer failed: CUDA out of memory"):
        next(iter_queue(tmp_path / "q2", poll_s=0.01))


def test_queue_refuses_another_contract_and_a_corrupt_shard(tmp_path):
    queue, contract = _open(tmp_path / "q", num_shards=1)
    entry = queue.put(0, [_sequence("a/0")])
    queue.finish()
    other = Contract(target="t", target_config_sha256="abc", target_layer_ids=(0, 2))
    with pytest.raises(ContractError, match="target_layer_ids"):
        next(iter_queue(tmp_path / "q", expect=other))
    path = tmp_path / "q" / entry["file"]
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(DataError, match="checksum mismatch"):
        next(iter_queue(tmp_path / "q", expect=contract))
    assert path.exists()  # nothing consumed, nothing deleted


def test_producer_waits_for_room(tmp_path):
    queue, _ = _open(tmp_path / "q", max_shards=1)
    queue.put(0, [_sequence("a/0")])
    threading.Timer(0.3, lambda: (tmp_path / "q" / "shard-00000.safetensors").unlink()).start()
    started = time.perf_counter()
    queue.put(1, [_sequence("b/0")])
    assert time.perf_counter() - started >= 0.25 and queue.status["peak_shards"] == 1


def test_restarted_producer_continues_after_its_last_published_shard(tmp_path):
    from dspark_cli.capture.hf import HFCapturer
    from dspark_cli.capture.plan import build_plan

    recipe = capture_recipe("tiny-gqa", tmp_path, "capture.shard_tokens=100", "capture.batch_size=8")
    plan = build_plan(recipe)
    inner = HFCapturer(plan.geometry.location, plan.layer_ids, dtype="float32")

    class DiesAtThirdShard:
        calls = 0

        def describe(self):
            return inner.describe()

        def capture(self, samples):
            self.calls += 1
            if self.calls == 3:
                raise KeyboardInterrupt  # killed
            return inner.capture(samples)

    queue_dir = tmp_path / "queue"
    with pytest.raises(KeyboardInterrupt):
        run_capture(recipe, queue=OnlineQueue(queue_dir, 10), capturer=DiesAtThirdShard())
    assert sorted(read_status(queue_dir)["shards"]) == ["shard-00000.safetensors", "shard-00001.safetensors"]
    first = next(iter_queue(queue_dir, delete=True))  # the trainer starts before the restart ...
    summary = run_capture(recipe, queue=OnlineQueue(queue_dir, 10), capturer=inner)
    rest = [s.id for s in iter_queue(queue_dir, expect=contract_for_recipe(recipe))]
    assert summary["captured_tokens"] < plan.num_tokens  # only the missing shards were captured again
    # ... an abandoned generator deletes nothing: shard 0 is read again in full, then everything else once.
    assert first.id == plan.shards[0].ids[0] and rest == [i for s in plan.shards for i in s.ids]
