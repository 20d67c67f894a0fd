"""Static checks of a draft directory against vLLM 0.33.0's config and weight loaders.

Serving engines skip some unknown weight keys silently and default missing config keys, so a
subtly wrong export loads and never accepts a token. Every rule here names the key and the fix:

    findings = check_draft_dir("runs/tiny/draft", target="tiny-mla")
    for f in findings: print(f.line())      # "mask_token_id: missing; fix: ..."

Rules come from vLLM 0.33.0: `transformers_utils/configs/k3_dspark.py` (K3DSparkConfig refuses
mla_use_*, dspark_bonus_anchor, q_lora_rank null, draft_vocab_size != vocab_size, and
num_target_layers != len(target_layer_ids)); `models/kimi_k3/nvidia/dspark_mla.py` and
`model_executor/models/qwen3_dspark.py` / `qwen3_dflash.py` (which names are loaded, stacked,
dropped; `confidence_head_with_markov` defaults to False; `sample_from_anchor` defaults True).
Layer ids, the mask token and the block size are read where vLLM reads them
(`v1/worker/gpu/spec_decode/utils.py`, `eagle3_utils.py`, `config/speculative.py`): the first key of
`LAYER_ID_KEYS` / `MASK_ID_KEYS` / `BLOCK_SIZE_KEYS` that is set wins, and every other one that is set
and disagrees is flagged (it means something else to another reader).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dspark_cli.artifacts.draft import DRAFT_MANIFEST, read_draft_manifest
from dspark_cli.draft.speculators import (
    BLOCK_SIZE_KEYS,
    block_size_of,
    from_speculators,
    is_speculators,
    structure_problems,
)
from dspark_cli.errors import DataError
from dspark_cli.recipe.bounded import read_json

MLA_FIELDS = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
K3_REFUSED_FLAGS = ("mla_use_nope", "mla_use_output_gate", "mla_use_qk_norm", "dspark_bonus_anchor")
FP32_TENSORS = ("confidence_head.",)
DTYPES = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}
# the DSpark draft architectures vLLM 0.33 registers (`model_executor/models/registry.py`) beyond the two read here
UNREAD_ARCHITECTURES = ("Qwen3OmniDSparkModel", "Gemma4DSparkModel", "DSparkDraftModel", "DSparkV41DraftModel")


# where vLLM looks, first wins
LAYER_ID_KEYS = (
    "eagle_aux_hidden_state_layer_ids",
    "dflash_config.target_layer_ids",
    "dspark_target_layer_ids",
    "target_layer_ids",
)
MASK_ID_KEYS = ("dflash_config.mask_token_id", "mask_token_id")


def _get(config: dict[str, Any], dotted: str) -> Any:
    head, _, tail = dotted.partition(".")
    value = config.get(head)
    return (value.get(tail) if isinstance(value, dict) else None) if tail else value


def read_as_vllm(config: dict[str, Any], keys: tuple[str, ...]) -> tuple[str | None, Any, list[str]]:
    """(key vLLM reads, its value, the other set keys whose value differs) for one of `LAYER_ID_KEYS` / `MASK_ID_KEYS`."""
    present = [(key, _get(config, key)) for key in keys if _get(config, key) is not None]
    if not present:
        return None, None, []
    key, value = present[0]
    return key, value, [other for other, v in present[1:] if v != value]


@dataclass(frozen=True)
class Finding:
    key: str
    message: str
    fix: str
    severity: str = "error"  # "error": vLLM refuses it or it never accepts; "warning": works, but worse

    def line(self) -> str:
        return f"{self.key}: {self.message}; fix: {self.fix}"


def arch_of(config: dict[str, Any]) -> str | None:
    archs = config.get("architectures") or []
    return "mla" if "K3DSparkModel" in archs else "gqa" if "Qwen3DSparkModel" in archs else None


def check_config(config: dict[str, Any]) -> list[Finding]:
    """Rules vLLM applies to config.json before any weight is read."""
    out: list[Finding] = []
    arch = arch_of(config)
    if arch is None:
        names = config.get("architectures") or []
        unread = [n for n in names if n in UNREAD_ARCHITECTURES] if isinstance(names, list) else []
        if unread:
            return [
                Finding(
                    "architectures",
                    f"{unread[0]} is a DSpark draft vLLM 0.33 loads that dspark does not read yet "
                    "(it reads K3DSparkModel and Qwen3DSparkModel)",
                    "serve it with vLLM directly; dspark cannot check, bench or train it",
                )
            ]
        return [
            Finding(
                "architectures",
                f"{config.get('architectures')} is not a DSpark draft vLLM loads",
                'set ["K3DSparkModel"] (MLA) or ["Qwen3DSparkModel"] (GQA)',
            )
        ]
    want_type = "k3_dspark" if arch == "mla" else "qwen3"
    if config.get("model_type") != want_type:
        out.append(
            Finding(
                "model_type",
                f"{config.get('model_type')!r} does not select vLLM's {want_type} config",
                f'set "model_type": "{want_type}"',
            )
        )
    ids_key, ids, ids_disagree = read_as_vllm(config, LAYER_ID_KEYS)
    for other in ids_disagree:
        out.append(
            Finding(
                other,
                f"{_get(config, other)} disagrees with {ids_key} {ids}, which vLLM reads first",
                f"remove {other} or make it equal",
            )
        )
    if ids_key == "eagle_aux_hidden_state_layer_ids":
        out.append(
            Finding(
                ids_key,
                "vLLM reads it before target_layer_ids and without the +1 offset: the draft "
                "would read other target layers",
                "remove it",
            )
        )
    if not ids or not isinstance(ids, list):
        out.append(Finding("target_layer_ids", "missing or empty", "list the 0-based target layers the draft reads"))
    elif config.get("num_target_layers") != len(ids) and (arch == "mla" or "num_target_layers" in config):
        # K3DSparkConfig refuses a missing or different count; Qwen3DSparkModel sizes its fc from the ids
        out.append(
            Finding(
                "num_target_layers",
                f"{config.get('num_target_layers')} != len(target_layer_ids) {len(ids)}",
                f"set it to {len(ids)} (the number of captured layers, not the target's depth)",
            )
        )
    elif sorted(set(ids)) != ids or min(ids) < 0:
        out.append(Finding("target_layer_ids", f"{ids} must be unique, increasing and >= 0", "fix the list"))
    vocab, draft_vocab = config.get("vocab_size"), config.get("draft_vocab_size", config.get("vocab_size"))
    if draft_vocab != vocab:
        out.append(
            Finding(
                "draft_vocab_size",
                f"{draft_vocab} != vocab_size {vocab}: the draft shares the target's "
                "embedding and lm_head, so vLLM refuses (MLA) or needs d2t + lm_head (Qwen3)",
                "set draft_vocab_size = vocab_size",
            )
        )
    mask_key, mask, mask_disagree = read_as_vllm(config, MASK_ID_KEYS)
    for other in mask_disagree:
        out.append(
            Finding(
                other,
                f"{_get(config, other)} disagrees with {mask_key} {mask}, which vLLM reads first",
                f"remove {other} or make it equal",
            )
        )
    if mask is None:
        out.append(Finding("mask_token_id", "missing: vLLM cannot build the query block", "set the mask token id"))
    elif isinstance(vocab, int) and not 0 <= mask < vocab:
        out.append(
            Finding("mask_token_id", f"{mask} outside the vocabulary [0, {vocab})", "use a token id in the vocab")
        )
    if config.get("enable_confidence_head") and "confidence_head_with_markov" not in config:
        out.append(
            Finding(
                "confidence_head_with_markov",
                "missing: vLLM then assumes false and the confidence head's input width no longer matches",
                "write it explicitly (true or false)",
            )
        )
    if config.get("sample_from_anchor") is False:
        out.append(
            Finding(
                "sample_from_anchor",
                "false selects the DFlash 1+N layout; DSpark drafts sample from the anchor",
                "set it to true",
            )
        )
    elif "sample_from_anchor" not in config:
        out.append(
            Finding(
                "sample_from_anchor",
                "missing: vLLM 0.33 assumes true, engines that guess the layout "
                "have served such drafts at under 1% acceptance",
                'write "sample_from_anchor": true (dspark export does)',
                "warning",
            )
        )
    if config.get("hidden_act", "silu") != "silu":
        out.append(Finding("hidden_act", f"{config.get('hidden_act')!r}: dspark drafts use silu", 'set "silu"'))
    out += _check_rope(config, arch)
    block_key, block, block_disagree = read_as_vllm(config, BLOCK_SIZE_KEYS)
    for other in block_disagree:
        out.append(
            Finding(
                other,
                f"{config.get(other)} disagrees with {block_key} {block}, which vLLM reads first",
                f"remove {other} or make it equal",
            )
        )
    if block is None:
        out.append(
            Finding(
                "block_size",
                "missing: vLLM then needs num_speculative_tokens on every launch, and dspark cannot bench it",
                "write the block size the draft was trained with",
                "warning",
            )
        )
    out += _check_mla_config(config) if arch == "mla" else _check_gqa_config(config)
    return out


def _check_rope(config: dict[str, Any], arch: str) -> list[Finding]:
    """Default RoPE for every draft; YaRN also for an MLA draft, which vLLM's MLA layers apply as
    `deepseek_yarn` (the published Kimi-K3 draft: factor 32 over 32768 positions)."""
    rope = config.get("rope_parameters") or {}
    rope_type = rope.get("rope_type", "default")
    if rope_type == "yarn" and arch == "mla":
        missing = [k for k in ("factor", "original_max_position_embeddings") if not rope.get(k)]
        return [
            Finding(
                f"rope_parameters.{k}", "missing: vLLM's YaRN needs it", "write the value the draft was trained with"
            )
            for k in missing
        ]
    if rope_type != "default":
        allowed = '"default" or "yarn"' if arch == "mla" else '"default"'
        return [
            Finding(
                "rope_parameters.rope_type",
                f"{rope_type!r}: {arch} drafts are trained with {allowed} RoPE",
                f"set {allowed}",
            )
        ]
    return []


def _check_mla_config(config: dict[str, Any]) -> list[Finding]:
    out = []
    for flag in K3_REFUSED_FLAGS:
        if config.get(flag):
            out.append(Finding(flag, "K3DSparkConfig refuses it (MLA DSpark does not support it)", f"remove {flag}"))
    for name in MLA_FIELDS:
        if config.get(name) is None:
            what = "null: K3DSparkConfig refuses q_lora_rank=None" if name == "q_lora_rank" else "missing"
            out.append(Finding(name, what, f"set {name} to the draft's MLA geometry"))
    return out


def _check_gqa_config(config: dict[str, Any]) -> list[Finding]:
    out = []
    dflash = config.get("dflash_config") or {}
    if dflash.get("use_aux_hidden_state", config.get("use_aux_hidden_state", True)) is False:
        out.append(Finding("use_aux_hidden_state", "false makes vLLM drop fc (the context projection)", "remove it"))
    if config.get("is_causal") or dflash.get("causal"):
        out.append(Finding("is_causal", "causal draft attention: DSpark's query block is non-causal", "remove it"))
    if any(t == "sliding_attention" for t in config.get("layer_types") or []) or dflash.get("use_swa"):
        out.append(
            Finding("layer_types", "sliding-window draft layers: dspark trains full attention", "use full_attention")
        )
    for name in ("num_key_value_heads", "head_dim"):
        if not config.get(name):
            out.append(Finding(name, "missing", f"set {name}"))
    return out


def expected_tensors(config: dict[str, Any]) -> dict[str, tuple[tuple[int, ...], str]]:
    """name -> (shape, dtype) of every tensor vLLM loads for this config (built on the meta device)."""
    from dspark_cli.artifacts.draft import draft_config_from_vllm_dict
    from dspark_cli.export.roster import tensor_roster

    dtype = config.get("torch_dtype") or config.get("dtype") or "bfloat16"  # transformers 5 writes `dtype`
    # no tensor depends on the block size: a config without one (a warning above) still lists its tensors
    sized = config if block_size_of(config) is not None else {**config, "block_size": 1}
    roster = tensor_roster(draft_config_from_vllm_dict(sized), dtype=dtype)
    return {t["name"]: (tuple(t["shape"]), t["dtype"]) for t in roster}


def check_weights(
    config: dict[str, Any], tensors: dict[str, tuple[tuple[int, ...], str]], include_embeddings: bool = False
) -> list[Finding]:
    """Names, shapes and dtypes of `tensors` (name -> (shape, dtype name)) against what vLLM allocates."""
    try:
        expected = expected_tensors(config)
    except (ValueError, TypeError) as exc:
        return [
            Finding(
                "config.json",
                f"cannot build the draft it describes ({str(exc).splitlines()[0]})",
                "fix the config findings above",
            )
        ]
    out = []
    shared = ("embed_tokens.weight", "lm_head.weight")
    for name, (shape, dtype) in tensors.items():
        if name in expected:
            want_shape, want_dtype = expected[name]
            if tuple(shape) != want_shape:
                out.append(
                    Finding(
                        name,
                        f"shape {list(shape)} != {list(want_shape)} that vLLM allocates",
                        "re-export from a checkpoint of this config",
                    )
                )
            if dtype != want_dtype:
                severity = "warning" if name.startswith(FP32_TENSORS) else "error"
                why = "vLLM keeps it in float32" if name.startswith(FP32_TENSORS) else f"config says {want_dtype}"
                out.append(Finding(name, f"dtype {dtype}: {why}", f"write it as {want_dtype}", severity))
        elif name in shared:
            if not include_embeddings:
                out.append(
                    Finding(
                        name,
                        "the target's own weight is in the draft: K3 drops it, Qwen3 then uses "
                        "this copy instead of the target's",
                        "export without --include-embeddings",
                        "warning",
                    )
                )
        elif name.endswith(".bias") and name.removesuffix(".bias") + ".weight" in expected:
            out.append(
                Finding(
                    name,
                    "vLLM has no such bias and silently ignores it: the draft would lose it",
                    "train without biases (dspark drafts have none)",
                )
            )
        else:
            out.append(Finding(name, "unexpected tensor: vLLM's loader refuses or ignores it", "remove it"))
    for name in expected:
        if name not in tensors:
            out.append(Finding(name, "missing: vLLM would fail to load or leave it uninitialised", "re-export"))
    return out


def check_against_target(config: dict[str, Any], target: dict[str, Any]) -> list[Finding]:
    """The draft against the target it will serve with (the target's config.json as a dict)."""
    target = target.get("text_config", target)
    out = []
    hidden, vocab, depth = target.get("hidden_size"), target.get("vocab_size"), target.get("num_hidden_layers")
    if hidden is not None:
        for key in ("target_hidden_size", "hidden_size"):
            if key == "target_hidden_size" and config.get(key) is None and arch_of(config) == "gqa":
                continue  # Qwen3DSparkModel reads hidden_size then (speculators 0.9.0 writes null)
            if config.get(key) != hidden:
                out.append(
                    Finding(
                        key,
                        f"{config.get(key)} != the target's hidden_size {hidden} (the draft shares "
                        "its embedding and reads its hidden states)",
                        f"set {key} to {hidden}",
                    )
                )
    if vocab is not None and config.get("vocab_size") != vocab:
        out.append(
            Finding(
                "vocab_size",
                f"{config.get('vocab_size')} != the target's vocab_size {vocab}",
                f"set vocab_size (and draft_vocab_size) to {vocab}",
            )
        )
    ids = read_as_vllm(config, LAYER_ID_KEYS)[1] or []
    if depth is not None and ids and isinstance(ids, list) and max(ids) >= depth:
        out.append(
            Finding(
                "target_layer_ids",
                f"layer {max(ids)} is beyond the target's {depth} layers (0-based: 0..{depth - 1})",
                "retrain with layer ids inside the target",
            )
        )
    mask = read_as_vllm(config, MASK_ID_KEYS)[1]
    if vocab is not None and isinstance(mask, int) and not 0 <= mask < vocab:
        out.append(
            Finding(
                "mask_token_id",
                f"{mask} is outside the target's vocabulary ({vocab})",
                "use a token id of the target's vocabulary",
            )
        )
    return out


def read_tensor_table(weights: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    """name -> (shape, dtype) from a safetensors header, without reading the data."""
    from dspark_cli.targets.files import read_safetensors_header  # bounded by the file's size (no MemoryError)

    header = read_safetensors_header(weights)
    names = {v: k for k, v in DTYPES.items()}
    return {
        name: (tuple(info["shape"]), names.get(info["dtype"], info["dtype"].lower()))
        for name, info in header.items()
        if name != "__metadata__"
    }


def check_draft_dir(
    directory: str | Path, target_config: dict[str, Any] | None = None, include_embeddings: bool | None = None
) -> list[Finding]:
    """Every finding for an exported draft directory (config, weights, and the target when given)."""
    directory = Path(directory)
    config_file, weights = directory / "config.json", directory / "model.safetensors"
    if not config_file.is_file() or not weights.is_file():
        missing = "config.json" if not config_file.is_file() else "model.safetensors"
        return [Finding(missing, f"missing in {directory}", "export again")]
    try:
        config = read_json(config_file)
    except json.JSONDecodeError as exc:
        return [Finding("config.json", f"invalid JSON ({exc.msg} at line {exc.lineno})", "export again")]
    if not isinstance(config, dict):
        return [Finding("config.json", f"not a JSON object (a {type(config).__name__})", "export again")]
    try:
        tensors = read_tensor_table(weights)
    except (OSError, ValueError, DataError) as exc:
        return [Finding("model.safetensors", f"unreadable header ({getattr(exc, 'message', exc)})", "export again")]
    findings: list[Finding] = []
    if is_speculators(config):  # read the way vLLM's SpeculatorsConfig reads it, then the same rules
        findings = [
            Finding(key, what, "export again with --export-format speculators")
            for key, what in structure_problems(config)
        ]
        if findings:
            return findings
        dtype = config.get("torch_dtype") or config.get("dtype")  # top level in speculators' own saves
        config = from_speculators(config)
        if dtype and not (config.get("torch_dtype") or config.get("dtype")):
            config["torch_dtype"] = dtype
    findings += check_config(config)
    if include_embeddings is None:  # what export recorded; a broken manifest is its reader's one-line error
        include_embeddings = (directory / DRAFT_MANIFEST).is_file() and bool(
            read_draft_manifest(directory).get("include_embeddings")
        )
    if not any(f.severity == "error" and f.key in ("architectures",) for f in findings):
        findings += check_weights(config, tensors, include_embeddings)
    if target_config is not None:
        findings += check_against_target(config, target_config)
    return findings


def num_bytes(tensors: dict[str, tuple[tuple[int, ...], str]]) -> int:
    sizes = {"bfloat16": 2, "float16": 2, "float32": 4}
    return sum(math.prod(shape) * sizes.get(dtype, 4) for shape, dtype in tensors.values())
