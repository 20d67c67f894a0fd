"""Processes as /proc shows them (Linux), for the tests that kill a parent and check what it started.

from procs_support import children, descendants, running, cmdline, hold_lock, hold_memory
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def _parents() -> dict[int, int]:
    out = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            out[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError):
            continue
    return out


def children(pid: int) -> list[int]:
    """Its live (not zombie) direct children."""
    return [p for p, parent in _parents().items() if parent == pid and running(p)]


def descendants(pid: int) -> list[int]:
    """Everything under it: children, their children, ..."""
    parents, found, frontier = _parents(), [], {pid}
    while frontier:
        frontier = {p for p, parent in parents.items() if parent in frontier}
        found += frontier
    return found


def running(pid: int) -> bool:
    """Alive and not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def hold_lock(directory: Path) -> subprocess.Popen:
    """Another dspark process writing `directory`: it holds the directory's lock until killed."""
    code = (
        "import sys, time; from dspark_cli.artifacts.files import exclusive_output\n"
        "with exclusive_output(sys.argv[1], 'x'):\n    print('held', flush=True); time.sleep(600)"
    )
    holder = subprocess.Popen([sys.executable, "-c", code, str(directory)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    return holder


def hold_memory(gib: int) -> tuple[subprocess.Popen, int]:
    """Another process holding `gib` GiB of RAM, every page touched (so it is resident, not just reserved),
    until killed; with its resident size in bytes, read from /proc once it is ready."""
    code = f"import sys, time\nblock = b'\\x01' * ({gib} << 30)\nprint('held', flush=True); time.sleep(3600)"
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    status = Path(f"/proc/{holder.pid}/status").read_text()
    rss_kib = int(next(line for line in status.splitlines() if line.startswith("VmRSS:")).split()[1])
    return holder, rss_kib << 10


def alive(pids: list[int]) -> list[int]:
    """Those of `pids` still running."""
    return [p for p in pids if running(p)]


def wait_gone(pids: list[int], timeout: float) -> list[int]:
    """Wait up to `timeout` seconds for `pids` to end; those still running then."""
    import time

    deadline = time.time() + timeout
    while (left := alive(pids)) and time.time() < deadline:
        time.sleep(0.1)
    return left
