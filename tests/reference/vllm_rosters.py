"""What vLLM 0.33.0 allocates for a DSpark draft, and how its loader maps checkpoint names.

Encoded by reading the `__init__`s and `load_weights` of `K3DSparkForCausalLM`
(vllm/models/kimi_k3/nvidia/dspark_mla.py, mla.py, model.py KimiMLP) and
`Qwen3DSparkForCausalLM` (vllm/model_executor/models/qwen3_dspark.py, qwen3_dflash.py),
independently of dspark_cli's model code. Numbers come from the draft's vLLM config.json
values (a plain dict), never from our modules.

`simulate_load(engine, vcfg, checkpoint)` replays the loader on {name: shape} and returns a
report: which parameter shard each tensor fills, and what went wrong. The checks that matter:
every parameter filled exactly once with the right shape (K3's loader raises on a missing one;
Qwen3's does not and leaves it uninitialised), no tensor dropped or silently ignored
(vLLM ignores unexpected `.bias` tensors and substrings it maps to None).
"""

from __future__ import annotations

from dataclasses import dataclass, field


def pad_vocab(v: int, to: int = 64) -> int:
    """VocabParallelEmbedding / ParallelLMHead allocate rows padded to a multiple of 64."""
    return (v + to - 1) // to * to


@dataclass
class VParam:
    shape: tuple[int, ...]
    shards: dict | None = None  # shard id -> rows, for merged/QKV linears (None: whole tensor)
    loaded_shape: tuple[int, ...] | None = None  # what the loader accepts if not `shape`
    dtype: str = "model"  # "model" or "float32"
    from_target: bool = False  # aliased to the target's tensor after loading, never loaded


def k3_params(v: dict) -> dict[str, VParam]:
    """K3DSparkForCausalLM's named_parameters() (tp=1, unquantized, no output gate)."""
    h, n = v["hidden_size"], v["num_hidden_layers"]
    heads, nope, rope, vd = (v["num_attention_heads"], v["qk_nope_head_dim"], v["qk_rope_head_dim"], v["v_head_dim"])
    ql, kl, inter, r, vocab = (
        v["q_lora_rank"],
        v["kv_lora_rank"],
        v["intermediate_size"],
        v["markov_rank"],
        v["vocab_size"],
    )
    p = {
        "model.context_proj.weight": VParam((h, v["target_hidden_size"] * v["num_target_layers"])),
        "model.context_norm.weight": VParam((h,)),
    }
    for i in range(n):
        a = f"model.layers.{i}.self_attn."
        p[a + "fused_qkv_a_proj.weight"] = VParam((ql + kl + rope, h), {0: ql, 1: kl + rope})
        p[a + "q_a_layernorm.weight"] = VParam((ql,))
        p[a + "q_b_proj.weight"] = VParam((heads * (nope + rope), ql))
        p[a + "kv_a_layernorm.weight"] = VParam((kl,))
        p[a + "kv_b_proj.weight"] = VParam((heads * (nope + vd), kl))
        p[a + "o_proj.weight"] = VParam((h, heads * vd))
        m = f"model.layers.{i}."
        p[m + "mlp.gate_up_proj.weight"] = VParam((2 * inter, h), {0: inter, 1: inter})
        p[m + "mlp.down_proj.weight"] = VParam((h, inter))
        p[m + "input_layernorm.weight"] = VParam((h,))
        p[m + "post_attention_layernorm.weight"] = VParam((h,))
    p["model.context_kv_proj.weight"] = VParam((n * (kl + rope), h), {i: kl + rope for i in range(n)})
    p["model.final_norm.weight"] = VParam((h,))
    _heads(p, v, r, vocab, h)
    return p


def qwen3_params(v: dict) -> dict[str, VParam]:
    """Qwen3DSparkForCausalLM's named_parameters() (tp=1, unquantized, full vocab)."""
    h, n, d = v["hidden_size"], v["num_hidden_layers"], v["head_dim"]
    heads, kv, inter, r, vocab = (
        v["num_attention_heads"],
        v["num_key_value_heads"],
        v["intermediate_size"],
        v["markov_rank"],
        v["vocab_size"],
    )
    p = {
        "model.embed_tokens.weight": VParam((pad_vocab(vocab), h), from_target=True),
        "model.mask_embedding": VParam((h,), from_target=True),  # unused placeholder
    }
    for i in range(n):
        a = f"model.layers.{i}.self_attn."
        p[a + "qkv_proj.weight"] = VParam(((heads + 2 * kv) * d, h), {"q": heads * d, "k": kv * d, "v": kv * d})
        p[a + "o_proj.weight"] = VParam((h, heads * d))
        p[a + "q_norm.weight"] = VParam((d,))
        p[a + "k_norm.weight"] = VParam((d,))
        m = f"model.layers.{i}."
        p[m + "mlp.gate_up_proj.weight"] = VParam((2 * inter, h), {0: inter, 1: inter})
        p[m + "mlp.down_proj.weight"] = VParam((h, inter))
        p[m + "input_layernorm.weight"] = VParam((h,))
        p[m + "post_attention_layernorm.weight"] = VParam((h,))
    # fc input: target_hidden_size * len(aux layers), aux layers from target_layer_ids
    p["model.fc.weight"] = VParam((h, v["target_hidden_size"] * len(v["target_layer_ids"])))
    p["model.hidden_norm.weight"] = VParam((h,))
    p["model.norm.weight"] = VParam((h,))
    _heads(p, v, r, vocab, h)
    p["lm_head.weight"] = VParam((pad_vocab(vocab), h), from_target=True)
    return p


def _heads(p, v, r, vocab, h):
    p["model.markov_head.markov_w1.weight"] = VParam((vocab, r))  # plain nn.Embedding
    p["model.markov_head.markov_w2.weight"] = VParam((pad_vocab(vocab), r), loaded_shape=(vocab, r))
    if v.get("enable_confidence_head", False):
        width = h + (r if v.get("confidence_head_with_markov", False) else 0)
        p["model.confidence_head.proj.weight"] = VParam((1, width), dtype="float32")
        p["model.confidence_head.proj.bias"] = VParam((1,), dtype="float32")


# -- name mapping, step by step as the loaders do it -----------------------------------------
K3_STACKED = {
    ".gate_proj": (".gate_up_proj", 0),
    ".up_proj": (".gate_up_proj", 1),
    ".q_a_proj": (".fused_qkv_a_proj", 0),
    ".kv_a_proj_with_mqa": (".fused_qkv_a_proj", 1),
}
QWEN3_STACKED = {
    ".q_proj": (".qkv_proj", "q"),
    ".k_proj": (".qkv_proj", "k"),
    ".v_proj": (".qkv_proj", "v"),
    ".gate_proj": (".gate_up_proj", 0),
    ".up_proj": (".gate_up_proj", 1),
}


def _stack(name, stacked):
    shard = None
    for old, (new, shard_id) in stacked.items():
        if old in name:
            name, shard = name.replace(old, new, 1), shard_id
    return name, shard


def k3_map(names: list[str], v: dict) -> list[tuple[str, str | None, object]]:
    """[(checkpoint name, vLLM param name or None if dropped, shard)] for K3DSparkForCausalLM."""
    out = []
    expanded = []
    for name in names:  # _duplicate_context_kv_weights runs before the mapper
        expanded.append((name, name, None))
        prefix, marker, param = name.partition(".self_attn.kv_a_proj_with_mqa.")
        idx = prefix.rsplit(".", 1)[-1]
        if marker and idx.isdecimal() and int(idx) < v["num_hidden_layers"]:
            expanded.append((name, f"context_kv_proj.{param}", int(idx)))
    drops = ["embed_tokens", "lm_head"]
    if not v.get("enable_confidence_head", False):
        drops.append("confidence_head")
    for orig, name, forced_shard in expanded:
        if any(d in name for d in drops):
            out.append((orig, None, None))
            continue
        name, shard = _stack(name, K3_STACKED)
        out.append((orig, "model." + name, forced_shard if forced_shard is not None else shard))
    return out


def qwen3_map(names: list[str], v: dict) -> list[tuple[str, str | None, object]]:
    """The same for Qwen3DSparkForCausalLM.load_weights (+ DFlashQwen3Model's stacked map)."""
    out = []
    ships_conf = any("confidence_head" in n for n in names)
    drops = ["mask_embedding", "embed_tokens", "lm_head", "draft_id_to_target_id"]
    if not (v.get("enable_confidence_head", False) and ships_conf):
        drops.append("confidence_head")
    for orig in names:
        name = orig if "lm_head" in orig else "model." + orig
        if "t2d" in orig or any(d in name for d in drops):
            out.append((orig, None, None))
            continue
        if name.startswith("model."):
            inner, shard = _stack(name[len("model.") :], QWEN3_STACKED)
            name = "model." + inner
        else:
            shard = None
        out.append((orig, name, shard))
    return out


@dataclass
class LoadReport:
    filled: dict = field(default_factory=dict)  # (param, shard) -> checkpoint name
    problems: list = field(default_factory=list)


def simulate_load(
    engine: str, v: dict, checkpoint: dict[str, tuple[int, ...]], dtypes: dict[str, str] | None = None
) -> LoadReport:
    params = k3_params(v) if engine == "k3" else qwen3_params(v)
    mapping = (k3_map if engine == "k3" else qwen3_map)(list(checkpoint), v)
    report = LoadReport()
    for orig, target, shard in mapping:
        shape = tuple(checkpoint[orig])
        if target is None:
            report.problems.append(f"{orig}: dropped by the loader")
            continue
        if target not in params:
            how = "silently ignored (.bias)" if target.endswith(".bias") else "unknown: load fails"
            report.problems.append(f"{orig} -> {target}: {how}")
            continue
        param = params[target]
        if param.shards is None:
            expected = param.loaded_shape or param.shape
            key = (target, None)
        else:
            if shard not in param.shards:
                report.problems.append(f"{orig} -> {target}: no shard {shard!r}")
                continue
            expected = (param.shards[shard], param.shape[1])
            key = (target, shard)
        if shape != tuple(expected):
            report.problems.append(f"{orig} -> {target}[{shard}]: shape {shape} != {expected}")
        if key in report.filled:
            report.problems.append(f"{orig} -> {target}[{shard}]: filled twice (also by {report.filled[key]})")
        report.filled[key] = orig
        if dtypes and param.dtype == "float32" and dtypes[orig] != "float32":
            report.problems.append(f"{orig}: vLLM keeps it in float32, exported {dtypes[orig]}")
    for name, param in params.items():
        if param.from_target:
            continue
        keys = [(name, None)] if param.shards is None else [(name, s) for s in param.shards]
        for key in keys:
            if key not in report.filled:
                report.problems.append(f"{name}[{key[1]}]: never filled")
    return report
