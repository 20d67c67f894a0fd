"""A datagen output directory, read back: its manifest and its records, checked against the checksums.

    manifest = datagen_manifest(recipe)                 # None until `dspark datagen` has finished
    for record in iter_records("runs/tiny/data"): ...   # {id, source, messages, turns, samples}
    for record in iter_records("runs/tiny/data", split="validation"): ...   # the held-out conversations

Written by `dspark_cli.datagen` (JSONL shards, `artifacts.jsonl`, and `manifest.json`); read by
capture and by the tests.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from dspark_cli.artifacts.files import MANIFEST_NAME, read_manifest, sha256_file
from dspark_cli.artifacts.jsonl import read_jsonl
from dspark_cli.errors import DataError

if TYPE_CHECKING:
    from dspark_cli.recipe.schema import Recipe

KIND = "dspark.datagen"


def datagen_manifest(recipe: Recipe) -> dict[str, Any] | None:
    """The manifest of the recipe's finished datagen output, or None when there is none yet."""
    directory = Path(recipe.stage_dir("datagen"))
    if not (directory / MANIFEST_NAME).is_file():
        return None
    manifest = read_manifest(directory)
    if manifest.get("kind") != KIND or not manifest.get("complete"):
        return None
    return manifest


def validation_ids(manifest: dict[str, Any]) -> list[str]:
    """The sorted ids of the conversations a datagen manifest holds out as validation ([] for none)."""
    return list((manifest.get("validation") or {}).get("ids", []))


def iter_records(directory: str | Path, *, split: Literal["train", "validation"] = "train") -> Iterator[dict[str, Any]]:
    """Read a finished datagen directory back, verifying every shard's checksum against the manifest:
    the training shards, or (`split="validation"`) the held-out ones under `validation/` (none: nothing)."""
    directory = Path(directory)
    manifest = read_manifest(directory)
    if manifest.get("kind") != KIND or not manifest.get("complete"):
        raise DataError(f"{directory}: not a finished datagen output", "run (or finish) `dspark datagen` first")
    entries = manifest["shards"] if split == "train" else (manifest.get("validation") or {}).get("shards", [])
    for entry in entries:
        path = directory / entry["file"]
        if not path.is_file() or sha256_file(path) != entry["sha256"]:
            raise DataError(f"{path}: missing or checksum mismatch", "re-run `dspark datagen` to regenerate it")
        yield from read_jsonl(path)
