"""Online mode: a bounded on-disk queue of hidden-state shards between a capture process and the trainer.

    # producer (its own process): python -m dspark_cli.capture.online RECIPE QUEUE_DIR
    # consumer (the trainer):
    for seq in iter_queue("runs/tiny/hidden-queue", expect=contract):   # deletes each shard once consumed
        ...

The queue directory holds `queue.json` (written only by the producer, atomically: contract, planned
shard count, every published shard's size and sha256, finished / error, producer pid and host, peak
disk) and at most `max_shards` shard files. The producer computes the next shard in memory, then
*waits* until fewer than `max_shards` shards are on disk before writing it, so the bound holds at
every instant, temp files included. The consumer reads shards in order, verifies each before
yielding from it, deletes it after its last sequence was consumed, and stops when the producer has
marked the queue finished and every shard was read. A producer that died or failed is one-line error.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dspark_cli.capture.shards import QUEUE_HINT, read_shard, shard_name, write_shard
from dspark_cli.capture.types import CapturedSequence
from dspark_cli.contract import Contract
from dspark_cli.errors import DataError
from dspark_cli.artifacts.files import write_json_atomic

STATUS_NAME = "queue.json"
QUEUE_KIND = "dspark.capture.queue"


def _disk_usage(directory: Path) -> tuple[int, int]:
    """(bytes of every file in the queue, number of shard files, temp ones included)."""
    total = shards = 0
    for entry in os.scandir(directory):
        if entry.is_file():
            total += entry.stat().st_size
            shards += entry.name.endswith((".safetensors", ".safetensors.tmp"))
    return total, shards


def read_status(directory: Path) -> dict[str, Any] | None:
    path = directory / STATUS_NAME
    if not path.is_file():
        return None
    return json.loads(path.read_text(encoding="utf-8"))


class OnlineQueue:
    """The producer side of the queue (the consumer is `iter_queue`)."""

    def __init__(self, directory: str | os.PathLike[str], max_shards: int, *, poll_s: float = 0.05) -> None:
        if max_shards < 1:
            raise ValueError("max_shards must be >= 1")
        self.directory = Path(directory)
        self.max_shards = max_shards
        self.poll_s = poll_s
        self.status: dict[str, Any] = {}

    def open(self, *, fingerprint: str, contract: Contract, layout: dict[str, Any], num_shards: int) -> set[int]:
        """Create or resume the queue; return the shard indices already published (consumed or not)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        for stale in self.directory.glob(".*.tmp"):
            stale.unlink()  # a shard half-written by a killed producer
        previous = read_status(self.directory)
        if previous is not None and previous.get("fingerprint") != fingerprint:
            raise DataError(f"{self.directory}: queue of a different capture plan",
                            "use a new queue directory, or delete this one")
        self.status = previous or {
            "kind": QUEUE_KIND, "format_version": 1, "fingerprint": fingerprint, "contract": contract.to_dict(),
            "layout": layout, "num_shards": num_shards, "max_shards": self.max_shards, "shards": {},
            "peak_bytes": 0, "peak_shards": 0,
        }
        self.status.update({"finished": False, "error": None, "max_shards": self.max_shards,
                            "producer": {"pid": os.getpid(), "host": socket.gethostname()}})
        self._save()
        return {int(name[6:11]) for name in self.status["shards"]}

    def _save(self) -> None:
        self.status["heartbeat"] = time.time()
        write_json_atomic(self.directory / STATUS_NAME, self.status)

    def wait_for_slot(self) -> float:
        """Block while `max_shards` shards are on disk; return the seconds waited."""
        started = time.perf_counter()
        while _disk_usage(self.directory)[1] >= self.max_shards:
            time.sleep(self.poll_s)
        return time.perf_counter() - started

    def put(self, index: int, sequences: list[CapturedSequence]) -> dict[str, Any]:
        """Write shard `index` once there is room, publish its checksum, record peak disk."""
        self.wait_for_slot()
        layout = self.status["layout"]
        entry = write_shard(self.directory / shard_name(index), sequences, layer_ids=layout["target_layer_ids"],
                            hidden_size=layout["hidden_size"])
        total, shards = _disk_usage(self.directory)
        self.status["shards"][entry["file"]] = entry
        self.status["peak_bytes"] = max(self.status["peak_bytes"], total)
        self.status["peak_shards"] = max(self.status["peak_shards"], shards)
        self._save()
        return entry

    def finish(self) -> None:
        self.status["finished"] = True
        self._save()

    def fail(self, message: str) -> None:
        self.status["error"] = message
        self._save()


def _producer_alive(status: dict[str, Any]) -> bool:
    producer = status.get("producer") or {}
    if producer.get("host") != socket.gethostname() or not producer.get("pid"):
        return True  # another machine: trust the heartbeat-free protocol, wait
    try:
        os.kill(producer["pid"], 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _wait_status(directory: Path, poll_s: float, timeout_s: float | None) -> dict[str, Any]:
    started = time.monotonic()
    while (status := read_status(directory)) is None:
        if timeout_s is not None and time.monotonic() - started > timeout_s:
            raise DataError(f"{directory}: no capture producer started within {timeout_s:.0f} s",
                            "start it: python -m dspark_cli.capture.online RECIPE QUEUE_DIR")
        time.sleep(poll_s)
    return status


def iter_queue(queue_dir: str | os.PathLike[str], *, expect: Contract | None = None, delete: bool = True,
               poll_s: float = 0.05, timeout_s: float | None = None) -> Iterator[CapturedSequence]:
    """Consume the queue in shard order until the producer finished; `timeout_s` bounds waiting for each shard."""
    directory = Path(queue_dir)
    status = _wait_status(directory, poll_s, timeout_s)
    if status.get("kind") != QUEUE_KIND:
        raise DataError(f"{directory}: not a dspark capture queue", "point to the online queue directory")
    if expect is not None:
        expect.check_against(status["contract"], str(directory))
    layout = status["layout"]
    index, waited_since = 0, time.monotonic()
    while index < status["num_shards"]:
        name = shard_name(index)
        entry = status["shards"].get(name)
        if entry is None:
            if status.get("error"):
                raise DataError(f"{directory}: the capture producer failed: {status['error']}", "fix it and restart the producer")
            if not _producer_alive(status):
                raise DataError(f"{directory}: the capture producer (pid {status['producer']['pid']}) died before shard {index}",
                                "restart it: it resumes where it stopped")
            if timeout_s is not None and time.monotonic() - waited_since > timeout_s:
                raise DataError(f"{directory}: no shard {index} after {timeout_s:.0f} s", "is the producer running?")
            time.sleep(poll_s)
            status = read_status(directory) or status
            continue
        path = directory / name
        if not path.is_file():
            raise DataError(f"{path}: published but gone (consumed by another trainer?)",
                            "one consumer per queue; restart capture into a new queue")
        yield from read_shard(path, entry, layer_ids=layout["target_layer_ids"], hidden_size=layout["hidden_size"],
                              hint=QUEUE_HINT)
        if delete:
            path.unlink()
        index, waited_since = index + 1, time.monotonic()
