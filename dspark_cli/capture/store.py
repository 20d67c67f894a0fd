"""Where an online stream's objects live: a small key -> bytes store, files on a shared filesystem by default.

    from dspark_cli.capture.store import open_store
    store = open_store("runs/k3/stream")              # FileStore: a directory (local, NFS, Lustre, ...)
    store.put("shards/shard-00003.safetensors", data)  # atomic: readers see the whole object or nothing
    store.get("producers/0.json")                      # bytes, or None when absent
    store.keys("shards/")                              # sorted keys starting with the prefix
    store.remove("shards/shard-00003.safetensors")     # absent already: no error
    store.used_bytes()                                 # bytes held now (what the stream's bound limits)

The interface (`Store`) is all the online stream (capture/stream.py) needs, so another transport
(the Mooncake store for clusters without a shared filesystem) plugs in by implementing these five
methods with the same semantics:

- `put(key, data)`: store `data` under `key`, replacing any previous value, atomically: a concurrent
  `get` returns the old bytes, the new bytes or None, never a part. Keys are `/`-separated relative
  names (`shards/shard-00003.safetensors`, `producers/0.json`, `consumer.json`), no `..`.
- `get(key) -> bytes | None`: the bytes last put, or None when the key is absent (never raises for
  absence; raises OSError-like errors for a broken transport).
- `remove(key)`: delete the key; a missing key is not an error (several consumers may race).
- `keys(prefix) -> list[str]`: every key starting with `prefix`, sorted; objects being written are
  not listed.
- `used_bytes() -> int`: bytes the store holds for this stream now, objects being written included
  (for a file store: the directory's files, temp files included). The bound is checked against it.

`open_store(location)` picks the backend: a path (or `file://path`) is a FileStore; other schemes
(`mooncake://...`) are looked up in `BACKENDS`, which another module may extend.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Protocol


class Store(Protocol):
    def put(self, key: str, data: bytes) -> None: ...

    def get(self, key: str) -> bytes | None: ...

    def remove(self, key: str) -> None: ...

    def keys(self, prefix: str) -> list[str]: ...

    def used_bytes(self) -> int: ...


TEMP_SUFFIX = ".tmp"


def _check_key(key: str) -> None:
    if not key or key.startswith("/") or ".." in key.split("/") or key.endswith(TEMP_SUFFIX):
        raise ValueError(f"bad store key {key!r}")


class FileStore:
    """A directory as a Store: one file per key, written to a temp name, fsynced and renamed."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.location = str(self.root)

    def _path(self, key: str) -> Path:
        _check_key(key)
        return self.root / key

    def put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        for stale in path.parent.glob(f".{path.name}.*{TEMP_SUFFIX}"):  # left by a killed writer of this key
            stale.unlink(missing_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}{TEMP_SUFFIX}")
        try:
            with open(tmp, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.chmod(tmp, 0o644)
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def get(self, key: str) -> bytes | None:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            return None

    def remove(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def keys(self, prefix: str) -> list[str]:
        base = self.root / prefix.rsplit("/", 1)[0] if "/" in prefix else self.root
        out = []
        for folder, _, files in os.walk(base):
            for name in files:
                if name.endswith(TEMP_SUFFIX):
                    continue
                key = Path(folder, name).relative_to(self.root).as_posix()
                if key.startswith(prefix):
                    out.append(key)
        return sorted(out)

    def used_bytes(self) -> int:
        total = 0
        for folder, _, files in os.walk(self.root):
            for name in files:
                try:
                    total += os.stat(os.path.join(folder, name)).st_size
                except FileNotFoundError:
                    pass  # removed between listing and stat
        return total


def _mooncake(location: str) -> Store:
    from dspark_cli.capture.mooncake_store import open_mooncake_store

    return open_mooncake_store(location)


# scheme -> factory(location) for stores other than files; Mooncake's client is imported on first use
BACKENDS: dict[str, Callable[[str], Store]] = {"mooncake": _mooncake}


def open_store(location: str | os.PathLike[str]) -> Store:
    """The store at `location`: a directory path or `file://path`, or `scheme://...` of a registered backend."""
    text = str(location)
    scheme, sep, rest = text.partition("://")
    if not sep:
        return FileStore(text)
    if scheme == "file":
        return FileStore(rest)
    if scheme not in BACKENDS:
        from dspark_cli.errors import UsageError

        raise UsageError(
            f"stream {text}: no store backend for {scheme}://",
            f"use a directory on a shared filesystem, or one of: {', '.join(sorted(BACKENDS)) or 'none installed'}",
        )
    return BACKENDS[scheme](text)
