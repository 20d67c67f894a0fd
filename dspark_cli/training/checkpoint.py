"""Crash-safe checkpoints: torch distributed checkpoint (DCP), written atomically, with the contract.

    save_checkpoint(env, out_dir, step=100, module=draft, optimizer=opt, meta={...}, recipe=recipe)
    path = resolve_resume(out_dir, "auto")               # latest complete checkpoint or None
    meta = load_checkpoint(env, path, module=draft, optimizer=opt, contract=contract)

Layout under the training output directory:

    checkpoints/step-000100/    .metadata + __<rank>_0.distcp (DCP: model + optimizer, sharded as
                                trained), meta.json (step, data position, contract, metrics),
                                recipe.yaml (the resolved recipe), checksums.json (sha256 of
                                every other file, written last; see integrity.py)
    checkpoints/latest          the name of the newest complete checkpoint ("step-000100")

Atomicity: every rank writes into `checkpoints/.tmp-step-000100/` and hashes its own files; after
a barrier rank 0 adds meta.json, recipe.yaml and checksums.json (last), renames the directory into
place and then replaces `latest` (write + fsync + rename). A crash at any point leaves the previous
checkpoint and pointer intact, so a crash costs at most one checkpoint interval. A failed save (disk
full) removes its temp dir; the next run removes any that a killed run left (`clean_stale`).
Loading verifies the checksums before anything is unpickled and refuses a checkpoint without them
(integrity.py). The newest `KEEP` checkpoints are kept. The frozen target embeddings are buffers,
not parameters: they are never in a checkpoint. The directory is read back (`latest`, meta.json,
checksums.json) by `dspark_cli.artifacts.train`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from dspark_cli.artifacts.files import write_json_atomic
from dspark_cli.artifacts.train import (
    LATEST,
    META,
    checkpoint_hint,
    is_complete_checkpoint,
    latest_checkpoint,
    read_checkpoint_meta,
)
from dspark_cli.contract import Contract
from dspark_cli.errors import ContractError, DataError, UsageError
from dspark_cli.training.distributed import DistEnv, barrier
from dspark_cli.training.integrity import (
    SafePlanner,
    SafeReader,
    checkpoint_errors,
    hash_own_files,
    verify_checkpoint,
    write_checksums,
)

if TYPE_CHECKING:
    from dspark_cli.recipe.schema import Recipe

KEEP = 3


def step_name(step: int) -> str:
    return f"step-{step:06d}"


def _state(module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optim_state = get_state_dict(module, optimizer)
    return {"model": model_state, "optim": optim_state}


def save_checkpoint(
    env: DistEnv,
    out_dir: Path,
    *,
    step: int,
    module: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    meta: dict[str, Any],
    recipe: Recipe,
) -> Path:
    import torch.distributed.checkpoint as dcp

    from dspark_cli.recipe import write_resolved

    root = Path(out_dir) / "checkpoints"
    final = root / step_name(step)
    tmp = root / f".tmp-{step_name(step)}"
    if env.is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        with checkpoint_errors("save", final):
            tmp.mkdir(parents=True)
    barrier(env)
    try:
        with _quiet_single_process(env), checkpoint_errors("save", final):
            dcp.save(_state(module, optimizer), checkpoint_id=str(tmp), no_dist=not env.distributed)
        barrier(env)
        digests = hash_own_files(env, tmp)
        if env.is_main:
            with checkpoint_errors("save", final):
                write_json_atomic(tmp / META, {"step": step, **meta})
                write_resolved(recipe, tmp)
                write_checksums(tmp, digests)  # last: a checkpoint with checksums.json is complete
                if final.exists():
                    shutil.rmtree(final)
                os.replace(tmp, final)
                _fsync_dir(root)
                _write_pointer(root, final.name)
            _prune(root)
    except BaseException:
        if env.is_main:  # a failed save (disk full, Ctrl-C) leaves no temp dir to fill the disk
            shutil.rmtree(tmp, ignore_errors=True)
            (root / f".{LATEST}.tmp").unlink(missing_ok=True)
        raise
    barrier(env)
    return final


def clean_stale(out_dir: Path) -> list[str]:
    """Rank 0, before training: remove temp dirs that killed runs left (`checkpoints/.tmp-step-*`,
    `.final.tmp-*`, `.best.tmp-*`); no other process writes into this directory while a run owns it."""
    out_dir = Path(out_dir)
    stale = [
        *(out_dir / "checkpoints").glob(".tmp-step-*"),
        *out_dir.glob(".final.tmp-*"),
        *out_dir.glob(".best.tmp-*"),
        *(out_dir / "checkpoints").glob(f".{LATEST}.tmp"),
    ]
    for path in stale:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    return [p.name for p in stale]


@contextlib.contextmanager
def _quiet_single_process(env: DistEnv):
    """DCP warns that it assumes one process when there is no process group: here that is the intent."""
    with warnings.catch_warnings():
        if not env.distributed:
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_pointer(root: Path, name: str) -> None:
    tmp = root / f".{LATEST}.tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(name + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, root / LATEST)
    _fsync_dir(root)


def _prune(root: Path) -> None:
    done = sorted(p for p in root.glob("step-*") if is_complete_checkpoint(p))
    for old in done[:-KEEP]:
        shutil.rmtree(old, ignore_errors=True)


def resolve_resume(out_dir: Path, resume: str) -> Path | None:
    """`auto`: the latest checkpoint or None; `never`: None (refusing to overwrite one); else a path."""
    if resume == "auto":
        return latest_checkpoint(out_dir)
    if resume == "never":
        found = latest_checkpoint(out_dir)
        if found is not None:
            raise UsageError(
                f"{out_dir} already holds checkpoints (latest {found.name}); --resume never would overwrite them",
                "continue with --resume auto, or train into another directory with -o DIR",
            )
        return None
    path = Path(resume)
    if (path / "checkpoints").is_dir():
        found = latest_checkpoint(path)
        if found is None:
            raise UsageError(f"{path} has no complete checkpoint", "pass a checkpoints/step-NNNNNN directory")
        return found
    if not is_complete_checkpoint(path):
        raise UsageError(
            f"--resume {resume}: not a complete dspark checkpoint (needs {META} and .metadata)",
            "pass --resume auto, never, or a checkpoints/step-NNNNNN directory",
        )
    return path


def check_contract(meta: dict[str, Any], contract: Contract, where: Path) -> None:
    """One-line ContractError when the checkpoint was trained under another contract."""
    if "contract" not in meta:
        raise ContractError(f"{where}: checkpoint has no contract", "resume from a checkpoint dspark wrote")
    found = Contract.from_dict(meta["contract"])
    contract.check_against(found, str(where))  # the target is identified by its config hash, not its name


def check_meta(meta: Any, where: Path, num_steps: int | None = None) -> None:
    """meta.json's step and data position are what save_checkpoint writes: the step its directory is named
    after (and, given `num_steps`, within the run), a position of non-negative integers. Checksums only prove
    the files are as written, and a re-signed meta.json is as written too."""

    def count(value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**53

    step = meta.get("step") if isinstance(meta, dict) else None
    position = meta.get("position") if isinstance(meta, dict) else None
    named = where.name.removeprefix("step-")
    problem = None
    if not count(step):
        problem = f"its step {step!r} is not a step count"
    elif named.isdigit() and int(named) != step:
        problem = f"its meta.json claims step {step:,} but the checkpoint is {where.name}"
    elif num_steps is not None and step > num_steps:
        problem = f"its meta.json claims step {step:,}, past the run's {num_steps:,} steps"
    elif (
        not isinstance(position, dict)
        or not all(count(position.get(k)) for k in ("epoch", "consumed"))
        or not count(meta.get("tokens", 0))
    ):
        problem = "its data position or token count is not a set of non-negative integers"
    if problem:
        raise DataError(f"{where}: not a checkpoint dspark wrote: {problem}", checkpoint_hint(where))


def load_checkpoint(
    env: DistEnv,
    path: Path,
    *,
    module: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    contract: Contract,
    settings: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Verify every file against checksums.json (before anything is unpickled), check the contract
    and (given `settings`, settings.py) the training settings, then load model + optimizer through
    the reader and planner that run no code from the files."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    from dspark_cli.training.settings import check_same_settings

    verify_checkpoint(env, path)
    meta = read_checkpoint_meta(path)
    check_meta(meta, Path(path))
    check_contract(meta, contract, path)
    if settings is not None:  # before the load: a changed draft shape would not even load
        check_same_settings(meta.get("settings"), settings, where=path, out_dir=Path(path).parent.parent)
    state = _state(module, optimizer)
    with _quiet_single_process(env), checkpoint_errors("load", path):
        SafeReader(str(path)).read_metadata()  # refused here, not inside dcp.load (which logs tracebacks and
        # falls back to other metadata files)
        dcp.load(state, storage_reader=SafeReader(str(path)), planner=SafePlanner(), no_dist=not env.distributed)
    set_state_dict(module, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    return meta
