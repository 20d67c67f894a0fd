"""The validation split in the online stream: producer 0 publishes it once, any training rank reads it.

    publish_validation(recipe, store, capturer)          # producer 0, before its training shards
    sequences = read_validation(reader, plan)            # any rank: a StreamReader and `validation_plan(recipe)`

Keys in the store, beside the training shards (capture/stream.py):
- `validation/shard-NNNNN.safetensors`: the validation plan's shards, the same bytes as an offline
  `<capture dir>/validation/` shard;
- `validation.json`: the validation plan's fingerprint, contract, layout, each shard's size and sha256, and
  `complete` once every shard is in.

The trainers never release or rewind these keys (`release` and `rewind` touch `shards/` only), so a
resumed run, or a rank that asks late, reads the same sequences. They are outside the stream's bound
(`capture.queue_max_shards` counts training shards): at most `datagen.validation_max` conversations.
A producer that finds a complete `validation.json` of the same plan with every shard present publishes
nothing (a restart, a rewind, another run on the same stream).
"""

from __future__ import annotations

import hashlib
import logging
import time
from typing import TYPE_CHECKING, Any

from dspark_cli.capture.shards import shard_layout, shard_name
from dspark_cli.capture.stream import HINT, STREAM_KIND, parse_shard, read_json, shard_bytes, write_json
from dspark_cli.errors import DataError

if TYPE_CHECKING:
    from dspark_cli.capture.plan import CapturePlan
    from dspark_cli.capture.store import Store
    from dspark_cli.capture.stream import StreamReader
    from dspark_cli.capture.types import CapturedSequence
    from dspark_cli.recipe.schema import Recipe

log = logging.getLogger(__name__)
VALIDATION_KEY = "validation.json"
VALIDATION_PREFIX = "validation/"


def validation_key(index: int) -> str:
    return VALIDATION_PREFIX + shard_name(index)


def _published(store: Store, plan: CapturePlan) -> bool:
    """Whether the store holds this plan's complete validation split, every shard of it whole."""
    status = read_json(store, VALIDATION_KEY)
    if not status or status.get("fingerprint") != plan.fingerprint or not status.get("complete"):
        return False
    present = set(store.keys(VALIDATION_PREFIX))
    return all(validation_key(s.index) in present for s in plan.shards)


def publish_validation(recipe: Recipe, store: Store, capturer: Any) -> int:
    """Capture the datagen validation split with `capturer` into the stream (producer 0); the number of
    sequences published now (0: there is no split, or it is there already)."""
    from dspark_cli.capture.capturer import capture_shard
    from dspark_cli.capture.plan import validation_plan

    plan = validation_plan(recipe)
    if plan is None or _published(store, plan):
        return 0
    for key in store.keys(VALIDATION_PREFIX):  # another plan's, or a killed publisher's: captured again
        store.remove(key)
    hidden = plan.geometry.hidden_size
    assert hidden is not None  # build_plan read it from the target's config
    status: dict[str, Any] = {
        "kind": STREAM_KIND,
        "split": "validation",
        "fingerprint": plan.fingerprint,
        "contract": plan.contract.to_dict(),
        "layout": shard_layout(plan.layer_ids, hidden),
        "num_shards": len(plan.shards),
        "shards": {},
        "complete": False,
    }
    write_json(store, VALIDATION_KEY, status)
    shards: dict[int, list[Any]] = {}
    for index, seq_id, ids, mask in plan.samples():
        shards.setdefault(index, []).append((seq_id, ids, mask))
    count = 0
    for shard in plan.shards:
        sequences = capture_shard(capturer, recipe.capture.batch_size, shards.get(shard.index, []))
        data = shard_bytes(sequences, layer_ids=plan.layer_ids, hidden_size=hidden)
        store.put(validation_key(shard.index), data)
        status["shards"][shard_name(shard.index)] = {
            "file": shard_name(shard.index),
            "sequences": len(sequences),
            "bytes": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
        }
        count += len(sequences)
        write_json(store, VALIDATION_KEY, status)
    status["complete"] = True
    write_json(store, VALIDATION_KEY, status)
    log.info("producer 0: %d validation sequences published (%s)", count, VALIDATION_PREFIX)
    return count


def read_validation(reader: StreamReader, plan: CapturePlan) -> list[CapturedSequence]:
    """The validation sequences producer 0 published for `plan`, in plan order, each shard's size and
    sha256 checked; waits for them as `reader.read` waits for a training shard (its timeout, the
    producers' errors and the supervisor giving up end the wait with one line)."""
    store, where = reader.store, f"{reader.location}/{VALIDATION_KEY}"
    started = time.monotonic()
    while True:
        status = read_json(store, VALIDATION_KEY)
        if status and status.get("fingerprint") == plan.fingerprint and status.get("complete"):
            break
        reader._producer(0)  # a failure producer 0 recorded: one line
        reason = reader.gave_up() if reader.gave_up is not None else None
        if reason:
            raise DataError(f"{where}: the validation split was not published: {reason}", HINT)
        if time.monotonic() - started > reader.timeout_s:
            raise DataError(
                f"{where}: waited {reader.timeout_s:g} s for capture producer 0 to publish the validation split",
                "start the producers (`dspark produce RECIPE`) with this recipe's datagen output, or read their "
                "logs; capture.stream_timeout sets this wait",
            )
        time.sleep(reader.poll_s)
    if reader.expect is not None:
        reader.expect.check_against(status["contract"], reader.location)
    layout = status["layout"]
    sequences: list[CapturedSequence] = []
    for shard in plan.shards:
        name, key = shard_name(shard.index), validation_key(shard.index)
        entry, data = status["shards"].get(name), store.get(key)
        if (
            entry is None
            or data is None
            or len(data) != entry["bytes"]
            or hashlib.sha256(data).hexdigest() != entry["sha256"]
        ):
            raise DataError(f"{reader.location}/{key}: missing, truncated or altered validation shard", HINT)
        sequences += parse_shard(
            f"{reader.location}/{key}", data, layer_ids=layout["target_layer_ids"], hidden_size=layout["hidden_size"]
        )
    return sequences
