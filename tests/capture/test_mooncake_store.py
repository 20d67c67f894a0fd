"""The Mooncake store (capture/mooncake_store.py) over loopback TCP: a real `mooncake_master`, two clients.

The Mooncake checks need the optional extra and the RDMA user library its client links even for TCP;
`scripts/dev.sh test` installs both where it can (tests/mooncake_support.py), elsewhere they skip with
the reason, and under CI (`CI=true`) they fail. Location parsing and the not-installed error run everywhere.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from mooncake_support import free_port as _free_port
from mooncake_support import mooncake_master, needs_mooncake

from dspark_cli.capture.mooncake_store import MooncakeStore, _check_key, _load_client, parse_location
from dspark_cli.errors import DsparkError, UsageError

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def master(tmp_path_factory):
    """A mooncake_master on loopback (its RPC port and HTTP admin port); yields the stream location."""
    with mooncake_master(tmp_path_factory.mktemp("mooncake") / "master.log") as location:
        yield location


# The other client: a producer in its own process, lending no memory (segment 0), so what it puts lives
# in the test process's segment and must survive its SIGKILL.
WRITER = """
import json, random, sys

from dspark_cli.capture.mooncake_store import MooncakeStore
store = MooncakeStore(sys.argv[1])
store.put("shards/shard-00000.safetensors", random.Random(0).randbytes(3 << 20))
store.put("producers/0.json", json.dumps({"shards": [0], "v": 0}).encode())
print("ready", flush=True)
for line in sys.stdin:
    if line.strip() == "spin":  # rewrite the status as fast as it can, until killed
        v = 0
        while True:
            v += 1
            store.put("producers/0.json", json.dumps({"shards": [0], "v": v}).encode())
"""


def _writer(location: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, location],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
        text=True,
    )
    line = proc.stdout.readline()
    assert line.strip() == "ready", f"the writer client did not start (exit {proc.poll()})"
    return proc


@needs_mooncake
@pytest.mark.slow  # a mooncake_master and a client process
def test_two_clients_share_a_stream_and_objects_outlive_a_killed_producer(master):
    shard = random.Random(0).randbytes(3 << 20)
    with MooncakeStore(master + "&segment=32MB") as store:  # this process lends the memory
        writer = _writer(master)
        try:
            assert store.keys("") == ["producers/0.json", "shards/shard-00000.safetensors"]
            assert store.keys("shards/") == ["shards/shard-00000.safetensors"]
            assert store.get("shards/shard-00000.safetensors") == shard  # 3 MiB: no local buffer needed
            assert json.loads(store.get("producers/0.json")) == {"shards": [0], "v": 0}
            assert store.get("producers/1.json") is None
            assert 3 << 20 < store.used_bytes() < (3 << 20) + 4096

            # replaced while read: every read is the whole old or the whole new value, never absent
            writer.stdin.write("spin\n")
            writer.stdin.flush()
            seen, stop = [], time.monotonic() + 2.0
            while time.monotonic() < stop:
                data = store.get("producers/0.json")
                assert data is not None
                seen.append(json.loads(data)["v"])
            assert seen == sorted(seen) and seen[-1] > 0, seen[:20]
        finally:
            writer.send_signal(signal.SIGKILL)
            writer.wait(timeout=20)

        # the producer is gone (killed mid-put, perhaps); what it published is all there
        assert store.get("shards/shard-00000.safetensors") == shard
        assert json.loads(store.get("producers/0.json"))["v"] >= seen[-1]

        store.put("consumer.json", b'{"released_below": 1}')
        store.remove("shards/shard-00000.safetensors")
        store.remove("shards/shard-00000.safetensors")  # already gone: no error
        assert store.keys("") == ["consumer.json", "producers/0.json"]
        assert store.get("shards/shard-00000.safetensors") is None
        store.put("empty", b"")
        assert store.get("empty") == b""


@needs_mooncake
@pytest.mark.slow  # a mooncake_master
def test_a_full_store_and_an_absent_master_are_one_line_errors(master):
    with MooncakeStore(master + "&segment=16MB") as store:
        with pytest.raises(DsparkError, match=r"the Mooncake store is full \(20971521 bytes for big\)"):
            store.put("big", bytes(20 << 20))
        assert store.keys("big") == []
    started = time.monotonic()
    with pytest.raises(DsparkError, match=r"nothing listens at 127\.0\.0\.1:\d+ \(the Mooncake master's RPC port\)"):
        MooncakeStore(f"mooncake://127.0.0.1:{_free_port()}/x?admin_port={_free_port()}", timeout_s=2)
    assert time.monotonic() - started < 10  # not the client's own 90 s of retries


def test_locations_parse_and_mistakes_are_usage_errors():
    where = parse_location("mooncake://10.0.0.5/k3-run1?segment=4GB&protocol=rdma&device=mlx5_0")
    assert (where.master, where.admin, where.namespace) == ("10.0.0.5:50051", "10.0.0.5:9003", "k3-run1")
    assert (where.segment_bytes, where.protocol, where.device) == (4 << 30, "rdma", "mlx5_0")
    assert parse_location("mooncake://h:6000/a/b?admin_port=7000").admin == "h:7000"
    for bad, message in [
        ("mooncake://h:1/", "no namespace"),
        ("mooncake://h/x?prot=tcp", "unknown option"),
        ("mooncake://h/x?protocol=udp", "protocol='udp'"),
        ("mooncake://h/x?segment=lots", "not a size"),
        ("mooncake://h/x y", "namespace"),
        ("mooncake://h/x?segment=8MB", "16 MiB minimum"),
    ]:
        with pytest.raises(UsageError, match=message):
            parse_location(bad)


def test_without_the_client_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "mooncake.store", None)  # what `import mooncake.store` meets when absent
    with pytest.raises(UsageError, match="not installed") as info:
        _load_client()
    assert "dspark[mooncake]" in info.value.hint and "libibverbs1" in info.value.hint


def test_keys_the_versions_would_confuse_are_refused():
    for bad in ("a@1", "a b", "", "/abs", "x/../y", "k.tmp"):
        with pytest.raises(ValueError):
            _check_key(bad)


@needs_mooncake
@pytest.mark.slow  # a mooncake_master
def test_threads_of_one_client_share_its_staging_buffer_safely(master):
    """put and get from two threads of one client: the one registered buffer is used under a lock."""
    with MooncakeStore(master + "&segment=16MB") as store:
        store.put("t.json", b'{"v": 0}')
        errors, stop = [], time.monotonic() + 1.0

        def write():
            v = 0
            while time.monotonic() < stop:
                v += 1
                store.put("t.json", json.dumps({"v": v, "pad": "x" * (v % 5000)}).encode())

        thread = threading.Thread(target=write)
        thread.start()
        reads = []
        while time.monotonic() < stop:
            try:
                reads.append(json.loads(store.get("t.json"))["v"])
            except Exception as exc:  # noqa: BLE001 - collected and asserted below
                errors.append(repr(exc))
        thread.join()
        assert errors == [] and reads == sorted(reads), (errors[:3], reads[:20])


@needs_mooncake
@pytest.mark.slow  # a mooncake_master
def test_a_key_replaced_between_listing_and_reading_is_listed_again_never_missing(master):
    """get lists the versions, then reads one: a put in between removes what was listed. However often
    that happens, get lists again and returns the newest bytes (never None); past ?timeout= it says so."""
    with MooncakeStore(master + "&segment=16MB") as reader, MooncakeStore(master) as writer:
        writer.put("r.json", b"0")
        listed, puts = reader._versions, []

        def list_then_replace(limit, key="r.json"):
            def versions():
                found = listed()
                if len(puts) < limit:
                    puts.append(len(puts) + 1)
                    writer.put(key, str(puts[-1]).encode())  # removes every version just listed
                return found

            return versions

        reader._versions = list_then_replace(5)
        assert reader.get("r.json") == b"5" and len(puts) == 5
        # a key replaced without end (a new one: the version read above keeps its lease, so stays readable)
        puts.clear()
        writer.put("s.json", b"0")
        reader._versions = list_then_replace(10**9, "s.json")
        reader.timeout_s = 0.5
        with pytest.raises(DsparkError, match="s.json was replaced faster than it could be read for 0.5 s"):
            reader.get("s.json")
