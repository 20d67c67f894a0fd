"""The online stream's parts without processes: the step plan, the store window, the device split.

.venv/bin/python -m pytest tests/capture/test_stream_units.py -q      # seconds
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from types import SimpleNamespace

import pytest
import torch

from dspark_cli.capture.store import FileStore, open_store
from dspark_cli.capture.stream import (
    CONSUMER_KEY,
    StreamClosed,
    StreamProducer,
    StreamReader,
    StreamRewound,
    read_json,
    shard_bytes,
    shard_key,
)
from dspark_cli.capture.types import CapturedSequence
from dspark_cli.contract import Contract
from dspark_cli.errors import ContractError, DataError, UsageError
from dspark_cli.machine.devices import device_split_problems, narrow_train_devices, producer_environ
from dspark_cli.training.stream_source import plan_online


def fake_plan(lengths: list[list[int]]):
    """A capture plan of shards holding sequences of these lengths (loss on all but the first 2 tokens)."""

    def samples():
        for shard, seqs in enumerate(lengths):
            for j, n in enumerate(seqs):
                yield shard, f"s{shard}/{j}", list(range(n)), [0, 0] + [1] * (n - 2)

    return SimpleNamespace(samples=samples, shards=[object() for _ in lengths])


LENGTHS = [[30, 50, 20], [40, 45], [25, 60, 35, 10], [55], [33, 44, 20, 30]]


def test_the_step_plan_is_the_same_for_any_rank_count_and_trains_every_sequence_once():
    plans = {
        n: plan_online(fake_plan(LENGTHS), max_seq_len=48, tokens_per_step=150, world_size=n, seed=0) for n in (1, 2, 3)
    }
    steps = {n: [sorted(i.seq_id for rank in step for i in rank) for step in p.steps] for n, p in plans.items()}
    assert steps[1] == steps[2] == steps[3]  # the global batch of each step: whatever the ranks
    every = Counter(f"s{s}/{j}" for s, seqs in enumerate(LENGTHS) for j in range(len(seqs)))
    assert Counter(i.seq_id for step in plans[3].steps for rank in step for i in rank) == every
    for step in plans[3].steps:  # each rank holds something, split by tokens
        assert all(step) and max(i.num_tokens for rank in step for i in rank) <= 48
    # a step of fewer sequences than ranks joins the next; the few left at the end join the last step
    tail = plan_online(fake_plan([[40], [40], [40]]), max_seq_len=48, tokens_per_step=80, world_size=2, seed=0)
    assert [sum(len(r) for r in s) for s in tail.steps] == [3]


def test_release_and_the_window_one_step_needs():
    plan = plan_online(fake_plan(LENGTHS), max_seq_len=64, tokens_per_step=100, world_size=1, seed=0)
    assert plan.release_below(0) == 0 and plan.release_below(len(plan.steps)) == len(LENGTHS)
    below = [plan.release_below(s) for s in range(len(plan.steps) + 1)]
    assert below == sorted(below)  # shards are released in order
    # the window: from the oldest shard a step still reads (older ones went after the step before) to the
    # newest, counted by hand from the plan; no checkpoint interval in it
    spans = []
    for s, ranks in enumerate(plan.steps, start=1):
        shards = [i.shard for rank in ranks for i in rank]
        spans.append(max(shards) - below[s - 1] + 1)
    assert plan.required_shards() == max(spans) < len(LENGTHS)
    kept = plan_online(
        fake_plan(LENGTHS), max_seq_len=64, tokens_per_step=100, world_size=1, seed=0, epochs=2.0, keep=True
    )
    assert len(kept.steps) > len(plan.steps) and kept.release_below(len(plan.steps)) == 0  # kept for epoch 2
    ids = [(i.epoch, i.seq_id) for step in kept.steps for rank in step for i in rank]
    assert Counter(e for e, _ in ids) == {0: 14, 1: 14}
    assert [s for e, s in ids if e == 1] != [s for e, s in ids if e == 0]  # epoch 2 is shuffled


def _seq(name: str, length: int = 5) -> CapturedSequence:
    mask = torch.tensor([0, 0, 1, 1, 1][:length], dtype=torch.bool)
    last = torch.randn(length, 8).to(torch.bfloat16)
    last[~mask] = 0
    return CapturedSequence(name, torch.arange(length), mask, torch.randn(length, 16).to(torch.bfloat16), last)


CONTRACT = Contract(target="t", target_config_sha256="abc", target_layer_ids=(0, 1))
LAYOUT = {"target_layer_ids": [0, 1], "hidden_size": 8}


def _producer(store, worker: int, workers: int = 2, max_shards: int = 2) -> StreamProducer:
    producer = StreamProducer(store, worker=worker, workers=workers, max_shards=max_shards, poll_s=0.01)
    producer.open(fingerprint="f", contract=CONTRACT, layout=LAYOUT, num_shards=4)
    return producer


def test_producers_wait_inside_the_window_and_readers_verify(tmp_path):
    store = open_store(tmp_path / "stream")
    p0, p1 = _producer(store, 0), _producer(store, 1)
    assert p1.open(fingerprint="f", contract=CONTRACT, layout=LAYOUT, num_shards=4) == {0, 2}  # others' shards
    p0.put(0, [_seq("a/0"), _seq("b/0")])
    p1.put(1, [_seq("c/0")])
    threading.Timer(0.3, lambda: StreamReader(store, fingerprint="f", workers=2).release(1, step=1)).start()
    started = time.perf_counter()
    p0.put(2, [_seq("d/0")])  # shard 2 is outside [0, 0 + 2) until shard 0 is released
    assert time.perf_counter() - started >= 0.25 and len(store.keys("shards/")) == 2
    reader = StreamReader(store, fingerprint="f", workers=2, expect=CONTRACT, poll_s=0.01, timeout_s=5)
    assert [s.id for s in reader.read(1)] == ["c/0"] and [s.id for s in reader.read(2)] == ["d/0"]
    with pytest.raises(DataError, match="already trained on and released"):
        reader.read(0)
    data = bytearray(store.get(shard_key(2)))
    data[-3] ^= 1
    store.put(shard_key(2), bytes(data))
    with pytest.raises(DataError, match="checksum mismatch"):
        reader.read(2)
    other = Contract(target="t", target_config_sha256="abc", target_layer_ids=(0, 2))
    with pytest.raises(ContractError):
        StreamReader(store, fingerprint="f", workers=2, expect=other).read(1)
    with pytest.raises(DataError, match="another capture plan"):
        StreamReader(store, fingerprint="g", workers=2).read(1)
    p1.fail("CUDA out of memory")
    with pytest.raises(DataError, match="producer 1 failed: CUDA out of memory"):
        StreamReader(store, fingerprint="f", workers=2, timeout_s=1).read(3)
    reader.release(4, step=9, finished=True)
    assert read_json(store, CONSUMER_KEY)["released_below"] == 4 and not store.keys("shards/")
    with pytest.raises(StreamClosed):  # the trainers are done: a producer stops instead of waiting
        p0.put(4, [_seq("e/0")])


def test_a_restarted_producer_skips_what_it_published(tmp_path):
    store = FileStore(tmp_path / "stream")
    _producer(store, 0, max_shards=4).put(0, [_seq("a/0")])
    (tmp_path / "stream" / "shards" / ".shard-00002.safetensors.999.tmp").write_bytes(b"half")  # killed mid-write
    again = StreamProducer(store, worker=0, workers=2, max_shards=4, restarts=1)
    assert again.open(fingerprint="f", contract=CONTRACT, layout=LAYOUT, num_shards=4) == {0, 1, 3}
    again.put(2, [_seq("b/0")])
    assert not list((tmp_path / "stream").rglob("*.tmp")) and store.keys("shards/") == [shard_key(0), shard_key(2)]
    assert read_json(store, "producers/0.json")["restarts"] == 1
    with pytest.raises(DataError, match="another capture plan"):
        StreamProducer(store, worker=0, workers=3, max_shards=4).open(
            fingerprint="f", contract=CONTRACT, layout=LAYOUT, num_shards=4
        )


def test_a_shard_published_without_its_entry_is_removed_before_it_is_captured_again(tmp_path):
    """Killed between the shard's rename and its status write: the restarted producer captures that
    shard again, so it removes the unlisted copy first; the store never holds the shard twice (old
    file + the new one's temp file), which would break the max_shards bound. Other producers' shards stay."""
    store = FileStore(tmp_path / "stream")
    p0, p1 = _producer(store, 0, max_shards=3), _producer(store, 1, max_shards=3)
    p0.put(0, [_seq("a/0")])
    p1.put(1, [_seq("b/0")])
    store.put(
        shard_key(2),
        shard_bytes([_seq("c/0")], layer_ids=LAYOUT["target_layer_ids"], hidden_size=LAYOUT["hidden_size"]),
    )  # no entry in p0's status
    again = StreamProducer(store, worker=0, workers=2, max_shards=3, restarts=1)
    assert again.open(fingerprint="f", contract=CONTRACT, layout=LAYOUT, num_shards=4) == {0, 1, 3}
    assert store.keys("shards/") == [shard_key(0), shard_key(1)]


def test_a_rewind_has_the_producers_capture_again_what_a_resume_needs(tmp_path):
    """Shards 0-1 trained on and released; the trainers resume from a checkpoint that covers none of
    them: rank 0 rewinds, the shards outside the new window go, the producer re-opens (its put of a
    shard beyond the window raises StreamRewound) and captures exactly the missing ones again."""
    store = open_store(tmp_path / "stream")
    producer = _producer(store, 0, workers=1, max_shards=2)
    reader = StreamReader(store, fingerprint="f", workers=1, poll_s=0.01, timeout_s=5)
    producer.put(0, [_seq("a/0")])
    producer.put(1, [_seq("b/0")])
    assert [s.id for s in reader.read(0)] == ["a/0"]
    reader.release(2, step=2)
    producer.put(2, [_seq("c/0")])
    producer.put(3, [_seq("d/0")])
    assert store.keys("shards/") == [shard_key(2), shard_key(3)]
    assert reader.rewind(1, step=1, window=2)  # step 2 onwards needs shard 1 again
    assert store.keys("shards/") == [shard_key(2)]  # shard 3 is outside [1, 1 + 2): removed, the bound holds
    consumer = read_json(store, CONSUMER_KEY)
    assert consumer["released_below"] == 1 and consumer["generation"] == 1 and consumer["rewinds"] == 1
    with pytest.raises(StreamRewound):
        producer.put(4, [_seq("e/0")])
    producer.fail("StreamRewound")  # what run_capture does with any exception: not an error here
    assert read_json(store, "producers/0.json")["error"] is None
    # the stale entry of shard 1 makes a reader wait, not fail, until the shard is captured again
    late = []
    thread = threading.Thread(target=lambda: late.append([s.id for s in reader.read(1)]))
    thread.start()
    time.sleep(0.1)
    assert producer.open(fingerprint="f", contract=CONTRACT, layout=LAYOUT, num_shards=5) == {0, 2}
    assert "shard-00001.safetensors" not in read_json(store, "producers/0.json")["shards"]
    producer.put(1, [_seq("b/0")])
    thread.join(timeout=5)
    assert late == [["b/0"]]
    assert not reader.rewind(1, step=1, window=2)  # nothing released beyond it: no new generation
    assert read_json(store, CONSUMER_KEY)["generation"] == 1


def _recipe(*overrides: str):
    from dspark_cli.recipe import load_recipe

    return load_recipe("tiny", ["capture.mode=online", *overrides])


def test_the_device_split_rule():
    ok = _recipe("capture.workers=4", "capture.devices=[0,1,2,3]", "train.devices=[4,5,6,7]", "train.nproc_per_node=4")
    assert device_split_problems(ok, available=8) == []
    assert producer_environ(ok, 2, {"RANK": "0", "PATH": "/bin"}) == {
        "PATH": "/bin",
        "CUDA_VISIBLE_DEVICES": "2",
        "DSPARK_ALL_DEVICES": "",
    }
    environ = {"CUDA_VISIBLE_DEVICES": "3,4,5,6,7,8,9,10"}
    assert narrow_train_devices(ok, environ) == "7,8,9,10" and environ["DSPARK_ALL_DEVICES"] == "3,4,5,6,7,8,9,10"
    assert producer_environ(ok, 1, environ)["CUDA_VISIBLE_DEVICES"] == "4"  # the machine's device 1
    overlap = _recipe("capture.devices=[0,1]", "train.devices=[1,2]")
    assert any("share devices [1]" in p for p in device_split_problems(overlap, available=8))
    tp = _recipe(
        "capture.backend=vllm",
        "datagen.tensor_parallel_size=8",
        "capture.workers=1",
        "capture.devices=[0,1,2,3]",
        "train.devices=[4,5,6,7]",
        "train.nproc_per_node=4",
    )
    assert any("need 8" in p for p in device_split_problems(tp, available=8))
    few = _recipe("capture.devices=[0]", "train.devices=[1]", "train.nproc_per_node=2")
    assert any("train.nproc_per_node=2" in p for p in device_split_problems(few, available=8))
    assert any("do not exist" in p for p in device_split_problems(ok, available=4))


@pytest.mark.slow  # makes the session's tiny datagen output first: ~65 s loaded
def test_a_window_too_small_for_one_step_is_refused_up_front(tmp_path):
    from capture_support import capture_recipe

    from dspark_cli.training.stream_source import OnlineSource

    recipe = capture_recipe(
        "tiny-gqa",
        tmp_path,
        "capture.mode=online",
        "capture.shard_tokens=40",
        "capture.queue_max_shards=1",
        "capture.external_producers=true",
        "train.checkpoint_every=100",
        "train.tokens_per_step=256",
        "train.max_seq_len=64",
    )
    env = SimpleNamespace(world_size=1, rank=0, is_main=True)
    with pytest.raises(UsageError, match=r"queue_max_shards=1 is too small: one training step reads from \d+ shards"):
        OnlineSource(recipe, env=env, out_dir=tmp_path / "train", contract=CONTRACT)


def test_utilisation_names_the_side_that_waits_less():
    from dspark_cli.training.stream_source import utilisation

    starved = utilisation([0.0, 1.0], [6.0, 4.0], 10.0)  # ranks idle half the run waiting for shards
    assert (starved["producer_busy"], starved["trainer_busy"], starved["bottleneck"]) == (0.95, 0.5, "producers")
    full = utilisation([8.0, 9.0], [0.5, 0.5], 10.0)  # producers mostly waiting for room
    assert (full["producer_busy"], full["trainer_busy"], full["bottleneck"]) == (0.15, 0.95, "trainers")
    assert utilisation([50.0], [0.0], 10.0)["producer_busy"] == 0.0  # waits over restarts: at most idle all along
