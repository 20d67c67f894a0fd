"""The speculators format of a GQA DSpark draft's config.json, both ways (no torch).

    speculators = to_speculators(vllm_config_dict(cfg), verifier="Qwen/Qwen3-8B")   # what export writes
    native = from_speculators(json.load(open("draft/config.json")))               # what every reader uses

vLLM 0.33 reads a config.json that has `speculators_config` and no `model_type` with its
`SpeculatorsConfig` (`transformers_utils/config.py`, `model_type = "speculators"` when
`speculators_config` is set); `transformers_utils/configs/speculators/base.py` starts from
`transformer_layer_config` and `algos.py::update_dspark` adds the DSpark fields: architectures
(`Qwen3DSparkModel` or `Qwen3OmniDSparkModel` only, so MLA drafts have no speculators form),
`target_layer_ids = aux_hidden_state_layer_ids - 1`, `eagle_aux_hidden_state_layer_ids = aux ids`,
`dspark_bonus_anchor = not sample_from_anchor`, and copies `draft_vocab_size`, `target_hidden_size`,
`mask_token_id`, `markov_rank`, `markov_head_type`, `block_size`, `enable_confidence_head`,
`confidence_head_with_markov`, `use_aux_hidden_state`. `base.py::validate_speculators_config` needs
`speculators_config.proposal_methods[0].speculative_tokens`, `speculators_config.verifier.name_or_path`
and `speculators_model_type`; `build_vllm_speculative_config` turns them into `{"method": "dspark",
"num_speculative_tokens": ...}`. The same weights file serves both formats (`Qwen3DSparkModel` loads it).

`from_speculators` is our own reading of those rules, so the static checks and every stage's loader
see the draft exactly as the native export would have written it; tests/export/test_export_speculators.py
checks it against vLLM's own code.

`block_size_of` is the one reader of a draft's block size (tokens drafted per pass), in either format:
export writes it, its checks, bench's loader and `dspark serve` all read it there, and
`dspark_manifest.json`'s copies of it must agree with it (`export/integrity.py`).
"""

from __future__ import annotations

from typing import Any

# the fields vLLM's update_dspark copies from the top level (the rest come from transformer_layer_config)
DSPARK_FIELDS = (
    "draft_vocab_size",
    "target_hidden_size",
    "mask_token_id",
    "markov_rank",
    "block_size",
    "enable_confidence_head",
    "confidence_head_with_markov",
)
ALGORITHM = "dspark"
# where vLLM 0.33 looks for a DSpark draft's block size (`config/speculative.py`: the default
# num_speculative_tokens, and the trained block Qwen3-Omni drafts are checked against), first wins
BLOCK_SIZE_KEYS = ("block_size", "dspark_block_size")


def is_speculators(config: dict[str, Any]) -> bool:
    return isinstance(config, dict) and config.get("speculators_config") is not None


def to_speculators(
    native: dict[str, Any], *, verifier: str, verifier_architectures: list[str] | None = None
) -> dict[str, Any]:
    """The speculators-format config.json of a native Qwen3DSparkModel config (GQA drafts only)."""
    if native.get("architectures") != ["Qwen3DSparkModel"]:
        raise ValueError(
            f"the speculators format has DSpark drafts of vLLM's Qwen3DSparkModel only, not "
            f"{native.get('architectures')}"
        )
    layer = {
        k: v
        for k, v in native.items()
        if k not in (*DSPARK_FIELDS, "architectures", "target_layer_ids", "sample_from_anchor")
    }
    return {
        "architectures": ["Qwen3DSparkModel"],
        "speculators_model_type": ALGORITHM,
        "transformer_layer_config": layer,
        "aux_hidden_state_layer_ids": [i + 1 for i in native["target_layer_ids"]],
        "sample_from_anchor": native.get("sample_from_anchor", True),
        **{k: native[k] for k in DSPARK_FIELDS if k in native},
        "speculators_config": {
            "algorithm": ALGORITHM,
            "proposal_methods": [{"proposal_type": ALGORITHM, "speculative_tokens": block_size_of(native)}],
            "default_proposal_method": ALGORITHM,
            "verifier": {"name_or_path": verifier, "architectures": list(verifier_architectures or [])},
        },
        "torch_dtype": native.get("torch_dtype"),
    }


def structure_problems(config: dict[str, Any]) -> list[tuple[str, str]]:
    """(key, what is wrong) for what vLLM's SpeculatorsConfig would refuse or misread."""
    problems = []
    spec = config.get("speculators_config")
    methods = spec.get("proposal_methods") if isinstance(spec, dict) else None
    if (
        not methods
        or not isinstance(methods, list)
        or not isinstance(methods[0], dict)
        or methods[0].get("speculative_tokens") is None
    ):
        problems.append(("speculators_config.proposal_methods", "needs [{speculative_tokens: N}]"))
    if (
        not isinstance(spec, dict)
        or not isinstance(spec.get("verifier"), dict)
        or not spec["verifier"].get("name_or_path")
    ):
        problems.append(("speculators_config.verifier.name_or_path", "missing"))
    if config.get("speculators_model_type") != ALGORITHM:
        problems.append(("speculators_model_type", f"{config.get('speculators_model_type')!r} is not {ALGORITHM!r}"))
    if not isinstance(config.get("transformer_layer_config"), dict):
        problems.append(("transformer_layer_config", "missing or not a mapping"))
    if "model_type" in config:
        problems.append(("model_type", "set at the top level: vLLM then skips SpeculatorsConfig"))
    tokens = methods[0].get("speculative_tokens") if methods and isinstance(methods[0], dict) else None
    block = config.get("block_size")
    if tokens is not None and block is not None and tokens != block:
        problems.append(
            (
                "speculators_config.proposal_methods",
                f"speculative_tokens {tokens!r} != block_size {block!r}: two block sizes for one draft "
                "(vLLM defaults num_speculative_tokens to speculative_tokens)",
            )
        )
    if not isinstance(config.get("aux_hidden_state_layer_ids"), list):
        problems.append(("aux_hidden_state_layer_ids", "missing: vLLM needs it for the target layers"))
    return problems


def from_speculators(config: dict[str, Any]) -> dict[str, Any]:
    """The native config dict (as `vllm_config_dict` writes it) that vLLM reads from a speculators config.

    The keys vLLM adds that the native form leaves out (`eagle_aux_hidden_state_layer_ids`, which
    `update_dspark` sets to the aux ids and so agrees with `target_layer_ids` by construction, and
    `dspark_bonus_anchor = not sample_from_anchor`) are dropped; a `sample_from_anchor: false` stays
    to be refused by the rules. Raises ValueError on a structure vLLM would refuse."""
    problems = structure_problems(config)
    if problems:
        raise ValueError("; ".join(f"{key}: {what}" for key, what in problems))
    native = dict(config["transformer_layer_config"])
    architectures = [a for a in config.get("architectures") or [] if a in ("Qwen3DSparkModel", "Qwen3OmniDSparkModel")]
    native["architectures"] = architectures or ["Qwen3DSparkModel"]
    native["sample_from_anchor"] = config.get("sample_from_anchor", False)
    native["target_layer_ids"] = [i - 1 for i in config["aux_hidden_state_layer_ids"]]
    for key in (*DSPARK_FIELDS, "markov_head_type", "use_aux_hidden_state"):
        if config.get(key) is not None:
            native[key] = config[key]
    return native


def num_speculative_tokens(config: dict[str, Any]) -> int:
    """What vLLM's `build_vllm_speculative_config` takes from the config."""
    return int(config["speculators_config"]["proposal_methods"][0]["speculative_tokens"])


def block_size_of(config: dict[str, Any]) -> Any:
    """The block size of a draft's config.json (either format) as vLLM reads it: the first of
    `BLOCK_SIZE_KEYS` that is set (for the speculators format, of the config `from_speculators`
    gives, else its `speculative_tokens`); None when unset or unreadable. Returned as stored:
    `DSparkDraftConfig` refuses a value that is not a block size."""
    native = config
    if is_speculators(config):
        try:
            native = from_speculators(config)
        except ValueError:  # the rules name what vLLM would refuse
            return None
    for key in BLOCK_SIZE_KEYS:
        if native.get(key) is not None:
            return native[key]
    if is_speculators(config):
        return config["speculators_config"]["proposal_methods"][0]["speculative_tokens"]
    return None
