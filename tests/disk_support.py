"""Real filesystems that refuse writes, for the disk-full and read-only tests: small tmpfs mounts (root only).

from disk_support import full_disk, mount_tmpfs
with full_disk(tmp_path / "full", make=["bench"]) as where: ...   # skips the test where it cannot mount

Where no tmpfs can be mounted the test skips, and under CI fails (tests/requirements_support.py).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from requirements_support import missing


def mount_tmpfs(where: Path, options: str) -> bool:
    """Make `where` and mount a tmpfs there with `options` (e.g. `ro,size=64k`); False where it cannot."""
    where.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    return (
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], capture_output=True, check=False
        ).returncode
        == 0
    )


@contextmanager
def full_disk(where: Path, *, make: tuple[str, ...] | list[str] = ()) -> Iterator[Path]:
    """`where` on a 64 kB tmpfs with the directories `make` in it, then filled: no space left. Skips the
    test (fails it under CI) where no tmpfs can be mounted; unmounts afterwards."""
    if not mount_tmpfs(where, "size=64k"):
        missing("tmpfs", "a small tmpfs cannot be mounted here (needs root): no full disk to write to")
    for name in make:
        (where / name).mkdir()
    with (where / "filler").open("wb") as handle:
        try:
            handle.write(b"\0" * 2**20)
        except OSError:
            pass
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=True)
