"""A datagen output directory, read back: its manifest and its records, checked against the checksums.

    manifest = datagen_manifest(recipe)                 # None until `dspark datagen` has finished
    for record in iter_records("runs/tiny/data"): ...   # {id, source, messages, turns, samples}

Written by `dspark_cli.datagen` (JSONL shards, `artifacts.jsonl`, and `manifest.json`); read by
capture and by the tests.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

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


def iter_records(directory: str | Path) -> Iterator[dict[str, Any]]:
    """Read a finished datagen directory back, verifying every shard's checksum against the manifest."""
    directory = Path(directory)
    manifest = read_manifest(directory)
    if manifest.get("kind") != KIND or not manifest.get("complete"):
        raise DataError(f"{directory}: not a finished datagen output", "run (or finish) `dspark datagen` first")
    for entry in manifest["shards"]:
        path = directory / entry["file"]
        if not path.is_file() or sha256_file(path) != entry["sha256"]:
            raise DataError(f"{path}: missing or checksum mismatch", "re-run `dspark datagen` to regenerate it")
        yield from read_jsonl(path)
