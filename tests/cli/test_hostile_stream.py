"""Hostile and careless online streams: each case ends in one line naming what is wrong, before any
process starts where it can be judged up front, within a stated deadline where it cannot.

Cases: a malformed `mooncake://` location (refused by `validate` in under a second, nothing written);
nothing listening at the master, or a master whose RPC port accepts and never answers (refused by the
preflight's probe, and by a store opened in a rank, within the location's `timeout`); stream bounds one
training step cannot work with (`capture.queue_max_shards`, `capture.keep_max_bytes`); a shard with a
flipped byte or truncated (the reader names the shard file); a stream nothing publishes into (the
reader's whole wait, `capture.stream_timeout`).

    .venv/bin/python -m pytest tests/cli/test_hostile_stream.py -q       # seconds
"""

from __future__ import annotations

import http.server
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from cli_support import assert_user_error, invoke
from requirements_support import require

from dspark_cli.capture.mooncake_location import parse_location, probe_master
from dspark_cli.capture.store import FileStore
from dspark_cli.capture.stream import StreamProducer, StreamReader, shard_key
from dspark_cli.contract import Contract
from dspark_cli.errors import DataError, DsparkError

ONLINE = ("capture.mode=online",)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.fixture(scope="module", autouse=True)
def warm() -> None:
    """One validate first, so the timings below are the checks' own, not the first imports'."""
    invoke("validate", "tiny", "--recipe-only")


def timed_validate(tmp_path: Path, *args: str) -> tuple[object, float]:
    before = files(tmp_path)
    started = time.perf_counter()
    result = invoke("validate", "tiny", f"output_dir={tmp_path / 'run'}", *args)
    took = time.perf_counter() - started
    assert files(tmp_path) == before and not (tmp_path / "run").exists()  # nothing written
    return result, took


# --- 1: a malformed location, or nothing listening, is one line from `validate` in under a second ----------------


@pytest.mark.parametrize(
    ("location", "needles"),
    [
        ("mooncake://127.0.0.1:99999/ns", ["port '99999' is not a port number (1-65535)"]),
        ("mooncake://127.0.0.1:abc/ns", ["port 'abc' is not a port number"]),
        ("mooncake://127.0.0.1:50051/", ["no namespace after the master's address"]),
        ("mooncake://127.0.0.1:50051", ["no namespace"]),
        ("mooncake://[::1/ns", ["host '[::1' opens '[' and never closes it"]),
        ("mooncake://127.0.0.1/ns?admin_port=-1", ["admin_port '-1' is not a port number"]),
        ("mooncake://127.0.0.1/ns?protocol=udp", ["protocol='udp'", "tcp or protocol=rdma"]),
        ("mooncake://127.0.0.1/ns?colour=red", ["unknown option 'colour'"]),
        ("mooncake://127.0.0.1/ns?prot=tcp", ["unknown option 'prot' (did you mean protocol?)"]),
        ("mooncake://127.0.0.1/ns?timeout=0", ["timeout='0' is not a number of seconds above 0"]),
        ("mooncake:///ns", ["no host"]),
        ("mooncake://:50051/ns", ["no host before the port"]),
        ("MOONCAKE://127.0.0.1/ns", ["the scheme MOONCAKE:// must be written mooncake://"]),
        ("s3://bucket/ns", ["no store backend for s3://"]),
    ],
)
def test_a_malformed_stream_location_is_one_line_at_once(tmp_path, location, needles):
    result, took = timed_validate(tmp_path, *ONLINE, f"capture.stream={location}")
    assert_user_error(result, f"capture.stream: {location}: ", *needles)
    assert took < 1.0, took


def test_nothing_listening_at_the_master_is_refused_naming_the_address(tmp_path):
    rpc = free_port()
    result, took = timed_validate(tmp_path, *ONLINE, f"capture.stream=mooncake://127.0.0.1:{rpc}/ns")
    assert_user_error(result, f"nothing listens at 127.0.0.1:{rpc} (the Mooncake master's RPC port)")
    assert took < 1.0, took
    # the recipe alone (a cluster recipe on a laptop) is not this machine's network: not probed
    alone = invoke("validate", "tiny", *ONLINE, f"capture.stream=mooncake://127.0.0.1:{rpc}/ns", "--recipe-only")
    assert alone.exit_code == 0, alone.output


def test_every_command_refuses_a_malformed_location_before_it_starts(tmp_path):
    """The location is judged as every command loads its recipe: `produce` (no stage preflight of its
    own) and `train --dry-run` (which judges no machine) refuse it too; offline, the stream is unused."""
    bad = "mooncake://127.0.0.1:99999/ns"
    produce = invoke("produce", "tiny", f"output_dir={tmp_path / 'run'}", *ONLINE, "--stream", bad)
    assert_user_error(produce, "port '99999' is not a port number")
    train = invoke("train", "tiny", f"output_dir={tmp_path / 'run'}", *ONLINE, f"capture.stream={bad}", "--dry-run")
    assert_user_error(train, "port '99999' is not a port number")
    offline = invoke("validate", "tiny", f"output_dir={tmp_path / 'run'}", f"capture.stream={bad}", "--recipe-only")
    assert offline.exit_code == 0, offline.output
    assert not (tmp_path / "run").exists()


# --- 2: a master that accepts and never answers ends within the deadline ------------------------------------------


@pytest.fixture
def stalled_master() -> Iterator[str]:
    """A loopback "master": an RPC port that accepts connections and never answers, and an HTTP admin
    port that says it is healthy. Yields its `mooncake://` location."""
    rpc = socket.socket()
    rpc.bind(("127.0.0.1", 0))
    rpc.listen(16)
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                held.append(rpc.accept()[0])
            except OSError:
                return

    class Healthy(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"OK")

        def log_message(self, *args: object) -> None:
            pass

    admin = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Healthy)
    threading.Thread(target=accept, daemon=True).start()
    threading.Thread(target=admin.serve_forever, daemon=True).start()
    try:
        yield f"mooncake://127.0.0.1:{rpc.getsockname()[1]}/ns?admin_port={admin.server_address[1]}"
    finally:
        admin.shutdown()
        admin.server_close()
        rpc.close()
        for sock in held:
            sock.close()


def test_a_stalled_master_is_refused_by_the_preflight_within_its_probe(tmp_path, stalled_master):
    from dspark_cli.preflight.stream import PROBE_S

    rpc = parse_location(stalled_master).master
    result, took = timed_validate(tmp_path, *ONLINE, f"capture.stream={stalled_master}")
    assert_user_error(result, f"{rpc} (the Mooncake master's RPC port) accepted a connection but did not reply")
    assert PROBE_S - 0.1 < took < PROBE_S + 1.5, took


def test_a_stalled_master_ends_the_store_within_its_timeout(stalled_master):
    where = parse_location(stalled_master + "&timeout=1.5")
    started = time.perf_counter()
    problem = probe_master(where, where.timeout_s)
    took = time.perf_counter() - started
    assert problem is not None and f"{where.master} (the Mooncake master's RPC port)" in problem[0], problem
    assert "did not reply to a request within 1.5 s" in problem[0] and "restart mooncake_master" in problem[1]
    assert 1.4 < took < 2.5, took
    # the store a producer or a training rank opens: the same deadline, before Mooncake's client (whose
    # own setup retried 20 x 30 s against this master, holding the GIL)
    require("mooncake")
    from dspark_cli.capture.mooncake_store import MooncakeStore

    started = time.perf_counter()
    with pytest.raises(
        DsparkError, match=r"accepted a connection but did not reply to a request within 1.5 s"
    ) as caught:
        MooncakeStore(stalled_master + "&timeout=1.5")
    assert "?timeout= sets how long dspark waits (1.5 s)" in caught.value.hint
    assert time.perf_counter() - started < 1.5 + 1.5


def test_a_real_master_answers_the_probe(tmp_path):
    require("mooncake")
    from mooncake_support import mooncake_master

    with mooncake_master(tmp_path / "master.log") as location:
        started = time.perf_counter()
        assert probe_master(parse_location(location), 2.0) is None
        assert time.perf_counter() - started < 1.0


# --- 4: stream bounds one training step cannot work with --------------------------------------------------------


@pytest.fixture(scope="module")
def datagen_run(tmp_path_factory) -> Path:
    """A finished datagen output of 12 conversations (the sources' answers kept: tokenised, no model run)."""
    root = tmp_path_factory.mktemp("stream-bounds")
    prompts = root / "p.jsonl"
    prompts.write_text(
        "".join(
            json.dumps(
                {
                    "id": n,
                    "messages": [
                        {"role": "user", "content": f"question number {n} about things " * 3},
                        {"role": "assistant", "content": f"answer number {n} with some words " * 4},
                    ],
                }
            )
            + "\n"
            for n in range(12)
        )
    )
    result = invoke(
        "datagen",
        "tiny",
        f"output_dir={root / 'run'}",
        f"datagen.sources=[{{path: {prompts}}}]",
        "datagen.regenerate=false",
        "datagen.exclude_eval=[]",
    )
    assert result.exit_code == 0, result.output
    return root / "run"


SMALL_SHARDS = ("capture.shard_tokens=40", "train.tokens_per_step=256", "train.max_seq_len=64")


def bounds(run: Path, *args: str):
    """`dspark validate` of an online recipe on the finished datagen output `run`; nothing written."""
    before = files(run)
    result = invoke("validate", "tiny", f"output_dir={run}", *ONLINE, "capture.backend=hf", *args)
    assert files(run) == before
    return result


def test_a_window_smaller_than_one_step_is_refused_with_what_the_step_needs(datagen_run):
    result = bounds(datagen_run, *SMALL_SHARDS, "capture.queue_max_shards=1")
    assert_user_error(result, "capture.queue_max_shards=1 is too small: one training step reads from")
    line = result.output.splitlines()[0]
    need = int(line.split("reads from ")[1].split()[0])
    assert need > 1 and f"set capture.queue_max_shards>={need}" in line and "over 1 rank(s)" in line, line
    enough = bounds(datagen_run, *SMALL_SHARDS, f"capture.queue_max_shards={need}")
    assert enough.exit_code == 0, enough.output
    ranks = bounds(datagen_run, *SMALL_SHARDS, "capture.queue_max_shards=1", "train.nproc_per_node=2", "--recipe-only")
    assert_user_error(ranks, "capture.queue_max_shards=1 is too small", "over 2 rank(s)")


def test_keep_max_bytes_below_the_whole_stream_is_refused(datagen_run, tmp_path):
    result = bounds(datagen_run, "capture.keep_max_bytes=1")
    assert_user_error(
        result, "capture.keep_max_bytes=1 cannot hold the whole stream", "bytes; set capture.keep_max_bytes>="
    )
    # before datagen, what no data can change: less than the shortest trainable sequence
    early, _ = timed_validate(tmp_path, *ONLINE, "capture.keep_max_bytes=1")
    assert_user_error(early, "capture.keep_max_bytes=1 cannot hold one captured sequence")
    fits, _ = timed_validate(tmp_path, *ONLINE, "capture.keep_max_bytes=1000000")
    assert fits.exit_code == 0, fits.output


# --- 3 and 5: the reader names a damaged shard, and ends a wait for one that never comes --------------------------

CONTRACT = Contract(target="t", target_config_sha256="abc", target_layer_ids=(0, 1))
LAYOUT = {"target_layer_ids": [0, 1], "hidden_size": 8}


def _seq(name: str):
    import torch

    from dspark_cli.capture.types import CapturedSequence

    mask = torch.tensor([0, 0, 1, 1, 1], dtype=torch.bool)
    last = torch.randn(5, 8).to(torch.bfloat16)
    last[~mask] = 0
    return CapturedSequence(name, torch.arange(5), mask, torch.randn(5, 16).to(torch.bfloat16), last)


def _published(tmp_path: Path) -> tuple[FileStore, StreamProducer]:
    """A stream whose one (external) producer published shards 0 and 1, then stopped."""
    store = FileStore(tmp_path / "stream")
    producer = StreamProducer(store, worker=0, workers=1, max_shards=4, poll_s=0.01)
    producer.open(fingerprint="f", contract=CONTRACT, layout=LAYOUT, num_shards=3)
    producer.put(0, [_seq(f"a/{n}") for n in range(20)])  # ~5 kB: a truncation to 1,000 bytes cuts it
    producer.put(1, [_seq("b/0")])
    return store, producer


def _reader(store: FileStore, timeout_s: float = 5.0) -> StreamReader:
    return StreamReader(store, fingerprint="f", workers=1, expect=CONTRACT, poll_s=0.01, timeout_s=timeout_s)


def test_a_shard_with_a_flipped_byte_or_truncated_is_named_with_what_is_wrong(tmp_path):
    store, producer = _published(tmp_path)
    path = tmp_path / "stream" / shard_key(0)
    good = path.read_bytes()
    flipped = bytearray(good)
    flipped[len(good) // 2] ^= 0x10
    path.write_bytes(bytes(flipped))
    with pytest.raises(DataError) as caught:
        _reader(store).read(0)
    assert str(path) in caught.value.message and "checksum mismatch: sha256" in caught.value.message
    assert "restart capture producer 0" in caught.value.hint and "--only 0" in caught.value.hint
    path.write_bytes(good[:1000])
    with pytest.raises(DataError, match=rf"{path}: truncated: 1,000 of the {len(good):,} bytes its producer"):
        _reader(store).read(0)
    # the hint's repair: delete it, restart the producer, and it captures that shard again
    path.unlink()
    again = StreamProducer(store, worker=0, workers=1, max_shards=4, poll_s=0.01, restarts=1)
    assert 0 not in again.open(fingerprint="f", contract=CONTRACT, layout=LAYOUT, num_shards=3)
    again.put(0, [_seq(f"a/{n}") for n in range(20)])
    assert [s.id for s in _reader(store).read(0)] == [f"a/{n}" for n in range(20)]


def test_a_wait_for_a_shard_nobody_publishes_ends_at_its_deadline(tmp_path):
    store, _ = _published(tmp_path)
    started = time.perf_counter()
    with pytest.raises(DataError) as caught:
        _reader(store, timeout_s=0.3).read(2)  # producer 0 published 0 and 1, then stopped
    assert 0.3 <= time.perf_counter() - started < 0.3 + 1.0
    message = caught.value.message
    assert message.startswith(f"{tmp_path / 'stream'}: waited 0.3 s for shards/shard-00002.safetensors"), message
    assert "from capture producer 0, which last wrote its status" in message and "(2 shard(s) published)" in message
    assert "capture.stream_timeout" in caught.value.hint
    empty = FileStore(tmp_path / "empty")
    with pytest.raises(DataError, match="which has written no status yet"):
        _reader(empty, timeout_s=0.1).read(0)


def test_the_ranks_wait_is_the_recipes_stream_timeout(datagen_run, tmp_path):
    """A training rank's reader (OnlineSource, external producers, nothing published) gives up after
    `capture.stream_timeout`, naming the stream and the shard."""
    from dspark_cli.recipe import load_recipe
    from dspark_cli.training.stream_source import OnlineSource

    recipe = load_recipe(
        "tiny",
        [
            f"output_dir={datagen_run}",
            *ONLINE,
            "capture.backend=hf",
            "capture.external_producers=true",
            f"capture.stream={tmp_path / 'stream'}",
            "capture.stream_timeout=0.5",
        ],
    )
    assert load_recipe("tiny").capture.stream_timeout == 3600.0  # the default the docs state
    env = SimpleNamespace(world_size=1, rank=0, is_main=True, distributed=False)
    source = OnlineSource(recipe, env=env, out_dir=tmp_path / "train", contract=CONTRACT)
    assert source.reader.timeout_s == 0.5
    started = time.perf_counter()
    with pytest.raises(DataError, match=r"waited 0\.5 s for shards/shard-00000\.safetensors from capture producer 0"):
        next(iter(source.steps(0, {})))
    assert time.perf_counter() - started < 0.5 + 2.0
