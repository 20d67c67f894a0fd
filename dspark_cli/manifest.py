"""Artifact manifests: what made a directory, the contract it carries, checksums of its files.

Every stage writes `manifest.json` next to its outputs so the next stage can check it instead of
trusting the user to repeat flags. Writes are atomic (temp file + rename).

    write_json_atomic(out / "manifest.json", {...})
    sha256_file(out / "shard-00000.jsonl")
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from dspark_cli.errors import DataError, UsageError

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


def read_manifest(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """The manifest of an artifact directory; one-line DataError when missing or unreadable."""
    path = Path(directory) / MANIFEST_NAME
    if not path.is_file():
        raise DataError(f"{directory}: no {MANIFEST_NAME}; not a dspark artifact (or an unfinished one)",
                        "re-run the stage that makes it")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}: corrupt manifest ({exc.msg} at line {exc.lineno})", "re-run the stage") from None


def resumable_manifest(out_dir: Path, *, kind: str, fingerprint: str, shard_glob: str, section: str,
                       changed: str) -> dict[str, Any]:
    """The manifest a previous run of the same plan left in a resumable stage's `out_dir` ({} if none).

    One-line errors for a directory holding shards but no manifest, or the output of another plan
    (`changed` says what such a plan differs in). `section` names the recipe section (`datagen`).
    """
    path = Path(out_dir) / MANIFEST_NAME
    if not path.is_file():
        if any(Path(out_dir).glob(shard_glob)):
            raise DataError(f"{out_dir} has shards but no manifest", f"use a new {section}.output_dir or delete this one")
        return {}
    previous = read_manifest(out_dir)
    if previous.get("kind") != kind or previous.get("fingerprint") != fingerprint:
        raise UsageError(f"{out_dir} holds {section} output of a different plan ({changed} changed)",
                         f"use a new {section}.output_dir, or delete it to start over")
    return previous
