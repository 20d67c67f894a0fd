"""Architectures of the bundled tiny targets, one per family dspark serves.

    python -m tools.tiny_targets.architectures     # parameter counts and bf16 sizes of both

`tiny-mla` is a `DeepseekV3ForCausalLM` (the Kimi-K3 / DeepSeek-V3 family): vLLM's CPU MLA kernel only
handles a 576-wide latent, so `kv_lora_rank + qk_rope_head_dim = 512 + 64` exactly as on K3; `q_lora_rank`
is set (K3 has one); every layer is dense (`first_k_dense_replace = num_hidden_layers`), and the MoE fields
are still valid (`topk_method: noaux_tc`) so vLLM-CPU would accept a MoE variant. `tiny-gqa` is a
`Qwen3ForCausalLM` (the Qwen3 / Llama family) with head_dim 32, vLLM-CPU's minimum. Both have 6 layers so a
draft can read 5 target layers out of N as on K3, and untied embeddings as K3 and Qwen3-8B have.
Sizes are set so that each model.safetensors, stored in bf16, stays under 8 MB.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PretrainedConfig

NUM_LAYERS = 6
HIDDEN = 160
MAX_POSITIONS = 2048


def _common(vocab_size: int, eos_id: int, pad_id: int) -> dict[str, Any]:
    return dict(
        vocab_size=vocab_size,
        hidden_size=HIDDEN,
        num_hidden_layers=NUM_LAYERS,
        max_position_embeddings=MAX_POSITIONS,
        tie_word_embeddings=False,
        rms_norm_eps=1e-6,
        bos_token_id=eos_id,  # no BOS is used; pointing it at EOS keeps engines from inventing one
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        initializer_range=0.02,
        use_cache=True,
    )


def mla_config(vocab_size: int, eos_id: int, pad_id: int) -> PretrainedConfig:
    from transformers import DeepseekV3Config

    return DeepseekV3Config(
        **_common(vocab_size, eos_id, pad_id),
        intermediate_size=448,
        num_attention_heads=2,
        num_key_value_heads=2,
        q_lora_rank=96,
        kv_lora_rank=512,
        qk_rope_head_dim=64,
        qk_nope_head_dim=32,
        v_head_dim=32,
        rope_interleave=True,  # DeepSeek's interleaved RoPE, as vLLM's deepseek_v2 applies it (is_neox_style=False)
        first_k_dense_replace=NUM_LAYERS,  # all dense; the MoE fields below only need to be valid
        n_routed_experts=4,
        n_shared_experts=1,
        num_experts_per_tok=2,
        moe_intermediate_size=64,
        n_group=1,
        topk_group=1,
        topk_method="noaux_tc",
        num_nextn_predict_layers=0,
    )


def gqa_config(vocab_size: int, eos_id: int, pad_id: int) -> PretrainedConfig:
    from transformers import Qwen3Config

    return Qwen3Config(
        **_common(vocab_size, eos_id, pad_id),
        intermediate_size=512,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )


ARCHITECTURES = {"tiny-mla": mla_config, "tiny-gqa": gqa_config}


def main() -> None:
    import torch
    from transformers import AutoModelForCausalLM

    for name, make in ARCHITECTURES.items():
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(make(4096, 1, 0))
        n = sum(p.numel() for p in model.parameters())
        print(f"{name}: {n / 1e6:.2f} M params, {2 * n / 1e6:.2f} MB in bf16")


if __name__ == "__main__":
    main()
