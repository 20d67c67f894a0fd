"""Artifact manifests: what made a directory, the contract it carries, checksums of its files.

Every stage writes `manifest.json` next to its outputs so the next stage can check it instead of
trusting the user to repeat flags. Writes are atomic (temp file + rename).

    write_json_atomic(out / "manifest.json", {...})
    sha256_file(out / "shard-00000.jsonl")
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dspark_cli.errors import DataError, UsageError
from dspark_cli.recipe.bounded import read_json

MANIFEST_NAME = "manifest.json"


def sha256_file(path: str | os.PathLike[str], chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def make_public(path: str | os.PathLike[str]) -> None:
    """Give a file made by mkstemp / a dir made by mkdtemp (0600 / 0700) -- or by safetensors'
    `save_file`, which also writes 0600 -- the permissions a plain open() / mkdir() would have, so
    artifacts stay readable by the other users of a shared cluster (and by a vLLM running as another user)."""
    mode = 0o777 if os.path.isdir(path) else 0o666
    os.chmod(path, mode & ~_umask())


def write_json_atomic(path: str | os.PathLike[str], data: Any) -> None:
    """Write JSON to `path` so that readers see the old file or the new one, never half of one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    make_public(tmp)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(data, handle, indent=2, sort_keys=False)
            handle.write("\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def safetensors_os_error(exc: Exception, path: str | os.PathLike[str]) -> OSError:
    """A safetensors write failure (`SafetensorError`, not an OSError: a full disk would be an "internal error")
    as the OSError it wraps (`IoError(Os { code: 28, ...})` -> ENOSPC on `path`), so it reads as one line."""
    import re

    match = re.search(r"(?:code: |os error )(\d+)", str(exc))
    if match:
        code = int(match.group(1))
        return OSError(code, os.strerror(code), os.fspath(path))
    return OSError(
        f"cannot write {os.fspath(path)}: {str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__}"
    )


def read_manifest(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """The manifest of an artifact directory; one-line DataError when missing or unreadable."""
    path = Path(directory) / MANIFEST_NAME
    if not path.is_file():
        raise DataError(
            f"{directory}: no {MANIFEST_NAME}; not a dspark artifact (or an unfinished one)",
            "re-run the stage that makes it",
        )
    try:
        data = read_json(path)
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}: corrupt manifest ({exc.msg} at line {exc.lineno})", "re-run the stage") from None
    if not isinstance(data, dict):
        raise DataError(f"{path}: corrupt manifest (not a JSON object)", "re-run the stage")
    return data


def resumable_manifest(
    out_dir: Path, *, kind: str, fingerprint: str, shard_glob: str, section: str, changed: str
) -> dict[str, Any]:
    """The manifest a previous run of the same plan left in a resumable stage's `out_dir` ({} if none).

    One-line errors for a directory holding shards but no manifest, or the output of another plan
    (`changed` says what such a plan differs in). `section` names the recipe section (`datagen`).
    """
    path = Path(out_dir) / MANIFEST_NAME
    if not path.is_file():
        if any(Path(out_dir).glob(shard_glob)):
            raise DataError(
                f"{out_dir} has shards but no manifest", f"use a new {section}.output_dir or delete this one"
            )
        return {}
    previous = read_manifest(out_dir)
    if previous.get("kind") != kind or previous.get("fingerprint") != fingerprint:
        raise UsageError(
            f"{out_dir} holds {section} output of a different plan ({changed} changed)",
            f"use a new {section}.output_dir, or delete it to start over",
        )
    return previous


# -- outputs are owned: a stage replaces only a directory it made -------------------------------------------


def manifest_kind(directory: Path, manifest_name: str = MANIFEST_NAME) -> str | None:
    """The `kind` recorded in `directory`'s manifest, or None (no manifest, unreadable, not an object)."""
    try:
        data = read_json(directory / manifest_name)
    except (OSError, ValueError):
        return None
    return data.get("kind") if isinstance(data, dict) else None


def _contains(outer: Path, inner: Path) -> bool:
    return outer == inner or outer in inner.parents


def claim_output_dir(
    out: str | os.PathLike[str],
    *,
    kind: str,
    what: str,
    force: bool,
    manifest_name: str = MANIFEST_NAME,
    inputs: tuple[str | os.PathLike[str], ...] = (),
    own: tuple[str, ...] | None = None,
) -> bool:
    """May a stage that makes `kind` output write `out`? True: it exists and will be replaced; False: it is new.

    A stage only ever replaces a directory it recognises as its own output (`kind` in its manifest) or
    an empty one, and never the current directory, its parents, its own input or a parent of its input
    -- `--force` included; given `own` (the names the stage writes there), not one holding anything else
    either (a README.md put beside an earlier draft). Anything else is a one-line UsageError naming why.
    """
    out = Path(out)
    where = out.resolve()
    cwd = Path.cwd().resolve()
    if _contains(where, cwd):
        raise UsageError(
            f"refusing to write {what} to {out}: it is the current directory or one of its parents",
            "pass -o a new directory",
        )
    for source in inputs:
        if _contains(where, Path(source).resolve()):
            raise UsageError(
                f"refusing to write {what} to {out}: it is (or holds) this stage's input {source}",
                "pass -o a new directory",
            )
    if not out.exists() and not out.is_symlink():
        return False
    if out.is_symlink() or not out.is_dir():
        raise UsageError(
            f"{out} exists and is not a directory{' (a symlink)' if out.is_symlink() else ''}; refusing to replace it",
            "pass -o a new directory",
        )
    if manifest_kind(out, manifest_name) == kind:
        if not force:
            raise UsageError(
                f"{out} already exists (an earlier {what})", "pass --force to replace it, or -o another directory"
            )
        others = sorted({p.name for p in out.iterdir()} - {manifest_name, *own}) if own is not None else []
        if others:
            shown = ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
            raise UsageError(
                f"refusing to replace {out}: besides the earlier {what} it holds {shown}, which --force would delete",
                f"move {'them' if len(others) > 1 else 'it'} out of {out}, or pass -o another directory",
            )
        return True
    if not any(out.iterdir()):
        return True  # empty: nothing to lose
    raise UsageError(
        f"{out} already exists and is not an earlier {what} (no {manifest_name} of kind {kind}); "
        f"refusing to replace it{' even with --force' if force else ''}",
        f"pass -o a new directory (--force only replaces an earlier {what})",
    )


# -- temporary directories: named by their owner, so the next run can clean those of killed runs -----------

STALE_AFTER_S = 24 * 3600  # no export runs this long: an older temp dir is stale whoever made it
_HOST = hashlib.sha256(os.uname().nodename.encode()).hexdigest()[:8]


def _owner_tag() -> str:
    return f"p{os.getpid()}h{_HOST}"


def make_temp_dir(final: Path, label: str = "tmp") -> Path:
    """A fresh temp dir beside `final` (`.NAME.tmp-p<pid>h<host>-XXXX`), with plain directory permissions."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.{label}-{_owner_tag()}-", dir=final.parent))
    make_public(tmp)
    return tmp


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's live process
    return True


def clean_stale_temp_dirs(final: Path, labels: tuple[str, ...] = ("tmp", "old")) -> list[Path]:
    """Remove the temp dirs beside `final` left by killed runs of the same stage; return them.

    Stale means: made on this host by a process that is gone (its pid is in the name), or older than
    STALE_AFTER_S whoever made it (other hosts of a shared filesystem, pids reused, names of older
    dspark versions without a pid). A temp dir of a live run is never touched.
    """
    import re
    import shutil
    import time

    removed: list[Path] = []
    if not final.parent.is_dir():
        return removed
    for label in labels:
        tag = re.compile(rf"^\.{re.escape(final.name)}\.{label}-p(\d+)h([0-9a-f]{{8}})-")
        for path in final.parent.glob(f".{final.name}.{label}-*"):
            if path.is_symlink() or not path.is_dir():
                continue
            match = tag.match(path.name)
            dead = bool(match and match.group(2) == _HOST and not _pid_alive(int(match.group(1))))
            try:
                old = time.time() - path.stat().st_mtime > STALE_AFTER_S
            except FileNotFoundError:
                continue
            if dead or old:
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path)
    return removed


def replace_dir(tmp: Path, final: Path) -> None:
    """Move the finished `tmp` to `final`, replacing what is there (checked by claim_output_dir) so that
    `final` is the old directory or the new one at every moment a reader can see, never a half-deleted one."""
    import shutil

    if not final.exists():
        os.replace(tmp, final)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{final.name}.old-{_owner_tag()}-", dir=final.parent))
    os.replace(final, old / final.name)
    try:
        os.replace(tmp, final)
    except BaseException:
        os.replace(old / final.name, final)
        raise
    shutil.rmtree(old, ignore_errors=True)


def ensure_writable_dir(directory: str | os.PathLike[str], what: str) -> Path:
    """Create `directory` and prove a file can be written there, before a stage spends time on its work."""
    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".dspark-write-probe-", dir=directory)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise UsageError(
            f"cannot write {what} to {directory}: {reason}",
            "choose a writable directory (or fix its permissions) before running",
        ) from None
    return directory


LOCK_NAME = ".dspark-lock"
OWNER_NAME = ".dspark-owner"  # {"kind": ...}: left first thing in a directory a resumable stage claims
# the launchers' lock in a shared capture directory (capture/gate.py): made before the capture
# stage claims the directory, so it is dspark's own bookkeeping, as LOCK_NAME is
CAPTURE_GATE_LOCK = ".capture-lock"
LOCKS = frozenset({LOCK_NAME, CAPTURE_GATE_LOCK})


def _mark_in_flight(name: str) -> bool:
    """The temporary file `write_json_atomic` writes an owner mark through (`.dspark-owner.XXXX.tmp`), or a write
    probe (`ensure_writable_dir`): what another node's claim of a shared directory leaves for a moment."""
    return (name.startswith(f".{OWNER_NAME}.") and name.endswith(".tmp")) or name.startswith(".dspark-write-probe-")


def ownership_problem(out: str | os.PathLike[str], kind: str, field: str, shard_glob: str | None = None) -> str | None:
    """Why a resumable stage (datagen, capture, train) making `kind` output may not write `out`; None when it may.

    It may write a directory that does not exist, an empty one, or one that is already its own: a manifest of
    `kind`, or the owner mark (`.dspark-owner`) it left before writing anything, or the lock of a run of an older
    dspark that was killed before its manifest. Anything else is someone's directory (a symlink to one too):
    never written into, not even a recipe.yaml."""
    out = Path(out).expanduser()
    if not out.exists():
        return None if not out.is_symlink() else f"{field}: {out} is a broken symlink; pass -o a new directory"
    if not out.is_dir():
        return f"{field}: {out} exists and is not a directory; pass -o a new directory"
    made = manifest_kind(out)
    if (out / MANIFEST_NAME).is_file() and made != kind:
        return (
            f"{field}: {out} holds {made or 'an unreadable manifest'}, not {kind.removeprefix('dspark.')} output; "
            f"set {field} to a new directory"
        )
    if made == kind or manifest_kind(out, OWNER_NAME) == kind:
        return None
    try:  # a mark being written by another process (its temporary file) is its claim under way, not a stranger's file
        names = {entry.name for entry in out.iterdir() if not _mark_in_flight(entry.name)}
    except OSError as exc:
        return f"{field}: cannot read {out} ({exc.strerror or type(exc).__name__}); pass -o a directory you can write"
    if shard_glob is not None and any(out.glob(shard_glob)):
        return f"{field}: {out} has shards but no manifest; use a new {field} or delete this one"
    if not names - LOCKS or (names & LOCKS and OWNER_NAME not in names):
        return None  # empty but for dspark's locks, or an older dspark's killed run
    return (
        f"{field}: {out} already exists and is not dspark {kind.removeprefix('dspark.')} output (no manifest.json "
        f"or {OWNER_NAME} of kind {kind}); refusing to write into it: pass -o a new (or empty) directory"
    )


@contextlib.contextmanager
def exclusive_output(out: str | os.PathLike[str], field: str, kind: str | None = None) -> Iterator[Path]:
    """Hold `out/.dspark-lock` while this process writes `out` (datagen, capture, train's rank 0).

    Given `kind`, `out` must first be this stage's own (`ownership_problem`, a one-line UsageError before anything
    is created), and it is marked as such (`.dspark-owner`) before the caller writes anything.

    A second dspark process writing the same directory would interleave shards or remove the first's
    temp files as a killed run's: it is refused, one line, before it touches anything. `flock`, so the
    lock goes with the process however it ends (SIGKILL too) and there is no stale lock to judge; on a
    filesystem without flock (ENOLCK/ENOTSUP, e.g. Lustre mounted without `flock`) the stage runs unlocked."""
    out = Path(out)
    if kind is not None and (problem := ownership_problem(out, kind, field)) is not None:
        raise UsageError(problem.removeprefix(f"{field}: "), f"{field} names a directory dspark did not make")
    out.mkdir(parents=True, exist_ok=True)
    fd = os.open(out / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "unknown"
            raise UsageError(
                f"{field}: {out} is being written by another dspark process ({holder})",
                f"wait for it to finish, or set {field} to another directory",
            ) from None
        except OSError as exc:
            if exc.errno not in (errno.ENOLCK, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS):
                raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {os.uname().nodename}\n".encode(), 0)
        if kind is not None and manifest_kind(out, OWNER_NAME) != kind:
            write_json_atomic(out / OWNER_NAME, {"kind": kind})
        yield out
    finally:
        os.close(fd)  # releases the flock
