"""The target's frozen `embed_tokens` and `lm_head` (and its final norm's gain, for `train.init: target`),
read from its safetensors without loading the model.

    embed, lm_head = load_embeddings(Path("dspark_cli/targets/tiny/tiny-mla"))   # [V, H] each
    embed, lm_head = Target.of(recipe).embeddings()                              # what the stages call

Names tried (first match wins): `model.embed_tokens.weight` / `lm_head.weight`, with the usual
prefixes of multimodal or wrapped checkpoints (`language_model.`, `model.language_model.`).
A tied target (`tie_word_embeddings`, or no lm_head tensor) reuses embed_tokens as lm_head.
Only the shards holding these two tensors are opened (via `model.safetensors.index.json`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from dspark_cli.errors import DataError, UsageError
from dspark_cli.targets.files import read_json_file, read_target_config

if TYPE_CHECKING:
    import torch

EMBED_NAMES = (
    "model.embed_tokens.weight",
    "model.language_model.embed_tokens.weight",
    "language_model.model.embed_tokens.weight",
    "embed_tokens.weight",
)
LM_HEAD_NAMES = ("lm_head.weight", "language_model.lm_head.weight", "model.lm_head.weight")


def _weight_map(directory: Path) -> dict[str, str]:
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        data = read_json_file(index)  # invalid, too deep or not UTF-8: a DataError naming it
        weight_map = data.get("weight_map") if isinstance(data, dict) else None
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise DataError(f"{index}: no weight_map of tensor names to files", "download the model again")
        return weight_map
    single = directory / "model.safetensors"
    if not single.is_file():
        raise UsageError(
            f"{directory}: no model.safetensors or model.safetensors.index.json",
            "point target.model at a local directory with safetensors weights",
        )
    from safetensors import safe_open

    with safe_open(str(single), framework="pt") as handle:
        return {name: "model.safetensors" for name in handle.keys()}  # noqa: SIM118 - not a dict


def _read(directory: Path, weight_map: dict[str, str], names: tuple[str, ...]) -> torch.Tensor | None:
    from safetensors import safe_open

    for name in names:
        if name in weight_map:
            with safe_open(str(directory / weight_map[name]), framework="pt") as handle:
                return handle.get_tensor(name)
    return None


def load_embeddings(directory: Path, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(embed_tokens [V, H], lm_head [V, H]) of a local target, cast to `dtype`, frozen."""
    weight_map = _weight_map(directory)
    embed = _read(directory, weight_map, EMBED_NAMES)
    if embed is None:
        raise DataError(
            f"{directory}: no embed_tokens tensor (looked for {EMBED_NAMES[0]} and variants)",
            "is this a causal LM checkpoint?",
        )
    lm_head = _read(directory, weight_map, LM_HEAD_NAMES)
    if lm_head is None:
        config = read_target_config(directory)
        if not config.get("tie_word_embeddings", config.get("text_config", {}).get("tie_word_embeddings", False)):
            raise DataError(
                f"{directory}: no lm_head tensor and tie_word_embeddings is not set", "check the checkpoint"
            )
        lm_head = embed
    return embed.to(dtype).requires_grad_(False), lm_head.to(dtype).requires_grad_(False)


def load_final_norm(
    directory: Path, dtype: torch.dtype, *, hint: str = "set train.init: normal, or check the checkpoint"
) -> torch.Tensor:
    """The gain of the target's final RMSNorm [H], cast to `dtype`: the one tensor named `model.norm.weight`
    under any prefix (`language_model.model.norm.weight`, ...) that is neither a decoder layer's nor an MTP
    layer's. A UsageError (with `hint`) when there is not exactly one."""
    weight_map = _weight_map(directory)
    names = [n for n in weight_map if n.endswith("model.norm.weight") and "mtp" not in n and "layers." not in n]
    if len(names) != 1:
        raise UsageError(f"{directory}: cannot find the final norm weight (found {names})", hint)
    return _read(directory, weight_map, tuple(names)).to(dtype)
