"""Write tests/data/published/k3-tiny-mla/: a K3DSparkModel draft shaped as the Kimi-K3-DSpark card describes.

    .venv/bin/python tests/data/published/make_k3_draft.py

No dspark code is used: the config.json is written field by field as the card's (vLLM's K3DSparkConfig,
a DeepseekV3Config with MLA fields, plus the DSpark contract: `target_layer_ids`, `num_target_layers`,
`mask_token_id`, Markov rank, confidence head, YaRN RoPE, bfloat16), and every tensor is made by name
from the names vLLM 0.33's `models/kimi_k3/nvidia/dspark_mla.py` loads (`context_proj`, `context_norm`,
per layer MLA `q_a/q_b/kv_a_proj_with_mqa/kv_b/o_proj` with their norms and a SiLU MLP, `final_norm`,
`markov_head.markov_w1/w2`, the float32 `confidence_head.proj`), each shape computed from the config
here. Scaled down to fit the bundled `tiny-mla` target (hidden 160, vocab 4096, 6 layers); the card's
draft: hidden 7168, MLP 14336, 5 layers, 64 heads, q/kv LoRA 1536/512, nope/rope/v 128/64/128, target
layers [2, 23, 47, 71, 89] of 93, mask 163837, Markov rank 256, YaRN factor 32 over 32768. Left out:
the card's `embed_tokens` (the target's own; vLLM takes the target's). Random weights, fixed seed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

OUT = Path(__file__).resolve().parent / "k3-tiny-mla"
# tiny-mla's hidden size and vocabulary; the rest is the draft's own (small enough to commit)
GEOMETRY = {"hidden": 160, "vocab": 4096, "target_layer_ids": [1, 3, 5]}  # layers: of tiny-mla's 6, spread
MLP, LAYERS, HEADS, Q_LORA, KV_LORA, NOPE, ROPE, V, MARKOV_RANK = 32, 2, 2, 32, 32, 16, 16, 16, 4


def config(hidden: int, vocab: int, target_layer_ids: list[int]) -> dict[str, Any]:
    """The card's config.json fields, for a draft of this geometry."""
    return {
        "architectures": ["K3DSparkModel"],
        "model_type": "k3_dspark",
        "vocab_size": vocab,
        "draft_vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": MLP,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": HEADS,
        "q_lora_rank": Q_LORA,
        "kv_lora_rank": KV_LORA,
        "qk_nope_head_dim": NOPE,
        "qk_rope_head_dim": ROPE,
        "v_head_dim": V,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-06,
        "max_position_embeddings": 2048,
        "rope_parameters": {
            "rope_type": "yarn",
            "rope_theta": 50000.0,
            "factor": 4.0,
            "original_max_position_embeddings": 512,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
        },
        "attention_bias": False,
        "tie_word_embeddings": False,
        "n_routed_experts": 0,
        "n_shared_experts": 0,
        "num_experts_per_tok": 0,
        "mla_use_nope": False,
        "mla_use_output_gate": False,
        "mla_use_qk_norm": False,
        "target_hidden_size": hidden,
        "target_layer_ids": target_layer_ids,
        "num_target_layers": len(target_layer_ids),
        "block_size": 4,
        "mask_token_id": vocab - 3,
        "markov_rank": MARKOV_RANK,
        "markov_head_type": "vanilla",
        "enable_confidence_head": True,
        "confidence_head_with_markov": True,
        "sample_from_anchor": True,
        "torch_dtype": "bfloat16",
    }


def shapes(hidden: int, vocab: int, target_layer_ids: list[int]) -> dict[str, tuple[list[int], torch.dtype]]:
    """name -> (shape, dtype) of what vLLM's K3DSparkModel loads for `config(...)`."""
    h, bf16 = hidden, torch.bfloat16
    layer = {
        "input_layernorm.weight": [h],
        "self_attn.q_a_proj.weight": [Q_LORA, h],
        "self_attn.q_a_layernorm.weight": [Q_LORA],
        "self_attn.q_b_proj.weight": [HEADS * (NOPE + ROPE), Q_LORA],
        "self_attn.kv_a_proj_with_mqa.weight": [KV_LORA + ROPE, h],
        "self_attn.kv_a_layernorm.weight": [KV_LORA],
        "self_attn.kv_b_proj.weight": [HEADS * (NOPE + V), KV_LORA],
        "self_attn.o_proj.weight": [h, HEADS * V],
        "post_attention_layernorm.weight": [h],
        "mlp.gate_proj.weight": [MLP, h],
        "mlp.up_proj.weight": [MLP, h],
        "mlp.down_proj.weight": [h, MLP],
    }
    out = {
        "context_proj.weight": ([h, len(target_layer_ids) * h], bf16),
        "context_norm.weight": ([h], bf16),
        "final_norm.weight": ([h], bf16),
        "markov_head.markov_w1.weight": ([vocab, MARKOV_RANK], bf16),
        "markov_head.markov_w2.weight": ([vocab, MARKOV_RANK], bf16),
        "confidence_head.proj.weight": ([1, h + MARKOV_RANK], torch.float32),  # vLLM keeps the head in float32
        "confidence_head.proj.bias": ([1], torch.float32),
    }
    for i in range(LAYERS):
        out.update({f"layers.{i}.{name}": (shape, bf16) for name, shape in layer.items()})
    return out


def write(out: Path, hidden: int, vocab: int, target_layer_ids: list[int]) -> None:
    """config.json + model.safetensors of a random draft of this geometry in `out` (created)."""
    generator = torch.Generator().manual_seed(0)
    tensors = {}
    for name, (shape, dtype) in sorted(shapes(hidden, vocab, target_layer_ids).items()):
        if name.endswith("norm.weight"):
            tensors[name] = torch.ones(shape, dtype=dtype)
        else:
            tensors[name] = (torch.randn(shape, generator=generator) * 0.05).to(dtype)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config(hidden, vocab, target_layer_ids), indent=2) + "\n")


def main() -> None:
    write(OUT, **GEOMETRY)
    (OUT / "README.md").write_text(
        "A tiny K3DSparkModel draft for the bundled `tiny-mla` target, shaped as the Kimi-K3-DSpark card "
        "describes (MLA, YaRN, Markov head, confidence head, bfloat16), random weights.\n"
        "Made by `.venv/bin/python tests/data/published/make_k3_draft.py` (torch + safetensors only, no dspark "
        "code: names and shapes from vLLM's dspark_mla.py).\n"
    )
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
