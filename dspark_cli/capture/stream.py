"""The online stream: P capture producers publish hidden-state shards into a store, N training ranks read them.

    # producer w of P (its own process, its own engine): captures the plan's shards w, w + P, ...
    run_capture(recipe, queue=StreamProducer(open_store(location), worker=w, workers=P, max_shards=K))
    # consumer (every training rank): the shards holding its own sequences, verified
    reader = StreamReader(open_store(location), fingerprint=plan.fingerprint, workers=P, expect=contract)
    sequences = reader.read(index)                      # waits until shard `index` is published
    reader.release(below, step=s)                       # global rank 0, once every rank trained step s
    reader.rewind(below, step=c)                        # global rank 0, resuming from the checkpoint at step c

Keys in the store (capture/store.py):
- `shards/shard-NNNNN.safetensors`: one plan shard, the same bytes as an offline capture shard;
- `producers/W.json`: producer W's status (plan fingerprint, contract, layout, each published shard's
  size and sha256, finished / error, pid and host, restarts, peak bytes), written only by W;
- `consumer.json`: `released_below` (every shard below it was trained on by every rank that reads it,
  and removed), the step that released it, `generation` (how many times the trainers rewound the
  stream) and the consumers' peak bytes, written only by global rank 0;
- `.dspark-owner`: the train run that owns the stream (capture/stream_owner.py), written by its rank 0.
- `validation/...` and `validation.json`: the datagen validation split, published by producer 0 and never
  released or rewound (capture/validation_stream.py).

Release on consumption: rank 0 releases a shard once the last step that uses it is trained (every
rank took part in that step's gradient reduction, so every rank has read it). The bound: a producer
publishes shard i only when `i < released_below + max_shards`, so at most `max_shards` shards (temp
files included) are in the store at any instant, whatever P is and whatever the checkpoint interval.
A resumed run needs the shards its checkpoint does not cover, which may be released already: rank 0
*rewinds* the stream (`released_below` back to what the checkpoint covers, `generation` + 1, shards
outside the new window removed) and the producers capture the missing ones again, deterministically
(capture is a pure function of the datagen output and the plan). A producer (re)opening, or seeing a
new generation, captures exactly its shards that are at or above `released_below` and not in the
store. Every failure is one line.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import time
from collections.abc import Callable
from typing import Any

from dspark_cli.capture.shards import pack, shard_name, unpack
from dspark_cli.capture.store import Store
from dspark_cli.capture.types import CapturedSequence
from dspark_cli.contract import Contract
from dspark_cli.errors import DataError
from dspark_cli.recipe.bounded import loads_json

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
    return None if data is None else loads_json(data)


def write_json(store: Store, key: str, value: dict[str, Any]) -> None:
    store.put(key, json.dumps(value, indent=1, sort_keys=True).encode("utf-8"))


def released_below(store: Store) -> int:
    return int((read_json(store, CONSUMER_KEY) or {}).get("released_below", 0))


def consumer_state(store: Store) -> dict[str, Any]:
    return read_json(store, CONSUMER_KEY) or {}


def shard_index(key: str) -> int:
    return int(key[len(SHARD_PREFIX) + 6 : len(SHARD_PREFIX) + 11])


def shard_bytes(sequences: list[CapturedSequence], *, layer_ids: list[int], hidden_size: int) -> bytes:
    """A shard serialised exactly as capture writes it to disk (safetensors, the same metadata)."""
    from safetensors.torch import save

    meta = {
        "format": SHARD_FORMAT,
        "ids": json.dumps([s.id for s in sequences]),
        "target_layer_ids": json.dumps(list(layer_ids)),
        "hidden_size": str(hidden_size),
    }
    return save(pack(sequences), metadata=meta)


def parse_shard(name: str, data: bytes, *, layer_ids: list[int], hidden_size: int) -> list[CapturedSequence]:
    """The sequences of shard bytes (checked by `unpack` against the layout)."""
    from safetensors import SafetensorError
    from safetensors.torch import load

    try:
        header = loads_json(data[8 : 8 + int.from_bytes(data[:8], "little")])
        tensors = load(data)
    except (SafetensorError, ValueError, UnicodeDecodeError) as exc:
        raise DataError(f"{name}: unreadable shard ({str(exc).splitlines()[0][:120]})", HINT) from None
    return unpack(
        name, tensors, header.get("__metadata__") or {}, layer_ids=layer_ids, hidden_size=hidden_size, hint=HINT
    )


def _damage(data: bytes, entry: dict[str, Any]) -> str:
    """What is wrong with shard bytes that do not match their producer's entry (size, then sha256)."""
    want = int(entry["bytes"])
    if len(data) < want:
        return f"truncated: {len(data):,} of the {want:,} bytes its producer published"
    if len(data) > want:
        return f"{len(data):,} bytes, its producer published {want:,}"
    return f"checksum mismatch: sha256 {hashlib.sha256(data).hexdigest()[:12]}..., published {entry['sha256'][:12]}..."


def _producer_state(status: dict[str, Any] | None) -> str:
    """A producer's state in a few words, from its status object (None: it never wrote one)."""
    if not status:
        return "has written no status yet (never started?)"
    age = time.time() - float(status.get("heartbeat", 0.0))
    done = len(status.get("shards") or {})
    return f"last wrote its status {age:.0f} s ago ({done} shard(s) published)"


class StreamClosed(Exception):
    """The trainers finished (consumer.json `finished`): nothing more is read, so the producer stops."""


class StreamRewound(Exception):
    """The trainers resumed from a checkpoint and rewound the stream: the producer re-opens and captures
    again what the new window lacks."""


def consumer_finished(store: Store) -> bool:
    return bool((read_json(store, CONSUMER_KEY) or {}).get("finished"))


class StreamProducer:
    """Producer `worker` of `workers`: what `run_capture` writes through as its `queue` (open / put / fail / finish)."""

    def __init__(
        self, store: Store, *, worker: int, workers: int, max_shards: int, poll_s: float = 0.05, restarts: int = 0
    ) -> None:
        if not 0 <= worker < workers or max_shards < 1:
            raise ValueError(f"producer {worker} of {workers}, max_shards {max_shards}")
        self.store, self.worker, self.workers, self.max_shards = store, worker, workers, max_shards
        self.poll_s, self.restarts = poll_s, restarts
        self.directory = getattr(store, "location", str(store))  # what run_capture's summary names
        self.status: dict[str, Any] = {}
        self.generation, self._rewound = 0, False

    def open(self, *, fingerprint: str, contract: Contract, layout: dict[str, Any], num_shards: int) -> set[int]:
        """Create or resume this producer's status; return the shard indices run_capture must skip:
        the other producers' shards, and this one's already published."""
        key = producer_key(self.worker)
        previous = read_json(self.store, key)
        if previous is not None and (
            previous.get("fingerprint") != fingerprint or previous.get("workers") != self.workers
        ):
            raise DataError(
                f"{self.directory}: a stream of another capture plan or producer count "
                f"({previous.get('workers')} producers)",
                "use a new stream location, or delete this one",
            )
        self.status = previous or {
            "kind": STREAM_KIND,
            "format_version": 1,
            "fingerprint": fingerprint,
            "contract": contract.to_dict(),
            "layout": layout,
            "num_shards": num_shards,
            "worker": self.worker,
            "workers": self.workers,
            "shards": {},
            "peak_bytes": 0,
            "peak_shards": 0,
            "restarts": 0,
        }
        consumer = consumer_state(self.store)
        self.generation, below = int(consumer.get("generation", 0)), int(consumer.get("released_below", 0))
        present = {shard_index(key) for key in self.store.keys(SHARD_PREFIX)}
        # an entry of a shard the trainers rewound past (released, then needed again) goes: it is captured again
        self.status["shards"] = {
            name: entry
            for name, entry in self.status["shards"].items()
            if int(name[6:11]) < below or int(name[6:11]) in present
        }
        # a shard in the store without its entry (killed between the two writes) is captured again too;
        # removed first, so that while it is written again the store never holds two copies of it
        for index in sorted(
            i for i in present if i % self.workers == self.worker and shard_name(i) not in self.status["shards"]
        ):
            self.store.remove(shard_key(index))
        present = {i for i in present if shard_name(i) in self.status["shards"]}
        self.status.update(
            {
                "finished": False,
                "error": None,
                "max_shards": self.max_shards,
                "generation": self.generation,
                "restarts": max(self.restarts, self.status.get("restarts", 0)),
                "producer": {"pid": os.getpid(), "host": socket.gethostname()},
            }
        )
        self.status.setdefault("wait_s", 0.0)
        self._rewound = False
        self._save()
        done = present | set(range(min(below, num_shards)))
        return {i for i in range(num_shards) if i % self.workers != self.worker} | done

    def _save(self) -> None:
        self.status["heartbeat"] = time.time()
        write_json(self.store, producer_key(self.worker), self.status)

    def _check_consumer(self, index: int) -> dict[str, Any]:
        consumer = consumer_state(self.store)
        if consumer.get("finished"):
            raise StreamClosed(f"the trainers finished before shard {index}")
        if int(consumer.get("generation", 0)) != self.generation:
            self._rewound = True
            raise StreamRewound(f"the trainers rewound the stream to shard {consumer.get('released_below', 0)}")
        return consumer

    def wait_for_slot(self, index: int) -> float:
        """Block until shard `index` is inside the window the consumers have released; seconds waited
        (the producer's idle time, added to its status as `wait_s`)."""
        started = time.perf_counter()
        try:
            while index >= int(self._check_consumer(index).get("released_below", 0)) + self.max_shards:
                time.sleep(self.poll_s)
        finally:
            self.status["wait_s"] = self.status.get("wait_s", 0.0) + time.perf_counter() - started
        return time.perf_counter() - started

    def wait_until_closed(self) -> None:
        """Every shard published: wait for the trainers to finish (return) or to rewind (StreamRewound)."""
        started = time.perf_counter()
        try:
            while True:
                try:
                    self._check_consumer(-1)
                except StreamClosed:
                    return
                time.sleep(max(self.poll_s, 0.2))
        finally:
            self.status["wait_s"] = self.status.get("wait_s", 0.0) + time.perf_counter() - started
            self._save()

    def put(self, index: int, sequences: list[CapturedSequence]) -> dict[str, Any]:
        """Publish shard `index` once the window has room; its checksum goes into this producer's status."""
        layout = self.status["layout"]
        data = shard_bytes(sequences, layer_ids=layout["target_layer_ids"], hidden_size=layout["hidden_size"])
        self.wait_for_slot(index)
        self.store.put(shard_key(index), data)
        rewound = None
        try:  # finished or rewound while it was written: the trainers' cleanup may have missed it
            self._check_consumer(index)
        except StreamClosed:
            self.store.remove(shard_key(index))
            raise
        except StreamRewound as exc:
            if index >= released_below(self.store) + self.max_shards:
                self.store.remove(shard_key(index))
                raise
            rewound = exc  # inside the new window: it stays, with its entry
        name = shard_name(index)
        mask_tokens = sum(int(s.loss_mask.sum()) for s in sequences)
        entry = {
            "file": name,
            "sequences": len(sequences),
            "tokens": sum(s.num_tokens for s in sequences),
            "loss_tokens": mask_tokens,
            "bytes": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
        }
        used, shards = self.store.used_bytes(), len(self.store.keys(SHARD_PREFIX))
        self.status["shards"][name] = entry
        self.status["peak_bytes"] = max(self.status["peak_bytes"], used)
        self.status["peak_shards"] = max(self.status["peak_shards"], shards)
        self._save()
        if rewound is not None:
            raise rewound
        return entry

    def finish(self) -> None:
        self.status["finished"] = True
        self._save()

    def fail(self, message: str) -> None:
        if getattr(self, "_rewound", False):  # StreamRewound: the producer re-opens, nothing failed
            return
        if consumer_finished(self.store):  # StreamClosed, or any end after the trainers are done
            self.status["closed"] = True
        else:
            self.status["error"] = message
        self._save()


class StreamReader:
    """A training rank's view of the stream: wait for a shard, verify it, parse it; release (rank 0)."""

    def __init__(
        self,
        store: Store,
        *,
        fingerprint: str,
        workers: int,
        expect: Contract | None = None,
        timeout_s: float = 3600.0,
        poll_s: float = 0.05,
        gave_up: Callable[[], str | None] | None = None,
    ) -> None:
        self.store, self.fingerprint, self.workers, self.expect = store, fingerprint, workers, expect
        self.timeout_s, self.poll_s = timeout_s, poll_s
        self.gave_up = gave_up  # the reason this process's producer supervisor stopped, if it did
        self.location = getattr(store, "location", str(store))
        self.status: dict[int, dict[str, Any]] = {}
        self.peak_bytes = 0
        self.wait_s = 0.0  # this rank's time waiting for shards

    def _producer(self, worker: int) -> dict[str, Any] | None:
        status = read_json(self.store, producer_key(worker))
        if status is None:
            return None
        if status.get("kind") != STREAM_KIND:
            raise DataError(f"{self.location}: not a dspark capture stream", "point capture.stream to the stream")
        if status.get("fingerprint") != self.fingerprint or status.get("workers") != self.workers:
            raise DataError(
                f"{self.location}: producer {worker} streams another capture plan or producer count "
                f"({status.get('workers')} producers, this recipe {self.workers})",
                "start the producers with this recipe (the same datagen output, capture settings "
                "and capture.workers), or use a new stream",
            )
        if self.expect is not None and worker not in self.status:
            self.expect.check_against(status["contract"], self.location)
        if status.get("error"):
            raise DataError(
                f"{self.location}: capture producer {worker} failed: {status['error']}",
                "fix it and restart the producers: they resume where they stopped",
            )
        self.status[worker] = status
        return status

    def read(self, index: int) -> list[CapturedSequence]:
        """Shard `index`'s sequences, once its producer published it; size and sha256 checked first.
        The time spent waiting is this rank's idle time (`wait_s`)."""
        worker, name = index % self.workers, shard_name(index)
        where = f"{self.location}/{shard_key(index)}"
        started = time.monotonic()
        try:
            while True:
                entry = (self.status.get(worker) or {}).get("shards", {}).get(name)
                if entry is None:
                    status = self._producer(worker)
                    entry = (status or {}).get("shards", {}).get(name)
                if entry is not None:
                    data = self.store.get(shard_key(index))
                    if (
                        data is not None
                        and len(data) == entry["bytes"]
                        and hashlib.sha256(data).hexdigest() == entry["sha256"]
                    ):
                        break
                    fresh = ((self._producer(worker) or {}).get("shards") or {}).get(name)
                    if data is not None and fresh == entry:
                        raise DataError(
                            f"{where}: {_damage(data, entry)} (corrupt or altered shard)",
                            f"delete it from the stream and restart capture producer {worker} (`dspark produce "
                            f"RECIPE --only {worker}`; `dspark train --resume auto` restarts the producers it "
                            "starts): it captures that shard again",
                        )
                    # gone, or captured again after a rewind: wait for the producer's new entry
                consumer = consumer_state(self.store)
                if index < int(consumer.get("released_below", 0)):
                    raise DataError(
                        f"{self.location}: shard {index} was already trained on and released",
                        "resume from a checkpoint (--resume auto): the stream is rewound and the "
                        "producers capture it again, or " + HINT,
                    )
                status = self.status.get(worker) or {}
                if (
                    entry is None
                    and status.get("finished")
                    and int(status.get("generation", 0)) == int(consumer.get("generation", 0))
                ):
                    raise DataError(f"{self.location}: producer {worker} finished without shard {index}", HINT)
                reason = self.gave_up() if self.gave_up is not None else None
                if reason:  # e.g. a producer that died before it wrote its status: nothing will come
                    raise DataError(
                        f"{self.location}: no shard {index}: {reason}",
                        "fix it and run again (--resume auto); the producer's output has its traceback",
                    )
                if time.monotonic() - started > self.timeout_s:
                    raise DataError(
                        f"{self.location}: waited {self.timeout_s:g} s for {shard_key(index)} from capture "
                        f"producer {worker}, which {_producer_state(self.status.get(worker))}",
                        "start the producers (`dspark produce RECIPE` where capture.external_producers is set) or "
                        "read their logs; capture.stream_timeout sets this wait",
                    )
                time.sleep(self.poll_s)
        finally:
            self.wait_s += time.monotonic() - started
        self.peak_bytes = max(self.peak_bytes, self.store.used_bytes())
        layout = self.status[worker]["layout"]
        return parse_shard(where, data, layer_ids=layout["target_layer_ids"], hidden_size=layout["hidden_size"])

    def release(self, below: int, *, step: int, finished: bool = False) -> None:
        """Remove shards below `below` (trained on by every rank that reads them), then let producers move on."""
        previous = read_json(self.store, CONSUMER_KEY) or {}
        start = int(previous.get("released_below", 0))
        for index in range(start, below):
            self.store.remove(shard_key(index))
        self.peak_bytes = max(self.peak_bytes, self.store.used_bytes())
        write_json(
            self.store,
            CONSUMER_KEY,
            {
                **previous,
                "released_below": max(below, start),
                "step": step,
                "finished": finished,
                "time": time.time(),
                "peak_bytes": max(self.peak_bytes, int(previous.get("peak_bytes", 0))),
            },
        )
        if finished:  # after `finished` is visible: what a producer still publishes it removes itself
            for key in self.store.keys(SHARD_PREFIX):
                self.store.remove(key)

    def rewind(self, below: int, *, step: int, window: int) -> bool:
        """Resuming at `step`: shards from `below` on are needed again. When some of them were released,
        move `released_below` back, start a new generation (producers re-open and capture what is
        missing) and remove the shards outside the new window, so the bound holds. Returns whether it
        rewound."""
        previous = read_json(self.store, CONSUMER_KEY) or {}
        if below >= int(previous.get("released_below", 0)) and not previous.get("finished"):
            self.release(below, step=step)
            return False
        generation = int(previous.get("generation", 0)) + 1
        write_json(
            self.store,
            CONSUMER_KEY,
            {
                **previous,
                "released_below": below,
                "step": step,
                "finished": False,
                "generation": generation,
                "time": time.time(),
                "rewinds": int(previous.get("rewinds", 0)) + 1,
            },
        )
        for key in self.store.keys(SHARD_PREFIX):  # after the new generation is visible (producers re-check)
            if not below <= shard_index(key) < below + window:
                self.store.remove(key)
        return True

    def summary(self) -> dict[str, Any]:
        """Peak store bytes as the producers and this reader sampled them, and the producers' state."""
        producers = [read_json(self.store, producer_key(w)) or {} for w in range(self.workers)]
        consumer = read_json(self.store, CONSUMER_KEY) or {}
        return {
            "location": self.location,
            "producers": self.workers,
            "peak_bytes": max(
                [self.peak_bytes, int(consumer.get("peak_bytes", 0))] + [int(p.get("peak_bytes", 0)) for p in producers]
            ),
            "peak_shards": max([0] + [int(p.get("peak_shards", 0)) for p in producers]),
            "max_shards": max([0] + [int(p.get("max_shards", 0)) for p in producers]),
            "producer_restarts": sum(int(p.get("restarts", 0)) for p in producers),
            "producer_wait_s": [round(float(p.get("wait_s", 0.0)), 2) for p in producers],
            "rewinds": int(consumer.get("rewinds", 0)),
        }
