"""Sharded JSONL that survives being killed at any moment.

A shard is built in `.shard-NNNNN.jsonl.partial`, one complete JSON record per line, flushed and
fsynced after each batch; when every record of the shard is there the file is renamed to
`shard-NNNNN.jsonl`. On restart a partial file is read back (a torn last line is dropped), its
records are kept, and only the missing ones are generated: nothing is lost or written twice.

An append-only log (training's metrics.jsonl) is read back with `read_log`: what a crash or a power
loss leaves at its end -- a run of NUL bytes (the filesystem extended the file, the data never landed)
or a torn last line -- is dropped with a warning, and the caller rewrites the file from the records
before appending; a damaged line with good ones after it is one DataError naming the file and line.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from dspark_cli.errors import DataError
from dspark_cli.recipe.bounded import loads_json

log = logging.getLogger(__name__)


def shard_path(directory: Path, index: int) -> Path:
    return directory / f"shard-{index:05d}.jsonl"


def partial_path(directory: Path, index: int) -> Path:
    return directory / f".shard-{index:05d}.jsonl.partial"


def read_jsonl(path: Path, *, tolerate_torn_tail: bool = False) -> list[dict[str, Any]]:
    """Records of a JSONL file. A torn last line (killed mid-write) is dropped when tolerated."""
    records = []
    with path.open("rb") as handle:
        data = handle.read()
    lines = data.split(b"\n")
    complete, tail = lines[:-1], lines[-1]
    for number, raw in enumerate(complete, start=1):
        if not raw.strip():
            continue
        try:
            records.append(loads_json(raw))  # nested too deeply: a JSONDecodeError, as corrupt
        except json.JSONDecodeError:
            if tolerate_torn_tail and number == len(complete) and not tail:
                break
            raise DataError(f"{path}:{number}: corrupt record", "delete the file and re-run to regenerate it") from None
    if tail.strip() and not tolerate_torn_tail:
        raise DataError(f"{path}: truncated (no newline after the last record)", "delete it and re-run")
    return records


def read_log(path: Path, *, hint: str) -> list[dict[str, Any]]:
    """The records (JSON objects) of an append-only JSONL log a crash may have cut short.

    Trailing NUL bytes and a last line that is not a whole JSON object (torn mid-write, or zeroed) are
    dropped with a warning naming the file and the line; the caller rewrites the file from the records
    it keeps before appending, so nothing is ever appended after garbage. A damaged line followed by
    good ones is not a crash's tail: one DataError naming the file and the line, with `hint`."""
    data = path.read_bytes()
    kept = data.rstrip(b"\x00\n\r\t ")  # NULs where a crash lost the last block, and blank lines
    lines = kept.split(b"\n") if kept else []
    records: list[dict[str, Any]] = []
    dropped: list[str] = []
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        record = _log_record(raw)
        if record is not None:
            records.append(record)
        elif number == len(lines):
            dropped.append(f"a torn last line (line {number}, {len(raw)} bytes)")
        else:
            raise DataError(f"{path}:{number}: damaged line (not a JSON record) in the middle of the file", hint)
    nuls = data.count(b"\x00", len(kept))
    if nuls:
        dropped.insert(0, f"{nuls:,} trailing NUL bytes")
    if dropped:
        log.warning("%s: dropped %s that a crash left at its end", path, " and ".join(dropped))
    return records


def _log_record(raw: bytes) -> dict[str, Any] | None:
    try:
        record = loads_json(raw)
    except json.JSONDecodeError:
        return None
    return record if isinstance(record, dict) else None


class PartialShard:
    """Append-only writer for one shard; `done_ids` are the records already on disk."""

    def __init__(self, directory: Path, index: int) -> None:
        self.directory = directory
        self.index = index
        self.partial = partial_path(directory, index)
        self.records: list[dict[str, Any]] = []
        if self.partial.exists():
            self.records = read_jsonl(self.partial, tolerate_torn_tail=True)
            self._rewrite()  # drop a torn tail so appends start on a clean line

    @property
    def done_ids(self) -> set[str]:
        return {record["id"] for record in self.records}

    def _rewrite(self) -> None:
        tmp = self.partial.with_suffix(".rewrite")
        with tmp.open("w", encoding="utf-8") as handle:
            for record in self.records:
                handle.write(json.dumps(record, ensure_ascii=False) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, self.partial)

    def append(self, records: Iterable[dict[str, Any]]) -> None:
        records = list(records)
        with self.partial.open("a", encoding="utf-8") as handle:
            for record in records:
                handle.write(json.dumps(record, ensure_ascii=False) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        self.records.extend(records)

    def finish(self, order: list[str]) -> Path:
        """Rename to the final shard, records in `order` (the plan's order, whatever the write order)."""
        by_id = {record["id"]: record for record in self.records}
        missing = [i for i in order if i not in by_id]
        if missing:
            raise DataError(f"shard {self.index}: {len(missing)} records missing before finishing")
        self.records = [by_id[i] for i in order]
        self._rewrite()
        final = shard_path(self.directory, self.index)
        os.replace(self.partial, final)
        return final
