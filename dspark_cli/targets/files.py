"""A local target's files, read so that a broken one is one line naming the file, not a traceback.

    config = read_target_config("dspark_cli/targets/tiny/tiny-mla")       # dict, or DataError / UsageError
    header = read_safetensors_header(Path("model.safetensors"))          # name -> {dtype, shape, data_offsets}
    check_target_files("dspark_cli/targets/tiny/tiny-mla")                # config + every weight file's header

`resolve_target` runs `check_target_files` on every local target, so each stage (and `dspark validate`)
meets a corrupt config.json, a directory without one, or truncated weights before any loader does,
and the JSON files transformers reads with Python's json (TRANSFORMERS_JSON: JSON nested thousands deep
would be a RecursionError inside transformers) are read once with bounds first.
Only headers are read (a few kB per file): truncation is caught, flipped bits in the data are not.
Import-light (no torch, no safetensors): the CLI validates recipes with it.
"""

from __future__ import annotations

import functools
import json
import re
import struct
from pathlib import Path
from typing import Any

from dspark_cli.errors import DataError, UsageError
from dspark_cli.recipe.bounded import loads_json, read_json

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"
# read by transformers with json.load when it loads the tokenizer or the generation config (tokenizer.json
# is read by the Rust tokenizers library, whose parser has a depth limit of its own)
TRANSFORMERS_JSON = (
    "tokenizer_config.json",
    "generation_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.json",
)
MAX_HEADER_BYTES = 100 * 2**20  # the safetensors format's own limit
_REDOWNLOAD = "restore the file: download the model again, or rebuild it"


def read_json_file(path: Path) -> Any:
    """A JSON file's content; text that is not UTF-8, invalid JSON or JSON nested too deeply (`read_json`) is a
    DataError naming the file and line."""
    try:
        return read_json(path)
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}: invalid JSON ({exc.msg} at line {exc.lineno})", _REDOWNLOAD) from None


def read_target_config(directory: str | Path) -> dict[str, Any]:
    """The target's config.json as a dict: a missing file is a UsageError, a broken one a DataError."""
    path = Path(directory) / CONFIG
    if not path.is_file():
        raise UsageError(
            f"{directory}: no {CONFIG}, so not a model directory",
            "point target.model at the directory that holds the model's config.json and weights",
        )
    config = read_json_file(path)
    if not isinstance(config, dict):
        raise DataError(f"{path}: expected a JSON object, got {type(config).__name__}", _REDOWNLOAD)
    return config


def read_safetensors_header(path: Path) -> dict[str, Any]:
    """The JSON header of a safetensors file, checked against the file's size (nothing else is read).

    A header longer than the file or than the format allows, invalid JSON, or a tensor whose bytes end
    past the end of the file (a truncated download) is a DataError naming the file.
    """
    size = path.stat().st_size
    with path.open("rb") as handle:
        prefix = handle.read(8)
        if len(prefix) < 8:
            raise DataError(f"{path}: {size} bytes, too short for a safetensors file", _REDOWNLOAD)
        (length,) = struct.unpack("<Q", prefix)
        if length > min(MAX_HEADER_BYTES, size - 8):
            raise DataError(
                f"{path}: its header claims {length:,} bytes, the file has {size:,} "
                "(truncated or not a safetensors file)",
                _REDOWNLOAD,
            )
        raw = handle.read(length)
    try:
        header = loads_json(raw)
    except json.JSONDecodeError:
        raise DataError(f"{path}: unreadable safetensors header (not JSON)", _REDOWNLOAD) from None
    if not isinstance(header, dict):
        raise DataError(f"{path}: unreadable safetensors header (not a JSON object)", _REDOWNLOAD)
    end = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        offsets = info.get("data_offsets") if isinstance(info, dict) else None
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(isinstance(o, int) and o >= 0 for o in offsets)
            or offsets[0] > offsets[1]
        ):
            raise DataError(f"{path}: tensor {name!r} has invalid data_offsets in the header", _REDOWNLOAD)
        end = max(end, offsets[1])
    if 8 + length + end > size:
        raise DataError(f"{path}: truncated ({size:,} bytes, its header describes {8 + length + end:,})", _REDOWNLOAD)
    return header


def _weight_files(directory: Path) -> list[Path]:
    """The safetensors files a target directory holds: the index's shards, else model.safetensors (if any)."""
    index = directory / INDEX
    if index.is_file():
        content = read_json_file(index)
        weight_map = content.get("weight_map") if isinstance(content, dict) else None
        if not isinstance(weight_map, dict):
            raise DataError(f"{index}: no weight_map", _REDOWNLOAD)
        files = [directory / name for name in sorted(set(map(str, weight_map.values())))]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise DataError(
                f"{directory}: {len(missing)} weight file(s) listed in {INDEX} are missing (first: {missing[0]})",
                "finish the download, or download the model again",
            )
        return files
    single = directory / WEIGHTS
    return [single] if single.is_file() else []


def check_target_files(directory: str | Path) -> dict[str, Any]:
    """Check a local target's config.json and its safetensors headers; return the config.

    Cached per directory while its files' sizes and times stay the same (stages resolve a target often).
    """
    directory = Path(directory)
    return dict(_checked(directory, _signature(directory)))


def _signature(directory: Path) -> tuple:
    stamps: list[tuple[str, int | None, int | None]] = []
    for name in (CONFIG, INDEX, WEIGHTS, *TRANSFORMERS_JSON):
        try:
            stat = (directory / name).stat()
            stamps.append((name, stat.st_size, stat.st_mtime_ns))
        except OSError:
            stamps.append((name, None, None))
    return tuple(stamps)


@functools.lru_cache(maxsize=32)
def _checked(directory: Path, signature: tuple) -> dict[str, Any]:
    del signature  # part of the cache key only
    config = read_target_config(directory)
    shapes: dict[str, list[int]] = {}
    for file in _weight_files(directory):
        header = read_safetensors_header(file)
        shapes.update({name: info.get("shape") for name, info in header.items() if name != "__metadata__"})
    problem = sizes_problem(config, shapes)
    if problem:
        raise DataError(
            f"{directory / CONFIG}: {problem}",
            "config.json and the weights come from different models: restore the model's own config.json",
        )
    for name in TRANSFORMERS_JSON:
        if (directory / name).is_file():
            read_json_file(directory / name)
    return config


_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def sizes_problem(config: dict[str, Any], shapes: dict[str, Any]) -> str | None:
    """Where config.json's sizes disagree with the weights' shapes (what a loader would refuse, or fill with
    random weights): the embedding's vocab x hidden, the first MLP's width, the number of layers. None: agree."""

    def claimed(key: str) -> Any:
        text = config.get("text_config")
        return config.get(key, text.get(key) if isinstance(text, dict) else None)

    embed = next((s for n, s in shapes.items() if n.endswith("embed_tokens.weight")), None)
    if isinstance(embed, list) and len(embed) == 2:
        for key, dim in (("vocab_size", 0), ("hidden_size", 1)):
            if isinstance(claimed(key), int) and claimed(key) != embed[dim]:
                return f"{key} is {claimed(key)} but embed_tokens.weight is {embed[0]} x {embed[1]}"
    gate = next((s for n, s in shapes.items() if n.endswith("layers.0.mlp.gate_proj.weight")), None)
    width = claimed("intermediate_size")
    if isinstance(gate, list) and len(gate) == 2 and isinstance(width, int) and width != gate[0]:
        return f"intermediate_size is {width} but layers.0.mlp.gate_proj.weight is {gate[0]} x {gate[1]}"
    layers = {int(m.group(1)) for n in shapes if (m := _LAYER.search(n))}
    count = claimed("num_hidden_layers")
    if layers and isinstance(count, int) and count > len(layers):
        return f"num_hidden_layers is {count} but the weights hold {len(layers)} layers"
    return None
