"""What a checkpoint directory may make us do: checksums of its files, and loading that runs no code.

    digests = hash_own_files(env, tmp)                         # every rank, after dcp.save
    write_checksums(tmp, digests)                              # rank 0, the last file before the rename
    verify_checkpoint(env, path)                               # every rank, before anything is read
    with checkpoint_errors("load", path): dcp.load(state, storage_reader=SafeReader(path), planner=SafePlanner())

Checksums: `checksums.json` lists the sha256 and size of every file of the checkpoint (the DCP
`.metadata` and `__<rank>_<n>.distcp` files, meta.json, recipe.yaml; read and checked file by file
by `dspark_cli.artifacts.train`). It is written last, inside the temp directory, before the atomic
rename, so a complete checkpoint always has one. Before a load every listed file is checked (ranks
split the files and agree on the first failure), so a truncated, overwritten or bit-flipped file is
one DataError naming it -- before torch reads any of it. A checkpoint without `checksums.json` (an older dspark, or made by hand) is refused: there is no
way to tell it is intact.

Checksums stop accidents, not an attacker who rewrites checksums.json too, so loading itself runs
no code from the files either: torch DCP unpickles `.metadata` with plain `pickle` and non-tensor
state (optimizer hyperparameters) with `torch.load(weights_only=False)`. `SafeReader` unpickles
`.metadata` allowing only DCP's own metadata classes, torch dtypes / layouts / Size and paths;
`SafePlanner` loads non-tensor state with `weights_only=True`.

torch reports checkpoint failures as `CheckpointException`, a BaseException that no `except
Exception` catches; `checkpoint_errors` turns it (and OS errors) into one-line dspark errors.
"""

from __future__ import annotations

import contextlib
import io
import pickle
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

from dspark_cli.artifacts.files import sha256_file, write_json_atomic
from dspark_cli.artifacts.train import (
    CHECKSUMS,
    CHECKSUMS_FORMAT,
    checkpoint_file_problem,
    checkpoint_hint,
    read_checksums,
)
from dspark_cli.errors import DataError, DsparkError
from dspark_cli.training.distributed import DistEnv


def _gather(env: DistEnv, value: Any) -> list[Any]:
    if not env.distributed:
        return [value]
    import torch.distributed as dist

    out: list[Any] = [None] * env.world_size
    dist.all_gather_object(out, value)
    return out


def hash_own_files(env: DistEnv, directory: Path) -> dict[str, dict[str, Any]]:
    """Every rank hashes the DCP data files it wrote (`__<rank>_*.distcp`), in parallel; rank 0 gets
    the union (others get {}). Collective: every rank calls it."""
    mine = {p.name: _entry(p) for p in sorted(directory.glob(f"__{env.rank}_*.distcp"))}
    merged: dict[str, dict[str, Any]] = {}
    for part in _gather(env, mine):
        merged.update(part)
    return merged if env.is_main else {}


def _entry(path: Path) -> dict[str, Any]:
    return {"bytes": path.stat().st_size, "sha256": sha256_file(path)}


def write_checksums(directory: Path, digests: dict[str, dict[str, Any]]) -> None:
    """Rank 0: hash every file of `directory` not hashed yet, then write checksums.json (last)."""
    files = dict(digests)
    for path in sorted(directory.iterdir()):
        if path.is_file() and path.name not in files and path.name != CHECKSUMS:
            files[path.name] = _entry(path)
    write_json_atomic(directory / CHECKSUMS, {"format": CHECKSUMS_FORMAT, "files": files})


def verify_checkpoint(env: DistEnv, path: Path) -> None:
    """One-line DataError (on every rank) unless every file `checksums.json` lists is intact, and
    `.metadata` and meta.json are among them. Collective: every rank calls it; ranks split the files."""
    path = Path(path)
    files = read_checksums(path)
    problem = next(
        (f"{path}: {CHECKSUMS} does not list {name}" for name in (".metadata", "meta.json") if name not in files), None
    )
    if problem is None:
        names = sorted(files)
        problem = next(
            (
                p
                for name in names[env.rank :: env.world_size]
                if (p := checkpoint_file_problem(path, name, files[name]))
            ),
            None,
        )
    first = next((p for p in _gather(env, problem) if p), None)
    if first:
        raise DataError(first + "; nothing was loaded from it", checkpoint_hint(path))


# -- loading that runs no code ----------------------------------------------------------------------

_METADATA_CLASSES = {
    "torch.distributed.checkpoint.metadata": {
        "Metadata",
        "TensorStorageMetadata",
        "BytesStorageMetadata",
        "ChunkStorageMetadata",
        "TensorProperties",
        "StorageMeta",
        "MetadataIndex",
        "_MEM_FORMAT_ENCODING",
    },
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.distributed.checkpoint.planner": {"LoadItemType", "WriteItemType"},
    "torch.serialization": {"_get_layout"},
    "torch": {"Size"},
    "pathlib": {"PosixPath", "WindowsPath", "PurePosixPath", "Path"},
    "collections": {"OrderedDict"},
}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if name in _METADATA_CLASSES.get(module, ()):
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a checkpoint's .metadata")


class SafeReader(FileSystemReader):
    """torch's FileSystemReader, with `.metadata` unpickled by an allow-list (no code runs)."""

    def read_metadata(self, *args: Any, **kwargs: Any):
        from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

        with open(self._get_metadata_path(kwargs.get("rank")), "rb") as handle:
            metadata = _MetadataUnpickler(handle).load()
        if not isinstance(metadata, Metadata):
            raise pickle.UnpicklingError(f".metadata holds a {type(metadata).__name__}, not DCP metadata")
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class SafePlanner(DefaultLoadPlanner):
    """DCP's default load planner, loading non-tensor state (optimizer settings) with weights_only
    (DefaultLoadPlanner.load_bytes, with that one argument changed)."""

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        from torch.distributed.checkpoint._traverse import set_element

        obj = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj


# -- errors ------------------------------------------------------------------------------------------


def _first_failure(exc: BaseException) -> str:
    if isinstance(exc, CheckpointException):
        for pair in exc.failures.values():
            inner = pair[0] if isinstance(pair, tuple) else pair
            return _first_failure(inner)
    text = [line for line in str(exc).strip().splitlines() if line.strip()]
    return f"{type(exc).__name__}: {text[0][:160]}" if text else type(exc).__name__


@contextlib.contextmanager
def checkpoint_errors(action: str, path: Path) -> Iterator[None]:
    """One-line errors for a failed DCP save or load (CheckpointException is a BaseException)."""
    try:
        yield
    except (CheckpointException, OSError, pickle.UnpicklingError, EOFError) as exc:
        if action == "load":
            raise DataError(
                f"{path}: unreadable checkpoint ({_first_failure(exc)})", checkpoint_hint(Path(path))
            ) from None
        what = "writing final/" if path.name == "final" else f"saving checkpoint {path.name}"
        raise DsparkError(
            f"{what} failed ({_first_failure(exc)}{_free_space(path.parent)}); the previous checkpoint is intact",
            "free disk space (or fix the error), then re-run: --resume auto continues from the latest checkpoint",
        ) from None


def _free_space(directory: Path) -> str:
    """torch's writer reports a full disk as 'unexpected pos': say how much room there is."""
    try:
        return f"; {shutil.disk_usage(directory).free / 2**20:.1f} MiB free in {directory}"
    except OSError:
        return ""
