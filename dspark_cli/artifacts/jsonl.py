"""Sharded JSONL that survives being killed at any moment.

A shard is built in `.shard-NNNNN.jsonl.partial`, one complete JSON record per line, flushed and
fsynced after each batch; when every record of the shard is there the file is renamed to
`shard-NNNNN.jsonl`. On restart a partial file is read back (a torn last line is dropped), its
records are kept, and only the missing ones are generated: nothing is lost or written twice.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from dspark_cli.errors import DataError
from dspark_cli.recipe.bounded import loads_json


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
