"""Grouped-query attention of the Qwen3 DSpark draft (vLLM 0.33 `qwen3_dflash.py`).

Per token (module names are vLLM's checkpoint names; vLLM stacks q/k/v into `qkv_proj`):
    q = q_norm(q_proj(x).view(H, d)),  k = k_norm(k_proj(x).view(KV, d)),  v = v_proj(x)
    q, k: Neox RoPE (`is_neox_style` defaults to True) at the token position
    softmax scale d ** -0.5, KV heads shared by H / KV query heads.
A context position's k / v come from the same projections applied to the combined target
state `hidden_norm(fc(aux))` (vLLM's `precompute_and_store_context_kv`), without the layer's
`input_layernorm`.
"""

from __future__ import annotations

import torch
from torch import nn

from dspark_cli.draft.attention import BlockLayout, block_attention
from dspark_cli.draft.config import DSparkDraftConfig
from dspark_cli.draft.layers import RMSNorm, apply_rope


class GQAAttention(nn.Module):
    def __init__(self, cfg: DSparkDraftConfig) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        self.scale = self.head_dim**-0.5
        h, d = cfg.hidden_size, cfg.head_dim
        self.q_proj = nn.Linear(h, self.num_heads * d, bias=False)
        self.k_proj = nn.Linear(h, self.num_kv_heads * d, bias=False)
        self.v_proj = nn.Linear(h, self.num_kv_heads * d, bias=False)
        self.o_proj = nn.Linear(self.num_heads * d, h, bias=False)
        self.q_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(d, cfg.rms_norm_eps)

    def context_kv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [..., hidden] -> (k [..., KV, d] normed and rotated, v [..., KV, d])."""
        shape = (*x.shape[:-1], self.num_kv_heads, self.head_dim)
        k = self.k_norm(self.k_proj(x).view(shape))
        k = apply_rope(k, cos.unsqueeze(-2), sin.unsqueeze(-2), interleaved=False)
        return k, self.v_proj(x).view(shape)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        ctx: tuple[torch.Tensor, torch.Tensor],
        layout: BlockLayout,
        impl: str,
        absorbed: bool = False,
    ) -> torch.Tensor:
        """x [B, Q, hidden] block queries at angles cos/sin [B, Q, d/2]; ctx k, v [B, L, KV, d]."""
        del absorbed  # MLA only
        bsz, num_q, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(bsz, num_q, self.num_heads, self.head_dim))
        q = apply_rope(q, cos.unsqueeze(-2), sin.unsqueeze(-2), interleaved=False)
        own_k, own_v = self.context_kv(x, cos, sin)
        k = torch.cat([ctx[0], own_k], dim=1).transpose(1, 2)  # [B, KV, K, d]
        v = torch.cat([ctx[1], own_v], dim=1).transpose(1, 2)
        out = block_attention(q.transpose(1, 2), k, v, layout, self.scale, impl)
        return self.o_proj(out.transpose(1, 2).reshape(bsz, num_q, self.num_heads * self.head_dim))
