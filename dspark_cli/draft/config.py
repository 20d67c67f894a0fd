"""The DSpark draft config: one `PretrainedConfig` for both backbones (MLA and GQA).

It carries exactly the fields vLLM 0.33.0 reads when it loads a DSpark draft
(`K3DSparkConfig` for MLA, the `Qwen3Config` fields `Qwen3DSparkModel` reads for GQA)
and rejects, at construction, every combination that would fail or silently misbehave
in vLLM, with one line naming the field.

    from dspark_cli.draft.build import draft_config_from_values
    cfg = draft_config_from_values(arch="gqa", target_hidden_size=128, vocab_size=512,
                                   target_num_hidden_layers=6, num_layers=2, block_size=7,
                                   target_layer_ids=[0, 2, 4], mask_token_id=511,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                   intermediate_size=256)
    vllm_config_dict(cfg)   # the config.json vLLM loads (K3DSparkModel or Qwen3DSparkModel)

Conventions (docs/concepts.md; the loader rules they must pass are in docs/export.md, Checks):
- `target_layer_ids` are 0-based "output of target layer k" (transformers `hidden_states[k+1]`);
  vLLM adds 1 internally (`get_eagle3_aux_layers_from_config`), so they are exported as-is.
- `num_target_layers` is the number of captured target layers, `len(target_layer_ids)`
  (K3DSparkConfig insists), NOT the target's depth; the depth is `target_num_hidden_layers`.
- The draft borrows the target's `embed_tokens` and `lm_head`, so `hidden_size` must equal
  `target_hidden_size` and `draft_vocab_size` must equal `vocab_size`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from transformers import PretrainedConfig

from dspark_cli.errors import UsageError

ARCHS = ("mla", "gqa")
MLA_FIELDS = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
GQA_FIELDS = ("num_key_value_heads", "head_dim")


class DraftConfigError(UsageError, ValueError):
    """An invalid draft config field. A `ValueError` for library callers, a usage error for the CLI."""


class DSparkDraftConfig(PretrainedConfig):
    """Geometry and DSpark fields of one draft; see the module docstring for conventions.

    Fields shared by both backbones: `arch` ("mla" | "gqa"), `vocab_size`, `draft_vocab_size`
    (= vocab_size), `hidden_size`, `intermediate_size`, `num_hidden_layers` (draft layers),
    `num_attention_heads`, `hidden_act` ("silu"), `rms_norm_eps`, `rope_theta` (rope type is
    always "default"), `max_position_embeddings`, `target_hidden_size`, `target_layer_ids`,
    `num_target_layers` (= len(target_layer_ids)), `target_num_hidden_layers` (target depth,
    optional, only for range checks), `block_size` (N query slots per draft step),
    `markov_rank`, `enable_confidence_head`, `confidence_head_with_markov` (forced False
    without the head), `mask_token_id`.
    MLA only: `q_lora_rank`, `kv_lora_rank`, `qk_nope_head_dim`, `qk_rope_head_dim`,
    `v_head_dim`. GQA only: `num_key_value_heads`, `head_dim`.
    """

    model_type = "dspark_draft"
    has_no_defaults_at_init = True  # every instance is validated; there is no valid default draft

    def __init__(
        self,
        arch: str = "gqa",
        vocab_size: int = 0,
        hidden_size: int = 0,
        intermediate_size: int = 0,
        num_hidden_layers: int = 1,
        num_attention_heads: int = 1,
        target_hidden_size: int | None = None,
        target_layer_ids: list[int] | None = None,
        num_target_layers: int | None = None,
        target_num_hidden_layers: int | None = None,
        block_size: int = 7,
        markov_rank: int = 256,
        enable_confidence_head: bool = True,
        confidence_head_with_markov: bool = True,
        mask_token_id: int | None = None,
        draft_vocab_size: int | None = None,
        hidden_act: str = "silu",
        rms_norm_eps: float = 1e-6,
        rope_theta: float = 10000.0,
        max_position_embeddings: int = 32768,
        q_lora_rank: int | None = None,
        kv_lora_rank: int | None = None,
        qk_nope_head_dim: int | None = None,
        qk_rope_head_dim: int | None = None,
        v_head_dim: int | None = None,
        num_key_value_heads: int | None = None,
        head_dim: int | None = None,
        rope_scaling: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        self.arch = arch
        self.vocab_size = vocab_size
        self.draft_vocab_size = vocab_size if draft_vocab_size is None else draft_vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.target_hidden_size = hidden_size if target_hidden_size is None else target_hidden_size
        self.target_layer_ids = [int(i) for i in (target_layer_ids or [])]
        self.num_target_layers = len(self.target_layer_ids) if num_target_layers is None else num_target_layers
        self.target_num_hidden_layers = target_num_hidden_layers
        self.block_size = block_size
        self.markov_rank = markov_rank
        self.enable_confidence_head = bool(enable_confidence_head)
        self.confidence_head_with_markov = bool(confidence_head_with_markov)
        self.mask_token_id = mask_token_id
        self.hidden_act = hidden_act
        self.rms_norm_eps = float(rms_norm_eps)
        self.rope_theta = float(rope_theta)
        self.max_position_embeddings = max_position_embeddings
        self.q_lora_rank = q_lora_rank
        self.kv_lora_rank = kv_lora_rank
        self.qk_nope_head_dim = qk_nope_head_dim
        self.qk_rope_head_dim = qk_rope_head_dim
        self.v_head_dim = v_head_dim
        self.num_key_value_heads = num_key_value_heads
        self.head_dim = head_dim
        # YaRN settings or None; not named `rope_scaling`, which transformers treats as rope_parameters
        self.rope_yarn = _yarn_parameters(rope_scaling) if rope_scaling else None
        rope_parameters = kwargs.pop("rope_parameters", None)
        if rope_parameters is not None:
            self._take_rope_parameters(rope_parameters)
        super().__init__(**kwargs)
        self.tie_word_embeddings = False
        _validate(self)

    def _take_rope_parameters(self, rope_parameters: Mapping[str, Any]) -> None:
        rope_type = rope_parameters.get("rope_type", rope_parameters.get("type", "default"))
        if rope_type == "yarn":
            self.rope_yarn = _yarn_parameters(rope_parameters)
        elif rope_type != "default":
            raise DraftConfigError(
                f"rope_parameters.rope_type must be 'default' (or 'yarn' for an MLA draft), got {rope_type!r}"
            )
        self.rope_theta = float(rope_parameters.get("rope_theta", self.rope_theta))

    @property
    def qk_head_dim(self) -> int:
        """MLA query/key head width (nope + rope); the softmax scale is its -1/2 power."""
        return int(self.qk_nope_head_dim) + int(self.qk_rope_head_dim)


# YaRN as vLLM's MLA layers apply it (`models/kimi_k3/nvidia/mla.py` turns rope_type "yarn" into
# "deepseek_yarn": `DeepseekScalingRotaryEmbedding`), with that class's defaults for what is unset.
YARN_DEFAULTS = {"beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 0.0}
YARN_KEYS = ("factor", "original_max_position_embeddings", *YARN_DEFAULTS)


def _yarn_parameters(values: Mapping[str, Any]) -> dict[str, float]:
    """YaRN settings {factor, original_max_position_embeddings, beta_fast, beta_slow, mscale,
    mscale_all_dim} from a `rope_parameters` / `rope_scaling` mapping."""
    values = {k: v for k, v in values.items() if k not in ("rope_type", "type", "rope_theta")}
    unknown = sorted(set(values) - set(YARN_KEYS))
    if unknown:
        _fail(f"rope_scaling.{unknown[0]}", f"is not a YaRN setting (known: {', '.join(YARN_KEYS)})")
    if values.get("attention_factor") == 1.0:
        _fail("rope_scaling", "deepseek_llama_scaling (attention_factor 1.0) is not supported")
    for key in ("factor", "original_max_position_embeddings"):
        if not values.get(key) or float(values[key]) <= 0:
            _fail(f"rope_scaling.{key}", "must be set and positive for YaRN")
    out = {**YARN_DEFAULTS, **{k: float(v) for k, v in values.items()}}
    out["original_max_position_embeddings"] = int(out["original_max_position_embeddings"])
    return out


def _fail(field: str, message: str) -> None:
    raise DraftConfigError(f"draft.{field}: {message}")


def _positive(cfg: DSparkDraftConfig, *fields: str) -> None:
    for field in fields:
        value = getattr(cfg, field)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            _fail(field, f"must be a positive integer, got {value!r}")


MAX_LAYERS = 64  # a DSpark draft has 1-8 layers; more is a typo or a hostile config (recipe/schema.py says the same)
MAX_BLOCK_SIZE = 64  # tokens per drafting step (vLLM's num_speculative_tokens; DSpark uses 7)


def _validate(cfg: DSparkDraftConfig) -> None:
    if cfg.arch not in ARCHS:
        _fail("arch", f"must be one of {ARCHS}, got {cfg.arch!r}")
    _positive(
        cfg,
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "target_hidden_size",
        "block_size",
        "markov_rank",
        "max_position_embeddings",
    )
    if cfg.num_hidden_layers > MAX_LAYERS:  # checked before any model is built (even a meta one takes minutes)
        _fail("num_layers", f"at most {MAX_LAYERS} draft layers, got {cfg.num_hidden_layers:,} (num_hidden_layers)")
    if cfg.block_size > MAX_BLOCK_SIZE:
        _fail("block_size", f"at most {MAX_BLOCK_SIZE} tokens per step, got {cfg.block_size:,}")
    if cfg.hidden_size != cfg.target_hidden_size:
        _fail(
            "hidden_size",
            f"must equal the target's hidden size {cfg.target_hidden_size} "
            f"(the draft borrows the target's embed_tokens and lm_head), got {cfg.hidden_size}",
        )
    if cfg.draft_vocab_size != cfg.vocab_size:
        _fail(
            "draft_vocab_size",
            f"must equal vocab_size {cfg.vocab_size} (the target's lm_head "
            f"is shared; reduced-vocab drafts are not supported), got {cfg.draft_vocab_size}",
        )
    if cfg.hidden_act != "silu":
        _fail("hidden_act", f"only 'silu' is supported, got {cfg.hidden_act!r}")
    if not cfg.rms_norm_eps > 0:
        _fail("rms_norm_eps", f"must be > 0, got {cfg.rms_norm_eps}")
    if not cfg.rope_theta > 0:
        _fail("rope_theta", f"must be > 0, got {cfg.rope_theta}")
    _validate_layer_ids(cfg)
    if cfg.mask_token_id is None or isinstance(cfg.mask_token_id, bool) or not isinstance(cfg.mask_token_id, int):
        _fail("mask_token_id", f"must be an integer token id, got {cfg.mask_token_id!r}")
    if not 0 <= cfg.mask_token_id < cfg.vocab_size:
        _fail("mask_token_id", f"must be in [0, {cfg.vocab_size}), got {cfg.mask_token_id}")
    if not cfg.enable_confidence_head:
        cfg.confidence_head_with_markov = False  # meaningless without the head; keep exports clean
    if cfg.arch == "mla":
        _validate_mla(cfg)
    else:
        _validate_gqa(cfg)


def _validate_layer_ids(cfg: DSparkDraftConfig) -> None:
    ids = cfg.target_layer_ids
    if not ids:
        _fail("target_layer_ids", "must list at least one target layer (0-based, output of layer k)")
    if any(b <= a for a, b in zip(ids, ids[1:])):
        _fail("target_layer_ids", f"must be strictly increasing, got {ids}")
    if ids[0] < 0:
        _fail("target_layer_ids", f"must be >= 0 (0-based, output of layer k), got {ids}")
    depth = cfg.target_num_hidden_layers
    if depth is not None and ids[-1] >= depth:
        _fail(
            "target_layer_ids",
            f"{ids[-1]} is out of range for a target with {depth} layers "
            f"(ids are 0-based: the last layer is {depth - 1})",
        )
    if cfg.num_target_layers != len(ids):
        _fail("num_target_layers", f"must equal len(target_layer_ids) = {len(ids)}, got {cfg.num_target_layers}")


def _validate_mla(cfg: DSparkDraftConfig) -> None:
    for field in GQA_FIELDS:
        if getattr(cfg, field) is not None:
            _fail(field, "applies to arch 'gqa' only (this draft is 'mla')")
    if cfg.q_lora_rank is None:
        _fail("q_lora_rank", "must be set: vLLM's K3DSparkConfig rejects q_lora_rank=None")
    _positive(cfg, *MLA_FIELDS)
    if cfg.qk_rope_head_dim % 2:
        _fail("qk_rope_head_dim", f"must be even (RoPE rotates pairs), got {cfg.qk_rope_head_dim}")
    scaling = cfg.rope_yarn
    if scaling and cfg.max_position_embeddings != int(scaling["original_max_position_embeddings"] * scaling["factor"]):
        _fail(
            "max_position_embeddings",
            f"must be rope_scaling.original_max_position_embeddings x factor = "
            f"{int(scaling['original_max_position_embeddings'] * scaling['factor'])} (vLLM's YaRN table), "
            f"got {cfg.max_position_embeddings}",
        )


def _validate_gqa(cfg: DSparkDraftConfig) -> None:
    if cfg.rope_yarn:
        _fail("rope_scaling", "YaRN is supported for MLA drafts only (vLLM's Qwen3 draft uses another YaRN)")
    for field in MLA_FIELDS:
        if getattr(cfg, field) is not None:
            _fail(field, "applies to arch 'mla' only (this draft is 'gqa')")
    if cfg.num_key_value_heads is None:
        cfg.num_key_value_heads = cfg.num_attention_heads
    if cfg.head_dim is None:
        cfg.head_dim = cfg.hidden_size // cfg.num_attention_heads
    _positive(cfg, *GQA_FIELDS)
    if cfg.num_attention_heads % cfg.num_key_value_heads:
        _fail(
            "num_key_value_heads",
            f"{cfg.num_key_value_heads} must divide num_attention_heads {cfg.num_attention_heads}",
        )
    if cfg.head_dim % 2:
        _fail("head_dim", f"must be even (RoPE rotates pairs), got {cfg.head_dim}")


def vllm_config_dict(cfg: DSparkDraftConfig, dtype: str = "bfloat16") -> dict[str, Any]:
    """The config.json vLLM 0.33 loads for this draft (K3DSparkModel or Qwen3DSparkModel).

    Every DSpark field is written explicitly: vLLM's defaults differ from ours (for example
    `confidence_head_with_markov` defaults to False there).
    """
    common = {
        "vocab_size": cfg.vocab_size,
        "draft_vocab_size": cfg.draft_vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_hidden_layers,
        "num_attention_heads": cfg.num_attention_heads,
        "hidden_act": cfg.hidden_act,
        "rms_norm_eps": cfg.rms_norm_eps,
        "max_position_embeddings": cfg.max_position_embeddings,
        "rope_parameters": (
            {"rope_type": "yarn", "rope_theta": cfg.rope_theta, **cfg.rope_yarn}
            if cfg.rope_yarn
            else {"rope_type": "default", "rope_theta": cfg.rope_theta}
        ),
        "tie_word_embeddings": False,
        "torch_dtype": dtype,
        "target_hidden_size": cfg.target_hidden_size,
        "target_layer_ids": list(cfg.target_layer_ids),
        "num_target_layers": cfg.num_target_layers,
        "block_size": cfg.block_size,
        "markov_rank": cfg.markov_rank,
        "enable_confidence_head": cfg.enable_confidence_head,
        "confidence_head_with_markov": cfg.confidence_head_with_markov,
        "mask_token_id": cfg.mask_token_id,
        # vLLM 0.33 defaults it to true, but engines that guessed the layout served drafts lacking the key
        # at under 1% acceptance (vllm-project/vllm#56792); speculators writes it too (vllm-project/speculators#760)
        "sample_from_anchor": True,
    }
    if cfg.arch == "mla":
        return {
            "architectures": ["K3DSparkModel"],
            "model_type": "k3_dspark",
            **common,
            "num_key_value_heads": cfg.num_attention_heads,
            **{f: getattr(cfg, f) for f in MLA_FIELDS},
            "n_routed_experts": 0,
            "n_shared_experts": 0,
            "num_experts_per_tok": 0,
        }
    return {
        "architectures": ["Qwen3DSparkModel"],
        "model_type": "qwen3",
        **common,
        "rope_theta": cfg.rope_theta,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "attention_bias": False,
        "use_sliding_window": False,
        "sliding_window": None,
        "layer_types": ["full_attention"] * cfg.num_hidden_layers,
    }
