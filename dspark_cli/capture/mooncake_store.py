"""The Mooncake store as an online stream's store, for clusters without a shared filesystem.

    store = open_mooncake_store("mooncake://10.0.0.5:50051/k3-run1")   # master host:rpc port / namespace
    store.put("shards/shard-00003.safetensors", data)
    store.get("producers/0.json")              # bytes, or None
    store.keys("shards/"); store.remove(key); store.used_bytes(); store.close()

Location (capture/mooncake_location.py): `mooncake://HOST[:PORT]/NAMESPACE[?admin_port=9003&segment=0&
protocol=tcp&device=&local_hostname=H&timeout=30]`: the `mooncake_master`'s RPC address and its HTTP admin
port (to list keys, which the client API cannot do), the memory this process lends (0: objects live in
long-lived `mooncake_client` processes), the transport, and the seconds dspark waits for the master. A
store opens only once both of the master's ports answer within that deadline (`probe_master`). Every key
lives under NAMESPACE, so several streams can share one master.

Same semantics as the file store (capture/store.py), built on Mooncake objects, which are immutable:
- `put` writes a new object `NAMESPACE/KEY@VERSION` (VERSION grows), then removes the older versions;
  `get` reads the newest version that is complete. So a reader sees the old bytes or the new ones, never
  a part, and never a missing key while it is being replaced. (Mooncake's own `upsert` is not used: under
  concurrent reads it made the key unreadable and kept its memory allocated.) An older version read in
  the last `-default_kv_lease_ttl` (10 s) keeps its lease and is removed by a later put or `remove`.
- Objects are put hard-pinned: the master never evicts an unconsumed shard; a full store is an error
  (the stream's bound must stay below the memory mounted).
- Data moves through one registered staging buffer per client (`put_from` / `get_into`), so objects of
  any size pass without Mooncake's local buffer.
"""

from __future__ import annotations

import ctypes
import http.client
import os
import socket
import threading
import time
import urllib.error
from typing import Any

from dspark_cli.capture.mooncake_location import (
    SCHEME,
    MooncakeLocation,
    admin_timeouts,
    parse_location,
    probe_master,
)
from dspark_cli.errors import DataError, DsparkError, UsageError
from dspark_cli.network import MAX_STREAM_BYTES, Stalled, exchange, read_limited

__all__ = ["MooncakeLocation", "MooncakeStore", "open_mooncake_store", "parse_location", "probe_master"]

VERSION_SEP = "@"
MAGIC = 0x01  # first byte of every object this store writes (so empty values fit, foreign objects show)
_NOT_FOUND = -704
_NOT_READY = -703  # a put still in flight
_NO_SPACE = -200
_GRANULE = 1 << 20
INSTALL_HINT = (
    "pip install 'dspark[mooncake]' (mooncake-transfer-engine-non-cuda; the CUDA build "
    "mooncake-transfer-engine works too), and the RDMA user library it links even for TCP: "
    "apt-get install libibverbs1"
)


def _check_key(key: str) -> None:
    """The store keys of capture/store.py (relative `/` names, no `..`), minus what Mooncake names reserve."""
    if (
        not key
        or key.startswith("/")
        or ".." in key.split("/")
        or key.endswith(".tmp")
        or VERSION_SEP in key
        or any(c.isspace() for c in key)
    ):
        raise ValueError(f"bad store key {key!r}")


def _load_client() -> tuple[Any, Any]:
    os.environ.setdefault("MC_LOG_LEVEL", "WARNING")  # Mooncake logs ~15 INFO lines per client otherwise
    try:
        from mooncake.store import MooncakeDistributedStore, ReplicateConfig
    except ImportError as exc:
        if getattr(exc, "name", None) in ("mooncake", "mooncake.store"):
            raise UsageError("the Mooncake store client is not installed", INSTALL_HINT) from None
        raise UsageError(f"the Mooncake store client does not load: {exc}", INSTALL_HINT) from None
    return MooncakeDistributedStore, ReplicateConfig


class MooncakeStore:
    """One Mooncake client as a Store (put / get / remove / keys / used_bytes) under one namespace."""

    def __init__(self, location: str | MooncakeLocation, *, timeout_s: float | None = None) -> None:
        self.where = parse_location(location) if isinstance(location, str) else location
        self.location = f"{SCHEME}://{self.where.master}/{self.where.namespace}"
        self.timeout_s = self.where.timeout_s if timeout_s is None else timeout_s
        client_class, config_class = _load_client()
        # both ports answer, or one line within timeout_s: the client's own setup cannot be interrupted
        # (it retries 20 x 30 s against a master that accepts and never answers, holding the GIL)
        problem = probe_master(self.where, self.timeout_s)
        if problem is not None:
            raise DsparkError(
                f"stream {self.location}: {problem[0]}",
                f"{problem[1]}; the location's ?timeout= sets how long dspark waits ({self.timeout_s:g} s)",
            )
        local = self.where.local_hostname or os.environ.get("MOONCAKE_LOCAL_HOSTNAME") or _own_address()
        client = client_class()
        status = client.setup(
            local,
            "P2PHANDSHAKE",
            self.where.segment_bytes,
            0,
            self.where.protocol,
            self.where.device,
            self.where.master,
        )
        if status != 0:
            raise DsparkError(
                f"stream {self.location}: the Mooncake client did not start (status {status})",
                f"check that mooncake_master serves {self.where.master} and that {local} "
                "is this machine's address (local_hostname=...)",
            )
        self._client = client
        self._config = config_class()
        self._config.with_hard_pin = True  # never evicted: an unconsumed shard must not vanish
        self._lock = threading.Lock()
        self._buffer: bytearray | None = None
        self._view: Any = None
        self._last_version = 0

    # --- the Store interface ---------------------------------------------------------------------------

    def put(self, key: str, data: bytes) -> None:
        _check_key(key)
        older = self._versions().get(key, [])
        with self._lock:
            version = max(time.time_ns(), older[-1] + 1 if older else 0, self._last_version + 1)
            self._last_version = version
            size = len(data) + 1
            address = self._staging(size)
            self._buffer[0] = MAGIC
            self._buffer[1:size] = data
            status = self._client.put_from(self._name(key, version), address, size, self._config)
        if status == _NO_SPACE:
            raise DsparkError(
                f"stream {self.location}: the Mooncake store is full ({size} bytes for {key})",
                "mount more memory (mooncake_client -global_segment_size) or lower the stream's "
                "bound (capture.queue_max_shards)",
            )
        self._check(status, "put", key)
        for old in older:  # a version read in the last lease period stays until a later put or remove
            self._client.remove(self._name(key, old))

    def get(self, key: str) -> bytes | None:
        _check_key(key)
        deadline = time.monotonic() + self.timeout_s
        while True:  # every listed version vanished: it was replaced meanwhile, so a newer one is listed
            versions = self._versions().get(key)
            if not versions:
                return None
            for version in reversed(versions):  # the newest first; a version still being written is skipped
                data = self._read(self._name(key, version))
                if data is not None:
                    return data
            if time.monotonic() > deadline:
                raise DsparkError(
                    f"stream {self.location}: {key} was replaced faster than it could be read for {self.timeout_s:g} s",
                    "a writer rewrites it in a loop; slow it down, or raise ?timeout=",
                )

    def remove(self, key: str) -> None:
        _check_key(key)
        for version in self._versions().get(key, []):
            status = self._client.remove(self._name(key, version), True)  # now, whatever a recent read's lease
            if status != _NOT_FOUND:
                self._check(status, "remove", key)

    def keys(self, prefix: str) -> list[str]:
        return sorted(key for key in self._versions() if key.startswith(prefix))

    def used_bytes(self) -> int:
        total = 0
        for key, versions in self._versions().items():
            for version in versions:
                size = self._client.get_size(self._name(key, version))
                total += max(size, 0)  # removed between listing and size: nothing held
        return total

    def close(self) -> None:
        with self._lock:
            if self._client is None:
                return
            if self._buffer is not None:
                self._client.unregister_buffer(ctypes.addressof(self._view))
                self._buffer = self._view = None
            self._client.close()
            self._client = None

    def __enter__(self) -> MooncakeStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- internals -------------------------------------------------------------------------------------

    def _name(self, key: str, version: int) -> str:
        return f"{self.where.namespace}/{key}{VERSION_SEP}{version:020d}"

    def _admin(self, path: str) -> str:
        url = f"http://{self.where.admin}/{path}"
        try:
            with exchange(url, admin_timeouts(self.timeout_s), waiting_for=f"/{path}", direct=True) as (response, _):
                return read_limited(response, MAX_STREAM_BYTES, url).decode("utf-8", errors="replace")
        except Stalled as exc:
            raise DsparkError(
                f"stream {self.location}: {exc.message}",
                f"is the Mooncake master at {self.where.admin} overloaded? dspark waits {self.timeout_s:g} s "
                "for it (?timeout=)",
            ) from None
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
            reason = getattr(exc, "reason", exc)
            waited = f"within {self.timeout_s:g} s" if isinstance(reason, TimeoutError) else f"({reason})"
            raise DsparkError(
                f"stream {self.location}: the Mooncake master's admin port {self.where.admin} "
                f"does not answer {waited} (dspark asked it for /{path})",
                "start mooncake_master there, or give its -metrics_port as ?admin_port=; "
                f"dspark waits {self.timeout_s:g} s for it (?timeout=)",
            ) from None

    def _versions(self) -> dict[str, list[int]]:
        """key -> its object versions, oldest first, from the master's key list."""
        prefix = self.where.namespace + "/"
        found: dict[str, list[int]] = {}
        for line in self._admin("get_all_keys").splitlines():
            if not line.startswith(prefix) or VERSION_SEP not in line:
                continue
            key, _, version = line[len(prefix) :].rpartition(VERSION_SEP)
            if version.isdigit():
                found.setdefault(key, []).append(int(version))
        return {key: sorted(versions) for key, versions in found.items()}

    def _staging(self, size: int) -> int:
        """The registered buffer's address, grown to hold `size` bytes (caller holds the lock)."""
        if self._buffer is None or len(self._buffer) < size:
            if self._buffer is not None:
                self._client.unregister_buffer(ctypes.addressof(self._view))
                self._buffer = self._view = None
            capacity = -(-size // _GRANULE) * _GRANULE
            buffer = bytearray(capacity)
            view = (ctypes.c_char * capacity).from_buffer(buffer)
            self._check(
                self._client.register_buffer(ctypes.addressof(view), capacity),
                "register_buffer of",
                f"{capacity} bytes",
            )
            self._buffer, self._view = buffer, view
        return ctypes.addressof(self._view)

    def _read(self, name: str) -> bytes | None:
        size = self._client.get_size(name)
        if size in (_NOT_FOUND, _NOT_READY):
            return None
        self._check(size, "size", name)
        with self._lock:
            address = self._staging(size)
            got = self._client.get_into(name, address, size)
            if got in (_NOT_FOUND, _NOT_READY):
                return None
            self._check(got, "get", name)
            if got != size or self._buffer[0] != MAGIC:
                raise DataError(
                    f"stream {self.location}: object {name} is not one this store wrote ({got} of {size} bytes)",
                    "use a namespace of its own for each stream",
                )
            return bytes(self._buffer[1:size])

    def _check(self, status: Any, what: str, key: str) -> None:
        if not isinstance(status, int) or status < 0:
            raise DsparkError(
                f"stream {self.location}: Mooncake {what} {key} failed (status {status})",
                "see the mooncake_master log; status codes are in Mooncake's types.h",
            )


def _own_address() -> str:
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def open_mooncake_store(location: str) -> MooncakeStore:
    """The store factory for `mooncake://` locations (capture/store.py's BACKENDS["mooncake"])."""
    return MooncakeStore(location)
