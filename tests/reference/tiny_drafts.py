"""Tiny random-weight drafts for the numerics tests (random weights are fine for numerics)."""

from __future__ import annotations

import torch

from dspark_cli.draft.build import draft_config_from_values
from dspark_cli.draft.model import DSparkDraftModel

HIDDEN, VOCAB, TARGET_LAYERS = 64, 97, 6
LAYER_IDS = [0, 2, 5]


def tiny_config(
    arch: str, *, block_size: int = 4, num_layers: int = 2, confidence: bool = True, with_markov: bool = True
):
    geometry = (
        dict(
            num_attention_heads=4,
            q_lora_rank=24,
            kv_lora_rank=16,
            qk_nope_head_dim=8,
            qk_rope_head_dim=8,
            v_head_dim=12,
        )
        if arch == "mla"
        else dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    )
    return draft_config_from_values(
        arch=arch,
        target_hidden_size=HIDDEN,
        vocab_size=VOCAB,
        num_layers=num_layers,
        block_size=block_size,
        target_layer_ids=LAYER_IDS,
        target_num_hidden_layers=TARGET_LAYERS,
        markov_rank=8,
        enable_confidence_head=confidence,
        confidence_head_with_markov=with_markov,
        mask_token_id=VOCAB - 1,
        intermediate_size=96,
        rope_theta=1000.0,
        **geometry,
    )


def tiny_model(arch: str, *, seed: int = 0, dtype=torch.float32, attn_impl: str = "sdpa", **kw):
    """(model, embed [V, H], lm_head [V, H]) with the target embeddings attached."""
    cfg = tiny_config(arch, **kw)
    gen = torch.Generator().manual_seed(seed)
    model = DSparkDraftModel(cfg, attn_impl=attn_impl)
    model.init_weights(std=0.15, generator=gen)
    with torch.no_grad():  # non-trivial norm weights and confidence bias
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(1.0 + 0.2 * torch.randn(param.shape, generator=gen))
        if model.confidence_head is not None:
            model.confidence_head.proj.bias.fill_(0.3)
    embed = torch.randn(cfg.vocab_size, cfg.hidden_size, generator=gen)
    lm_head = 0.2 * torch.randn(cfg.vocab_size, cfg.hidden_size, generator=gen)
    model = model.to(dtype)
    embed, lm_head = embed.to(dtype), lm_head.to(dtype)
    model.set_target_embeddings(embed, lm_head)
    return model, embed, lm_head


def tiny_sequence(seq_len: int, *, seed: int = 1, batch: int = 1, dtype=torch.float32):
    """(aux_states [B, T, 3 * H], input_ids [B, T]) with ids below the mask token."""
    gen = torch.Generator().manual_seed(seed)
    aux = torch.randn(batch, seq_len, HIDDEN * len(LAYER_IDS), generator=gen).to(dtype)
    ids = torch.randint(0, VOCAB - 1, (batch, seq_len), generator=gen)
    return aux, ids
