"""A real `mooncake_master` on loopback for the tests that need one (test_mooncake_store.py, test_train_stream.py).

The Mooncake checks need the optional extra (`pip install -e '.[mooncake]'`) and the RDMA user library
its client links even for TCP (`apt-get install libibverbs1`); `scripts/dev.sh test` installs both where
it can (root with apt-get), and elsewhere the checks skip with the reason found here.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest


def mooncake_missing() -> str | None:
    """Why the Mooncake client cannot run here, or None."""
    if importlib.util.find_spec("mooncake") is None:
        return (
            "mooncake-transfer-engine-non-cuda is not installed (`scripts/dev.sh test` installs the "
            "`mooncake` extra where it can: pip install -e '.[mooncake]')"
        )
    try:
        importlib.import_module("mooncake.store")
    except ImportError as exc:
        return f"mooncake.store does not load here ({exc}); as root: apt-get install libibverbs1"
    return None


MISSING = mooncake_missing()
needs_mooncake = pytest.mark.skipif(MISSING is not None, reason=MISSING or "")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def mooncake_master(log_path: Path) -> Iterator[str]:
    """Start `mooncake_master` (the wheel's binary) on loopback; yield `mooncake://127.0.0.1:RPC/test-stream?admin_port=A`."""
    binary = Path(importlib.util.find_spec("mooncake").submodule_search_locations[0]) / "mooncake_master"
    rpc, admin = free_port(), free_port()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [
                str(binary),
                f"-rpc_port={rpc}",
                "-rpc_address=127.0.0.1",
                f"-metrics_port={admin}",
                "-metrics_host=127.0.0.1",
                "-rpc_thread_num=2",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{admin}/health", timeout=2).read()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"mooncake_master did not start: {log_path.read_text(errors='replace')[-2000:]}")
                time.sleep(0.2)
        yield f"mooncake://127.0.0.1:{rpc}/test-stream?admin_port={admin}"
    finally:
        proc.terminate()
        proc.wait(timeout=20)
