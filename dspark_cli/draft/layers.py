"""Building blocks shared by the MLA and GQA drafts, with vLLM 0.33's numerics.

- RMSNorm as `vllm/ir/ops/layernorm.py`: normalise in fp32, cast to the weight dtype, scale,
  cast back. The residual form adds in fp32, keeps the *rounded* sum as the new residual and
  normalises the unrounded sum (vLLM's `fused_add_rms_norm`), so bf16 runs round like vLLM.
- RoPE: angles `pos * theta ** (-2i / d)` in fp32, as vLLM's `cos_sin_cache`; or, with YaRN settings
  (MLA drafts), vLLM's `DeepseekScalingRotaryEmbedding`: interpolated low frequencies blended with the
  original high ones over a linear ramp, cos and sin scaled by mscale(factor, mscale) /
  mscale(factor, mscale_all_dim). The rotation runs in fp32 and is cast back to the input dtype.
  Neox style (halves) for GQA, GPT-J/interleaved style (pairs 2i, 2i+1) for MLA, whose
  `get_rope(..., is_neox_style=False)` call in `models/kimi_k3/nvidia/mla.py` fixes it.
- Gated MLP: `down(silu(gate(x)) * up(x))` (vLLM's SiluAndMul over the stacked gate_up).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """`weight * x / sqrt(mean(x^2) + eps)` over the last dim, computed as vLLM does."""
    normed = x.float()
    normed = normed * torch.rsqrt(normed.pow(2).mean(-1, keepdim=True) + eps)
    return (normed.to(weight.dtype) * weight).to(x.dtype)


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual), x + residual) with vLLM's fp32 add and rounding points."""
    total = x.float() + residual.float()
    new_residual = total.to(x.dtype)
    normed = total * torch.rsqrt(total.pow(2).mean(-1, keepdim=True) + eps)
    return (normed.to(weight.dtype) * weight).to(x.dtype), new_residual


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


def yarn_mscale(factor: float, mscale: float) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def _yarn_inv_freq(dim: int, theta: float, yarn: dict, device) -> torch.Tensor:
    pos_freqs = theta ** (torch.arange(0, dim, 2, dtype=torch.float32, device=device) / dim)
    original = yarn["original_max_position_embeddings"]

    def correction_dim(rotations: float) -> float:
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low = max(math.floor(correction_dim(yarn["beta_fast"])), 0)
    high = min(math.ceil(correction_dim(yarn["beta_slow"])), dim - 1)
    ramp = ((torch.arange(dim // 2, dtype=torch.float32, device=device) - low) / max(high - low, 0.001)).clamp(0, 1)
    keep = 1 - ramp  # 1: the original (extrapolated) frequency, 0: interpolated by `factor`
    return (1.0 / (yarn["factor"] * pos_freqs)) * (1 - keep) + (1.0 / pos_freqs) * keep


def rope_cos_sin(
    positions: torch.Tensor, dim: int, theta: float, yarn: dict | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape positions.shape + [dim // 2], fp32 (vLLM's cos_sin_cache rows); `yarn`: the
    draft config's `rope_yarn` (None: plain RoPE)."""
    if yarn:
        inv_freq = _yarn_inv_freq(dim, theta, yarn, positions.device)
        scale = yarn_mscale(yarn["factor"], yarn["mscale"]) / yarn_mscale(yarn["factor"], yarn["mscale_all_dim"])
    else:
        inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32, device=positions.device) / dim))
        scale = 1.0
    angles = positions.to(torch.float32).unsqueeze(-1) * inv_freq
    if scale == 1.0:
        return angles.cos(), angles.sin()
    return angles.cos() * scale, angles.sin() * scale


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, interleaved: bool) -> torch.Tensor:
    """Rotate the last dim of x; cos/sin [..., dim // 2] broadcast against x[..., dim // 2]."""
    xf = x.float()
    if interleaved:
        x1, x2 = xf[..., 0::2], xf[..., 1::2]
        return torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2).to(x.dtype)
    x1, x2 = xf.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


class GatedMLP(nn.Module):
    """`mlp.{gate,up,down}_proj`: vLLM stacks gate/up into `gate_up_proj` at load time."""

    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
