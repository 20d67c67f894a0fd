"""Offline capture before a run on several machines: exactly one launcher captures, the others wait.

    captured = capture_once(recipe, before=lambda: ensure_capture(recipe), say=print)

With `train.nnodes > 1` every machine runs the same `dspark train` command on a shared output
directory, and each launcher would run the capture stage into the one capture directory at once.
Instead the launcher that creates `<capture dir>/.capture-lock` first (O_CREAT | O_EXCL, atomic on a
local disk and on NFS v3+, where flock is not dependable) captures, and rewrites a heartbeat in
the lock every `HEARTBEAT_S` seconds; the others wait until the capture is complete, printing
progress every `PROGRESS_S` seconds, then start torchrun.

Stale rule: a lock whose content has not changed for `STALE_S` seconds by the waiter's own clock
(no comparison of machines' clocks) belongs to a launcher that died. The waiter removes it and
takes the lock itself; the capture resumes what the dead one wrote. A launcher whose capture
failed removes its lock on the way out, so a waiter takes over (and meets the same error, in its
own words, if the fault is not the machine's).
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from dspark_cli.artifacts.files import CAPTURE_GATE_LOCK as LOCK

if TYPE_CHECKING:
    from dspark_cli.recipe.schema import Recipe

HEARTBEAT_S = 5.0
STALE_S = 60.0
PROGRESS_S = 30.0
_WIDTH = 512  # the lock's content, padded: each heartbeat rewrites it in place


def capture_once(
    recipe: Recipe,
    before: Callable[[], None],
    *,
    say: Callable[[str], None] = print,
    stale_s: float = STALE_S,
    heartbeat_s: float = HEARTBEAT_S,
    progress_s: float = PROGRESS_S,
    poll_s: float = 0.5,
) -> bool:
    """Run `before` (the capture stage) here if no other launcher is running it; otherwise wait until the
    capture is complete. True when this launcher ran it."""
    from dspark_cli.capture import capture_pending

    directory = Path(recipe.stage_dir("capture"))
    directory.mkdir(parents=True, exist_ok=True)
    lock = directory / LOCK
    seen, since, said = None, time.monotonic(), float("-inf")
    while True:
        if not lock.exists() and capture_pending(recipe) is None:
            return False  # complete: another machine captured it (or nobody needed to)
        fd = _acquire(lock)
        if fd is not None:
            try:
                with _Heartbeat(fd, heartbeat_s):
                    before()
            finally:
                os.close(fd)
                lock.unlink(missing_ok=True)
            return True
        content = _read(lock)
        now = time.monotonic()
        if content != seen:
            seen, since = content, now
        elif content is not None and now - since > stale_s:
            say(f"capture: {lock} has not changed for {stale_s:.0f} s ({_holder(content)} is gone); taking over")
            _remove_if(lock, content)
            seen = None
            continue
        if now - said >= progress_s:
            say(
                f"capture: waiting for {_holder(content)} to capture into {directory} "
                f"({capture_pending(recipe) or 'complete'})"
            )
            said = now
        time.sleep(poll_s)


def _acquire(lock: Path) -> int | None:
    try:
        fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o644)
    except FileExistsError:
        return None
    _write(fd, 0)
    return fd


def _write(fd: int, beat: int) -> None:
    record = json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "beat": beat})
    os.pwrite(fd, record.ljust(_WIDTH).encode(), 0)
    os.fsync(fd)  # visible to the other machines' next read (NFS close-to-open)


def _read(lock: Path) -> str | None:
    try:
        return lock.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None


def _holder(content: str | None) -> str:
    try:
        data = json.loads(content or "")
        return f"the launcher on {data['host']} (pid {data['pid']})"
    except (ValueError, KeyError, TypeError):
        return "another launcher"


def _remove_if(lock: Path, content: str) -> None:
    """Remove the stale lock: moved aside first (only one waiter's rename succeeds), then deleted if it
    is the lock seen stale; a live lock moved by mistake goes back unless a new one exists."""
    aside = lock.with_name(f"{LOCK}.stale-{socket.gethostname()}-{os.getpid()}")
    try:
        os.rename(lock, aside)
    except FileNotFoundError:
        return  # another waiter removed it
    if _read(aside) != content:
        try:
            os.link(aside, lock)
        except FileExistsError:
            pass
    aside.unlink(missing_ok=True)


class _Heartbeat:
    """Rewrites the lock's content every `every` seconds while the capture runs."""

    def __init__(self, fd: int, every: float) -> None:
        self.fd, self.every = fd, every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="capture-lock-heartbeat", daemon=True)

    def _run(self) -> None:
        beat = 0
        while not self._stop.wait(self.every):
            beat += 1
            _write(self.fd, beat)

    def __enter__(self) -> _Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
