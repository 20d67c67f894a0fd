"""Multi-head latent attention of the K3 DSpark draft (vLLM 0.33 `models/kimi_k3/nvidia/mla.py`).

Per token (module names are vLLM's checkpoint names):
    q      = q_b_proj(q_a_layernorm(q_a_proj(x))).view(H, nope + rope)   -> q_nope | q_pe
    latent = kv_a_proj_with_mqa(x)                                        -> kv_c | k_pe
    kv_c   = kv_a_layernorm(kv_c);  k_pe, q_pe: GPT-J (interleaved) RoPE at the token position
    k_nope | v = kv_b_proj(kv_c).view(H, nope + v)
    scores = (q_nope . k_nope + q_pe . k_pe) * (nope + rope) ** -0.5     (k_pe shared by heads)
             (x mscale(factor, mscale_all_dim)^2 with YaRN, as vLLM's MLA layer scales it)
A context position's latent comes from the same `kv_a_proj_with_mqa` / `kv_a_layernorm`
applied to the combined target state (vLLM duplicates that weight into `context_kv_proj`);
it never goes through the layer's `input_layernorm`.

Two equal ways to attend, like vLLM's prefill and decode paths:
- materialised (training): expand every key latent through kv_b_proj, attend per head;
- absorbed (drafting): fold kv_b_proj into the query (q_nope @ W_UK) and the output (@ W_UV),
  attend over the cached latent [kv_c | k_pe] directly, so cached context is never re-projected.
"""

from __future__ import annotations

import torch
from torch import nn

from dspark_cli.draft.attention import BlockLayout, block_attention
from dspark_cli.draft.config import DSparkDraftConfig
from dspark_cli.draft.layers import RMSNorm, apply_rope, yarn_mscale


class MLAAttention(nn.Module):
    def __init__(self, cfg: DSparkDraftConfig) -> None:
        super().__init__()
        self.num_heads = cfg.num_attention_heads
        self.nope, self.rope = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim
        self.v_dim, self.kv_lora_rank = cfg.v_head_dim, cfg.kv_lora_rank
        self.scale = cfg.qk_head_dim**-0.5
        if cfg.rope_yarn:
            self.scale *= yarn_mscale(cfg.rope_yarn["factor"], cfg.rope_yarn["mscale_all_dim"]) ** 2
        h = cfg.hidden_size
        self.q_a_proj = nn.Linear(h, cfg.q_lora_rank, bias=False)
        self.q_a_layernorm = RMSNorm(cfg.q_lora_rank, cfg.rms_norm_eps)
        self.q_b_proj = nn.Linear(cfg.q_lora_rank, self.num_heads * cfg.qk_head_dim, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(h, cfg.kv_lora_rank + self.rope, bias=False)
        self.kv_a_layernorm = RMSNorm(cfg.kv_lora_rank, cfg.rms_norm_eps)
        self.kv_b_proj = nn.Linear(cfg.kv_lora_rank, self.num_heads * (self.nope + self.v_dim), bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.v_dim, h, bias=False)

    def context_kv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [..., hidden] -> (kv_c [..., kv_lora_rank] normed, k_pe [..., rope] rotated)."""
        kv_c, k_pe = self.kv_a_proj_with_mqa(x).split([self.kv_lora_rank, self.rope], dim=-1)
        return self.kv_a_layernorm(kv_c), apply_rope(k_pe, cos, sin, interleaved=True)

    def _queries(self, x, cos, sin):
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        q = q.view(*x.shape[:-1], self.num_heads, self.nope + self.rope)
        q_nope, q_pe = q.split([self.nope, self.rope], dim=-1)
        return q_nope, apply_rope(q_pe, cos.unsqueeze(-2), sin.unsqueeze(-2), interleaved=True)

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
        """x [B, Q, hidden] block queries at angles cos/sin [B, Q, rope/2]; ctx latent [B, L, *]."""
        bsz, num_q, _ = x.shape
        q_nope, q_pe = self._queries(x, cos, sin)  # [B, Q, H, nope], [B, Q, H, rope]
        own_c, own_pe = self.context_kv(x, cos, sin)
        kv_c = torch.cat([ctx[0], own_c], dim=1)  # [B, K, kv_lora_rank]
        k_pe = torch.cat([ctx[1], own_pe], dim=1)  # [B, K, rope]
        if absorbed:
            out = self._attend_absorbed(q_nope, q_pe, kv_c, k_pe, layout, impl)
        else:
            out = self._attend_materialised(q_nope, q_pe, kv_c, k_pe, layout, impl)
        return self.o_proj(out.reshape(bsz, num_q, self.num_heads * self.v_dim))

    def _attend_materialised(self, q_nope, q_pe, kv_c, k_pe, layout, impl):
        bsz, num_k = kv_c.shape[:2]
        kv = self.kv_b_proj(kv_c).view(bsz, num_k, self.num_heads, self.nope + self.v_dim)
        k_nope, v = kv.split([self.nope, self.v_dim], dim=-1)
        k_pe = k_pe.unsqueeze(2).expand(-1, -1, self.num_heads, -1)
        q = torch.cat([q_nope, q_pe], dim=-1).transpose(1, 2)  # [B, H, Q, nope + rope]
        k = torch.cat([k_nope, k_pe], dim=-1).transpose(1, 2)
        out = block_attention(q, k, v.transpose(1, 2), layout, self.scale, impl)
        return out.transpose(1, 2)  # [B, Q, H, v]

    def _attend_absorbed(self, q_nope, q_pe, kv_c, k_pe, layout, impl):
        w = self.kv_b_proj.weight.view(self.num_heads, self.nope + self.v_dim, self.kv_lora_rank)
        w_uk, w_uv = w.split([self.nope, self.v_dim], dim=1)  # [H, nope, L], [H, v, L]
        q_latent = torch.einsum("bqhn,hnl->bhql", q_nope, w_uk)
        q = torch.cat([q_latent, q_pe.transpose(1, 2)], dim=-1)  # [B, H, Q, L + rope]
        k = torch.cat([kv_c, k_pe], dim=-1).unsqueeze(1)  # [B, 1, K, L + rope]: one latent head
        out_latent = block_attention(q, k, kv_c.unsqueeze(1), layout, self.scale, impl)
        return torch.einsum("bhql,hvl->bqhv", out_latent, w_uv)
