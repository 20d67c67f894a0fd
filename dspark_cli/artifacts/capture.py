"""A capture output directory, read back: its manifest, and its shard files checked against it.

    manifest = finished_capture("runs/tiny/hidden")             # None until a capture has finished there
    manifest = read_capture("runs/tiny/hidden", expect=contract)  # a finished capture of this contract, or one line
    verify_captured("runs/tiny/hidden", expect=contract)          # every shard's size and sha256, no tensor read
    missing = damaged_shards(directory, manifest)                 # listed shards whose files are gone

Written by `dspark_cli.capture` (`shard-NNNNN.safetensors` + `manifest.json`: kind, complete, contract,
layout, one entry per shard with its size and sha256). The tensors of a shard are decoded by
`capture/shards.py` (it needs torch), after `verify_shard_file` here has checked the file.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dspark_cli.artifacts.files import MANIFEST_NAME, read_manifest, sha256_file
from dspark_cli.errors import DataError

if TYPE_CHECKING:
    from dspark_cli.contract import Contract

KIND = "dspark.capture"

# What fixes a damaged offline shard: `dspark train` (and `dspark run`) capture a finished capture's
# missing shards again before training (training/run.py), so deleting the file is the whole repair.
RECAPTURE = "delete it and re-run `dspark train` (capture rewrites missing shards); nothing was read from it"


def check_capture_manifest(directory: Path, manifest: dict[str, Any], expect: Contract | None = None) -> None:
    """Refuse a manifest that is not a finished capture or was made under another contract (one line)."""
    if not isinstance(manifest, dict) or manifest.get("kind") != KIND:
        kind = manifest.get("kind") if isinstance(manifest, dict) else None
        raise DataError(
            f"{directory}: not a dspark capture output (kind {kind!r})",
            "point to the capture output directory (default <output_dir>/hidden)",
        )
    if not manifest.get("complete"):
        raise DataError(
            f"{directory}: capture did not finish", "re-run `dspark train` (capture resumes where it stopped)"
        )
    if expect is not None:
        expect.check_against(manifest["contract"], str(directory))


def read_capture(directory: str | os.PathLike[str], *, expect: Contract | None = None) -> dict[str, Any]:
    """The manifest of a finished capture in `directory` (made under `expect`, when given); one-line
    DataError / ContractError for a missing, unfinished, corrupt or foreign one."""
    directory = Path(directory)
    manifest = read_manifest(directory)
    check_capture_manifest(directory, manifest, expect)
    return manifest


def finished_capture(directory: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The manifest of the finished capture in `directory`, or None while there is none yet (no manifest,
    or a capture that has not finished: running it again resumes). A corrupt manifest or the manifest of
    another kind of output is a one-line DataError."""
    directory = Path(directory)
    if not (directory / MANIFEST_NAME).is_file():
        return None
    manifest = read_manifest(directory)
    if isinstance(manifest, dict) and manifest.get("kind") == KIND and not manifest.get("complete"):
        return None
    check_capture_manifest(directory, manifest)
    return manifest


def verify_shard_file(path: Path, entry: dict[str, Any], hint: str = RECAPTURE) -> None:
    """One-line DataError unless `path` exists with the size and sha256 its manifest `entry` records."""
    if not path.is_file():
        raise DataError(
            f"{path}: missing", "re-run `dspark train` (capture rewrites missing shards)" if hint == RECAPTURE else hint
        )
    size = path.stat().st_size
    if size != entry["bytes"]:
        raise DataError(f"{path}: truncated or altered ({size} bytes, the manifest says {entry['bytes']})", hint)
    if sha256_file(path) != entry["sha256"]:
        raise DataError(f"{path}: checksum mismatch (corrupt shard)", hint)


def damaged_shards(directory: Path, manifest: dict[str, Any]) -> list[str]:
    """Shards of a finished capture whose files are missing (to capture again); one-line DataError
    for one present with the wrong size. Sizes only (stat): checksums are checked as shards are read."""
    missing = []
    for entry in manifest.get("shards", []):
        path = Path(directory) / entry["file"]
        if not path.is_file():
            missing.append(entry["file"])
        elif path.stat().st_size != entry["bytes"]:
            verify_shard_file(path, entry)
    return missing


def verify_captured(directory: str | os.PathLike[str], *, expect: Contract | None = None) -> dict[str, Any]:
    """Check the manifest and every shard's size and sha256 without loading tensors (one pass over the
    files); a trainer that must not start on a damaged cache calls this first. Returns the manifest."""
    directory = Path(directory)
    manifest = read_capture(directory, expect=expect)
    for entry in manifest["shards"]:
        verify_shard_file(directory / entry["file"], entry)
    return manifest
