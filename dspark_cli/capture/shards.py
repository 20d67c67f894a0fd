"""Hidden-state shards: safetensors files of many sequences, written and decoded by a reader that trusts nothing.

    write_shard(out / "shard-00000.safetensors", sequences, layer_ids=[1, 2, 3], hidden_size=160)
    for seq in iter_captured("runs/tiny/hidden", expect=contract): ...
    captured_lengths("runs/tiny/hidden", max_seq_len=2048)      # training's plan: lengths, no hidden states

One shard holds the sequences of one plan shard, concatenated along tokens (N tokens, S sequences,
M loss-masked tokens, n layers of width H):

    input_ids    [N]        int32      the sample's tokens
    loss_mask    [N]        bool       assistant tokens (where the draft is trained)
    seq_lens     [S]        int32      tokens per sequence, in order
    aux_hidden   [N, n*H]   bfloat16   outputs of target_layer_ids, concatenated in that order
    last_hidden  [M, H]     bfloat16   post-final-norm last state, loss-masked rows only

and the safetensors metadata `{"format": "dspark.capture.v1", "ids": [...], "target_layer_ids": [...],
"hidden_size": H}`. Files are written to a temp name, fsynced and renamed. Readers check size and
sha256 against the manifest before anything is yielded, then the layout; every failure is one line.
The capture directory and its manifest are read by `dspark_cli.artifacts.capture` (`read_capture`,
`verify_shard_file`, `verify_captured`); this module decodes the tensors.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from dspark_cli.artifacts.capture import RECAPTURE, read_capture, verify_shard_file
from dspark_cli.artifacts.files import make_public, safetensors_os_error, sha256_file
from dspark_cli.capture.types import CapturedSequence
from dspark_cli.contract import Contract
from dspark_cli.errors import DataError
from dspark_cli.recipe.bounded import loads_json

SHARD_FORMAT = "dspark.capture.v1"
HIDDEN_DTYPE = torch.bfloat16


def shard_name(index: int) -> str:
    return f"shard-{index:05d}.safetensors"


def shard_layout(layer_ids: list[int], hidden_size: int) -> dict[str, Any]:
    """The shard tensors as the capture manifest describes them (`layout`)."""
    return {
        "target_layer_ids": layer_ids,
        "hidden_size": hidden_size,
        "dtype": "bfloat16",
        "aux_hidden": "[tokens, len(target_layer_ids) * hidden_size], layers concatenated in target_layer_ids order",
        "last_hidden": "[loss tokens, hidden_size], post-final-norm, loss-masked rows only",
        "input_ids": "int32",
        "loss_mask": "bool",
        "seq_lens": "int32",
    }


def pack(sequences: list[CapturedSequence]) -> dict[str, torch.Tensor]:
    """Concatenate sequences into the shard tensors (last_hidden keeps loss-masked rows only)."""
    masks = torch.cat([s.loss_mask.bool() for s in sequences])
    return {
        "input_ids": torch.cat([s.input_ids for s in sequences]).to(torch.int32),
        "loss_mask": masks,
        "seq_lens": torch.tensor([s.num_tokens for s in sequences], dtype=torch.int32),
        "aux_hidden": torch.cat([s.aux_hidden for s in sequences]).to(HIDDEN_DTYPE).contiguous(),
        "last_hidden": torch.cat([s.last_hidden[s.loss_mask.bool()] for s in sequences]).to(HIDDEN_DTYPE).contiguous(),
    }


def write_shard(
    path: Path, sequences: list[CapturedSequence], *, layer_ids: list[int], hidden_size: int
) -> dict[str, Any]:
    """Write one shard atomically; return its manifest entry (file, sizes, counts, sha256)."""
    tensors = pack(sequences)
    meta = {
        "format": SHARD_FORMAT,
        "ids": json.dumps([s.id for s in sequences]),
        "target_layer_ids": json.dumps(list(layer_ids)),
        "hidden_size": str(hidden_size),
    }
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        save_file(tensors, str(tmp), metadata=meta)
    except SafetensorError as exc:  # a full disk: one line naming it, no half shard left
        tmp.unlink(missing_ok=True)
        raise safetensors_os_error(exc, tmp) from None
    make_public(tmp)
    with open(tmp, "rb+") as handle:
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    return {
        "file": path.name,
        "sequences": len(sequences),
        "tokens": int(tensors["input_ids"].numel()),
        "loss_tokens": int(tensors["loss_mask"].sum()),
        "bytes": path.stat().st_size,
        "sha256": sha256_file(path),
    }


def read_shard(
    path: Path, entry: dict[str, Any], *, layer_ids: list[int], hidden_size: int, hint: str = RECAPTURE
) -> list[CapturedSequence]:
    """Verify `path` against its manifest `entry` (size, sha256), then its layout; return its sequences."""
    verify_shard_file(path, entry, hint)
    try:
        with safe_open(str(path), "pt") as handle:
            meta = handle.metadata() or {}
            tensors = {key: handle.get_tensor(key) for key in handle.keys()}  # noqa: SIM118 - not a dict
    except (SafetensorError, OSError, ValueError) as exc:
        raise DataError(f"{path}: unreadable shard ({str(exc).splitlines()[0][:120]})", hint) from None
    return unpack(path, tensors, meta, layer_ids=layer_ids, hidden_size=hidden_size, hint=hint)


def unpack(
    path: Path | str,  # where the shard came from, for error messages (a stream key is a name)
    tensors: dict[str, torch.Tensor],
    meta: dict[str, str],
    *,
    layer_ids: list[int],
    hidden_size: int,
    hint: str = RECAPTURE,
) -> list[CapturedSequence]:
    """Split shard tensors back into sequences, checking every shape against the contract's layout."""

    def bad(what: str) -> DataError:
        return DataError(f"{path}: {what} (the shard does not match its manifest)", hint)

    if meta.get("format") != SHARD_FORMAT:
        raise bad(f"not a dspark capture shard (format {meta.get('format')!r})")
    try:  # a shard may come from elsewhere: its metadata is JSON from outside
        captured, names = loads_json(meta.get("target_layer_ids", "null")), loads_json(meta.get("ids", "[]"))
    except json.JSONDecodeError as exc:
        raise bad(f"unreadable metadata ({exc.msg})") from None
    if not isinstance(names, list):
        raise bad(f"its ids are not a list ({type(names).__name__})")
    if captured != list(layer_ids) or meta.get("hidden_size") != str(hidden_size):
        raise bad(
            f"captured layers {meta.get('target_layer_ids')} x {meta.get('hidden_size')}, "
            f"expected {list(layer_ids)} x {hidden_size}"
        )
    missing = {"input_ids", "loss_mask", "seq_lens", "aux_hidden", "last_hidden"} - set(tensors)
    if missing:
        raise bad(f"missing tensors {sorted(missing)}")
    ids, mask, lens = tensors["input_ids"], tensors["loss_mask"], tensors["seq_lens"]
    aux, last = tensors["aux_hidden"], tensors["last_hidden"]
    tokens, loss = int(ids.numel()), int(mask.sum())
    if (aux.dtype, last.dtype) != (HIDDEN_DTYPE, HIDDEN_DTYPE):
        raise bad(f"hidden states are {aux.dtype}/{last.dtype}, expected bfloat16")
    if (
        mask.numel() != tokens
        or int(lens.sum()) != tokens
        or len(names) != lens.numel()
        or tuple(aux.shape) != (tokens, len(layer_ids) * hidden_size)
        or tuple(last.shape) != (loss, hidden_size)
    ):
        raise bad(
            f"inconsistent shapes (ids {tuple(ids.shape)}, aux {tuple(aux.shape)}, last {tuple(last.shape)}, "
            f"{lens.numel()} lengths, {len(names)} names)"
        )
    out, start, loss_start = [], 0, 0
    for name, length in zip(names, lens.tolist(), strict=True):
        seq_mask = mask[start : start + length]
        n_loss = int(seq_mask.sum())
        full_last = torch.zeros(length, hidden_size, dtype=HIDDEN_DTYPE)
        full_last[seq_mask] = last[loss_start : loss_start + n_loss]
        out.append(
            CapturedSequence(
                name, ids[start : start + length].long(), seq_mask.clone(), aux[start : start + length], full_last
            )
        )
        start, loss_start = start + length, loss_start + n_loss
    return out


def captured_lengths(directory: str | Path, max_seq_len: int) -> list[int]:
    """Prepared lengths of an offline capture, read from each shard's `seq_lens` and `loss_mask` only.

    The plan needs every sequence's length before training (the LR schedule ends at the last step);
    reading the hidden states for that would be a whole extra epoch of I/O. A sequence trains when
    some position p has loss_mask[p] and a target state at p - 1, and capture stores the state on
    exactly the loss-masked rows, so `prepare` keeps it iff loss_mask[p] & loss_mask[p - 1] somewhere.
    """
    directory = Path(directory)
    lengths = []
    for entry in read_capture(directory)["shards"]:
        try:
            with safe_open(str(directory / entry["file"]), "pt") as handle:
                seq_lens, mask = handle.get_tensor("seq_lens").tolist(), handle.get_tensor("loss_mask").bool()
        except (SafetensorError, OSError, ValueError) as exc:  # damaged: its checksum would fail too
            raise DataError(
                f"{directory / entry['file']}: unreadable shard ({str(exc).splitlines()[0][:120]})", RECAPTURE
            ) from None
        start = 0
        for length in seq_lens:
            kept = min(length, max_seq_len)
            seq = mask[start : start + kept]
            if bool((seq[1:] & seq[:-1]).any()):
                lengths.append(kept)
            start += length
    return lengths


def iter_captured(directory: str | os.PathLike[str], *, expect: Contract | None = None) -> Iterator[CapturedSequence]:
    """Every captured sequence of an offline capture directory, shard by shard, each shard verified first."""
    directory = Path(directory)
    manifest = read_capture(directory, expect=expect)
    layout = manifest["layout"]
    for entry in manifest["shards"]:
        yield from read_shard(
            directory / entry["file"], entry, layer_ids=layout["target_layer_ids"], hidden_size=layout["hidden_size"]
        )
