"""The online stream: P capture producers publish hidden-state shards into a store, N training ranks read them.

    # producer w of P (its own process, its own engine): captures the plan's shards w, w + P, ...
    run_capture(recipe, queue=StreamProducer(open_store(location), worker=w, workers=P, max_shards=K))
    # consumer (every training rank): the shards holding its own sequences, verified
    reader = StreamReader(open_store(location), fingerprint=plan.fingerprint, workers=P, expect=contract)
    sequences = reader.read(index)                      # waits until shard `index` is published
    reader.release(below)                               # global rank 0, after a checkpoint

Keys in the store (capture/store.py):
- `shards/shard-NNNNN.safetensors`: one plan shard, the same bytes as an offline capture shard;
- `producers/W.json`: producer W's status (plan fingerprint, contract, layout, each published shard's
  size and sha256, finished / error, pid and host, restarts, peak bytes), written only by W;
- `consumer.json`: `released_below` (every shard below it was trained on *and* checkpointed, and
  removed), the step of that checkpoint and the consumers' peak bytes, written only by global rank 0.

The bound: a producer publishes shard i only when `i < released_below + max_shards`, so at most
`max_shards` shards (temp files included) are in the store at any instant, whatever P is. The
trainer releases a shard only once a checkpoint covers every step that used it, so a restarted rank
finds every shard its checkpoint has not covered; the trainer's step plan says in advance whether the
bound leaves room for one checkpoint interval (training/online.py, `required_stream_shards`), so the
window never deadlocks. A restarted producer skips what it published (its status lists it) and
what was released. Every failure is one line.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import time
from typing import Any

from dspark_cli.capture.shards import pack, shard_name, unpack
from dspark_cli.capture.store import Store
from dspark_cli.capture.types import CapturedSequence
from dspark_cli.contract import Contract
from dspark_cli.errors import DataError

STREAM_KIND = "dspark.capture.stream"
CONSUMER_KEY = "consumer.json"
SHARD_PREFIX = "shards/"
SHARD_FORMAT = "dspark.capture.v1"
HINT = "delete the stream (capture.stream) and re-run `dspark train` without --resume, or restart the producers"


def shard_key(index: int) -> str:
    return SHARD_PREFIX + shard_name(index)


def producer_key(worker: int) -> str:
    return f"producers/{worker}.json"


def read_json(store: Store, key: str) -> dict[str, Any] | None:
    data = store.get(key)
    return None if data is None else json.loads(data.decode("utf-8"))


def write_json(store: Store, key: str, value: dict[str, Any]) -> None:
    store.put(key, json.dumps(value, indent=1, sort_keys=True).encode("utf-8"))


def released_below(store: Store) -> int:
    return int((read_json(store, CONSUMER_KEY) or {}).get("released_below", 0))


def shard_bytes(sequences: list[CapturedSequence], *, layer_ids: list[int], hidden_size: int) -> bytes:
    """A shard serialised exactly as capture writes it to disk (safetensors, the same metadata)."""
    from safetensors.torch import save

    meta = {"format": SHARD_FORMAT, "ids": json.dumps([s.id for s in sequences]),
            "target_layer_ids": json.dumps(list(layer_ids)), "hidden_size": str(hidden_size)}
    return save(pack(sequences), metadata=meta)


def parse_shard(name: str, data: bytes, *, layer_ids: list[int], hidden_size: int) -> list[CapturedSequence]:
    """The sequences of shard bytes (checked by `unpack` against the layout)."""
    from safetensors import SafetensorError
    from safetensors.torch import load

    try:
        header = json.loads(data[8:8 + int.from_bytes(data[:8], "little")])
        tensors = load(data)
    except (SafetensorError, ValueError, UnicodeDecodeError) as exc:
        raise DataError(f"{name}: unreadable shard ({str(exc).splitlines()[0][:120]})", HINT) from None
    return unpack(name, tensors, header.get("__metadata__") or {}, layer_ids=layer_ids, hidden_size=hidden_size,
                  hint=HINT)


class StreamClosed(Exception):
    """The trainers finished (consumer.json `finished`): nothing more is read, so the producer stops."""


def consumer_finished(store: Store) -> bool:
    return bool((read_json(store, CONSUMER_KEY) or {}).get("finished"))


class StreamProducer:
    """Producer `worker` of `workers`: what `run_capture` writes through as its `queue` (open / put / fail / finish)."""

    def __init__(self, store: Store, *, worker: int, workers: int, max_shards: int, poll_s: float = 0.05,
                 restarts: int = 0) -> None:
        if not 0 <= worker < workers or max_shards < 1:
            raise ValueError(f"producer {worker} of {workers}, max_shards {max_shards}")
        self.store, self.worker, self.workers, self.max_shards = store, worker, workers, max_shards
        self.poll_s, self.restarts = poll_s, restarts
        self.directory = getattr(store, "location", str(store))  # what run_capture's summary names
        self.status: dict[str, Any] = {}

    def open(self, *, fingerprint: str, contract: Contract, layout: dict[str, Any], num_shards: int) -> set[int]:
        """Create or resume this producer's status; return the shard indices run_capture must skip:
        the other producers' shards, and this one's already published."""
        key = producer_key(self.worker)
        previous = read_json(self.store, key)
        if previous is not None and (previous.get("fingerprint") != fingerprint or previous.get("workers") != self.workers):
            raise DataError(f"{self.directory}: a stream of another capture plan or producer count "
                            f"({previous.get('workers')} producers)", "use a new stream location, or delete this one")
        self.status = previous or {
            "kind": STREAM_KIND, "format_version": 1, "fingerprint": fingerprint, "contract": contract.to_dict(),
            "layout": layout, "num_shards": num_shards, "worker": self.worker, "workers": self.workers,
            "shards": {}, "peak_bytes": 0, "peak_shards": 0, "restarts": 0,
        }
        self.status.update({"finished": False, "error": None, "max_shards": self.max_shards,
                            "restarts": max(self.restarts, self.status.get("restarts", 0)),
                            "producer": {"pid": os.getpid(), "host": socket.gethostname()}})
        self._save()
        published = {int(name[6:11]) for name in self.status["shards"]}
        return {i for i in range(num_shards) if i % self.workers != self.worker} | published

    def _save(self) -> None:
        self.status["heartbeat"] = time.time()
        write_json(self.store, producer_key(self.worker), self.status)

    def wait_for_slot(self, index: int) -> float:
        """Block until shard `index` is inside the window the consumers have released; seconds waited."""
        started = time.perf_counter()
        while index >= released_below(self.store) + self.max_shards:
            if consumer_finished(self.store):
                raise StreamClosed(f"the trainers finished before shard {index}")
            time.sleep(self.poll_s)
        return time.perf_counter() - started

    def put(self, index: int, sequences: list[CapturedSequence]) -> dict[str, Any]:
        """Publish shard `index` once the window has room; its checksum goes into this producer's status."""
        layout = self.status["layout"]
        data = shard_bytes(sequences, layer_ids=layout["target_layer_ids"], hidden_size=layout["hidden_size"])
        self.wait_for_slot(index)
        if consumer_finished(self.store):
            raise StreamClosed(f"the trainers finished before shard {index}")
        self.store.put(shard_key(index), data)
        if consumer_finished(self.store):  # finished while it was written: the trainers' cleanup may have missed it
            self.store.remove(shard_key(index))
            raise StreamClosed(f"the trainers finished before shard {index}")
        name = shard_name(index)
        mask_tokens = sum(int(s.loss_mask.sum()) for s in sequences)
        entry = {"file": name, "sequences": len(sequences), "tokens": sum(s.num_tokens for s in sequences),
                 "loss_tokens": mask_tokens, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        used, shards = self.store.used_bytes(), len(self.store.keys(SHARD_PREFIX))
        self.status["shards"][name] = entry
        self.status["peak_bytes"] = max(self.status["peak_bytes"], used)
        self.status["peak_shards"] = max(self.status["peak_shards"], shards)
        self._save()
        return entry

    def finish(self) -> None:
        self.status["finished"] = True
        self._save()

    def fail(self, message: str) -> None:
        if consumer_finished(self.store):  # StreamClosed, or any end after the trainers are done
            self.status["closed"] = True
        else:
            self.status["error"] = message
        self._save()


class StreamReader:
    """A training rank's view of the stream: wait for a shard, verify it, parse it; release (rank 0)."""

    def __init__(self, store: Store, *, fingerprint: str, workers: int, expect: Contract | None = None,
                 timeout_s: float = 3600.0, poll_s: float = 0.05) -> None:
        self.store, self.fingerprint, self.workers, self.expect = store, fingerprint, workers, expect
        self.timeout_s, self.poll_s = timeout_s, poll_s
        self.location = getattr(store, "location", str(store))
        self.status: dict[int, dict[str, Any]] = {}
        self.peak_bytes = 0

    def _producer(self, worker: int) -> dict[str, Any] | None:
        status = read_json(self.store, producer_key(worker))
        if status is None:
            return None
        if status.get("kind") != STREAM_KIND:
            raise DataError(f"{self.location}: not a dspark capture stream", "point capture.stream to the stream")
        if status.get("fingerprint") != self.fingerprint or status.get("workers") != self.workers:
            raise DataError(f"{self.location}: producer {worker} streams another capture plan or producer count "
                            f"({status.get('workers')} producers, this recipe {self.workers})",
                            "start the producers with this recipe (the same datagen output, capture settings "
                            "and capture.workers), or use a new stream")
        if self.expect is not None and worker not in self.status:
            self.expect.check_against(status["contract"], self.location)
        if status.get("error"):
            raise DataError(f"{self.location}: capture producer {worker} failed: {status['error']}",
                            "fix it and restart the producers: they resume where they stopped")
        self.status[worker] = status
        return status

    def read(self, index: int) -> list[CapturedSequence]:
        """Shard `index`'s sequences, once its producer published it; size and sha256 checked first."""
        worker, name = index % self.workers, shard_name(index)
        started = time.monotonic()
        while (entry := (self.status.get(worker) or {}).get("shards", {}).get(name)) is None:
            status = self._producer(worker)
            if status is not None and name in status["shards"]:
                continue
            if index < released_below(self.store):
                raise DataError(f"{self.location}: shard {index} was already trained on and released",
                                "resume from the checkpoint that released it (--resume auto), or " + HINT)
            if status is not None and status.get("finished"):
                raise DataError(f"{self.location}: producer {worker} finished without shard {index}", HINT)
            if time.monotonic() - started > self.timeout_s:
                raise DataError(f"{self.location}: no shard {index} from capture producer {worker} after "
                                f"{self.timeout_s:.0f} s", "are the producers running (`python -m dspark_cli.capture.online`)?")
            time.sleep(self.poll_s)
        data = self.store.get(shard_key(index))
        self.peak_bytes = max(self.peak_bytes, self.store.used_bytes())
        where = f"{self.location}/{shard_key(index)}"
        if data is None:
            if index < released_below(self.store):
                raise DataError(f"{self.location}: shard {index} was already trained on and released",
                                "resume from the checkpoint that released it (--resume auto), or " + HINT)
            raise DataError(f"{where}: published but gone", HINT)
        if len(data) != entry["bytes"] or hashlib.sha256(data).hexdigest() != entry["sha256"]:
            raise DataError(f"{where}: checksum mismatch (corrupt or altered shard)", HINT)
        layout = self.status[worker]["layout"]
        return parse_shard(where, data, layer_ids=layout["target_layer_ids"], hidden_size=layout["hidden_size"])

    def release(self, below: int, *, step: int, finished: bool = False) -> None:
        """Remove shards below `below` (trained on and checkpointed), then let producers move on."""
        previous = read_json(self.store, CONSUMER_KEY) or {}
        start = int(previous.get("released_below", 0))
        for index in range(start, below):
            self.store.remove(shard_key(index))
        self.peak_bytes = max(self.peak_bytes, self.store.used_bytes())
        write_json(self.store, CONSUMER_KEY, {
            "released_below": max(below, start), "step": step, "finished": finished, "time": time.time(),
            "peak_bytes": max(self.peak_bytes, int(previous.get("peak_bytes", 0)))})
        if finished:  # after `finished` is visible: what a producer still publishes it removes itself
            for key in self.store.keys(SHARD_PREFIX):
                self.store.remove(key)

    def summary(self) -> dict[str, Any]:
        """Peak store bytes as the producers and this reader sampled them, and the producers' state."""
        producers = [read_json(self.store, producer_key(w)) or {} for w in range(self.workers)]
        consumer = read_json(self.store, CONSUMER_KEY) or {}
        return {"location": self.location, "producers": self.workers,
                "peak_bytes": max([self.peak_bytes, int(consumer.get("peak_bytes", 0))]
                                  + [int(p.get("peak_bytes", 0)) for p in producers]),
                "peak_shards": max([0] + [int(p.get("peak_shards", 0)) for p in producers]),
                "max_shards": max([0] + [int(p.get("max_shards", 0)) for p in producers]),
                "producer_restarts": sum(int(p.get("restarts", 0)) for p in producers)}
