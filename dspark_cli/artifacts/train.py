"""A training output directory, read back: its manifest, its checkpoints and their checksums.

    manifest = read_train_manifest("runs/tiny/train")   # a finished run's manifest.json, or one line
    path = latest_checkpoint("runs/tiny/train")          # checkpoints/step-NNNNNN that `latest` names, or None
    meta = read_checkpoint_meta(path)                    # its meta.json (step, data position, contract, ...)
    files = read_checksums(path)                         # name -> {bytes, sha256} from its checksums.json
    problem = checkpoint_file_problem(path, name, files[name])   # None, or the line naming a bad file

Layout (written by `dspark_cli.training`; the DCP files themselves are torch's, loaded there):

    manifest.json                 kind dspark.train, complete, contract, settings, init, summary,
                                  recipe, sha256 of the final/ files -- written last, when training finished
    final/                        model.safetensors (vLLM names) + config.json: the consolidated draft
    best/                         the same, at the best validation so far, + validation.json ({step, metric,
                                  value}); only with a validation split and `train.keep_best`
    checkpoints/step-NNNNNN/      .metadata + __<rank>_0.distcp (DCP), meta.json, recipe.yaml,
                                  checksums.json (sha256 and size of every other file, written last)
    checkpoints/latest            the name of the newest complete checkpoint

`init` says where the draft's first weights came from: `{"kind": "normal"}` or `{"kind": "target"}`, or for a
warm start (`train.init: pretrained`) `{"kind": "pretrained", "from": the source directory relative to the
train directory (or its name), "sha256": of its model.safetensors, "published": true when it had neither a
dspark_manifest.json nor a training manifest}`. A resumed run keeps the record of its first session (each
checkpoint's meta.json carries it); `init_record(manifest)` reads it back.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from dspark_cli.artifacts.files import MANIFEST_NAME, read_manifest, sha256_file
from dspark_cli.errors import DataError
from dspark_cli.recipe.bounded import read_json

KIND = "dspark.train"
CHECKPOINTS = "checkpoints"
LATEST = "latest"
META = "meta.json"
CHECKSUMS = "checksums.json"
CHECKSUMS_FORMAT = "dspark.checkpoint-checksums.v1"
DRAFT_WEIGHTS = ("model.safetensors", "config.json")  # what final/ and best/ hold
BEST_DIR = "best"
BEST_RECORD = "validation.json"  # in best/: {step, metric, value} of the validation that chose it


def read_train_manifest(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """The manifest.json of a finished training run in `directory`; one-line DataError when it is
    missing (training did not finish), corrupt, or the manifest of another kind of output."""
    directory = Path(directory)
    if not (directory / MANIFEST_NAME).is_file():
        raise DataError(
            f"{directory}: no {MANIFEST_NAME} (training did not finish)", "finish it with `dspark train --resume auto`"
        )
    manifest = read_manifest(directory)
    if manifest.get("kind") != KIND:
        raise DataError(
            f"{directory}/manifest.json is not the manifest of a dspark training run (kind {manifest.get('kind')!r})",
            "pass the directory `dspark train` wrote (runs/NAME/train)",
        )
    if not manifest.get("complete"):
        raise DataError(f"{directory}: training did not finish", "finish it with `dspark train --resume auto`")
    return manifest


def best_record(manifest: dict[str, Any]) -> dict[str, Any] | None:
    """The `best` record of a training manifest ({step, metric, value}: the validation that chose `best/`);
    None when the run kept none (no validation split, `train.keep_best: false`)."""
    best = manifest.get("best")
    return dict(best) if isinstance(best, dict) and isinstance(best.get("step"), int) else None


def init_record(manifest: dict[str, Any]) -> dict[str, Any] | None:
    """The `init` record of a training manifest (see the module docstring); None for a run that predates it."""
    init = manifest.get("init")
    return dict(init) if isinstance(init, dict) and isinstance(init.get("kind"), str) else None


# -- checkpoints ---------------------------------------------------------------------------------------


def is_complete_checkpoint(path: Path) -> bool:
    """Renamed into place (what `latest` may name); whether its files are intact is what the checksums say."""
    return (path / META).is_file() and (path / ".metadata").is_file()


def latest_checkpoint(out_dir: str | os.PathLike[str]) -> Path | None:
    """The checkpoint `latest` names; the newest complete one if the pointer is missing or stale."""
    root = Path(out_dir) / CHECKPOINTS
    pointer = root / LATEST
    if pointer.is_file():
        named = root / pointer.read_text(encoding="utf-8").strip()
        if is_complete_checkpoint(named):
            return named
    done = sorted(p for p in root.glob("step-*") if is_complete_checkpoint(p))
    return done[-1] if done else None


def read_checkpoint_meta(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A checkpoint's meta.json; one-line DataError when unreadable."""
    try:
        return read_json(Path(path) / META)
    except (OSError, json.JSONDecodeError) as exc:
        raise DataError(f"{path}: unreadable {META} ({exc})", "resume from another checkpoint") from None


def checkpoint_hint(path: Path) -> str:
    """What to do about a damaged checkpoint at `path`."""
    return (
        f"resume from an earlier checkpoint (--resume {path.parent}/step-NNNNNN), or start over in a new "
        "directory with -o DIR"
    )


def read_checksums(path: str | os.PathLike[str]) -> dict[str, dict[str, Any]]:
    """name -> {bytes, sha256} of every file of the checkpoint at `path`, from its checksums.json; one-line
    DataError when there is none (an older dspark, made by hand, or not finished) or it is unreadable."""
    path = Path(path)
    file = path / CHECKSUMS
    if not file.is_file():
        raise DataError(
            f"{path}: checkpoint has no {CHECKSUMS} (written by an older dspark, by hand, or not "
            "finished), so it cannot be checked; refusing to load it",
            checkpoint_hint(path),
        )
    try:
        data = read_json(file)
        files = data["files"]
        if data.get("format") != CHECKSUMS_FORMAT or not isinstance(files, dict):
            raise ValueError(f"format {data.get('format')!r}")
        return {str(name): {"bytes": int(e["bytes"]), "sha256": str(e["sha256"])} for name, e in files.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise DataError(f"{file}: unreadable checksums ({exc})", checkpoint_hint(path)) from None


def checkpoint_file_problem(path: Path, name: str, entry: dict[str, Any]) -> str | None:
    """None when the checkpoint's file `name` has the size and sha256 `entry` records, else the line saying why."""
    file = path / name
    if "/" in name or name.startswith(".."):
        return f"{path}: {CHECKSUMS} lists a file outside the checkpoint ({name!r})"
    if not file.is_file():
        return f"{file}: missing (listed in {CHECKSUMS})"
    size = file.stat().st_size
    if size != entry["bytes"]:
        return f"{file}: truncated or altered ({size} bytes, {CHECKSUMS} says {entry['bytes']})"
    if sha256_file(file) != entry["sha256"]:
        return f"{file}: checksum mismatch (corrupt checkpoint file)"
    return None
