"""A real `mooncake_master` on loopback for the tests that need one (test_mooncake_store.py, test_train_stream.py).

The Mooncake checks need the optional extra (`pip install -e '.[mooncake]'`) and the RDMA user library
its client links even for TCP (`apt-get install libibverbs1`); `scripts/dev.sh test` installs both where
it can (root with apt-get). Elsewhere the checks skip with the reason (tests/requirements_support.py), and
under CI they fail instead.
"""

from __future__ import annotations

import contextlib
import importlib.util
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from requirements_support import requires

needs_mooncake = requires("mooncake")  # the lookup and its reasons: tests/requirements_support.py


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
