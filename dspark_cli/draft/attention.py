"""Block attention for DSpark: who sees whom, and three ways to compute it.

Keys are laid out as `[context (num_ctx slots) | block queries' own keys (Q = A * N)]`.
Query block j (N slots, an anchor then N-1 masks) sees context slot k iff
`k < ctx_limit[b, j]` and every key of its own block, non-causally. That one rule covers:

- training: one row per sequence, context = all T positions, `ctx_limit[b, j] = anchor_j`
  (the block of anchor a sees the context before a, vLLM's "verified positions < p");
- drafting: one row per request, context = padded cached K/V, `ctx_limit[b, 0] = len_b`.

Implementations (`attn_impl`):
- "blockwise" the block structure spelled out: each block's queries score the context keys before
          their anchor and the block's own N keys, under one softmax. No dense [Q, Q] block-to-block
          scores (of which a block uses only N columns), context K/V read once per row. Needs what
          `BlockLayout` describes, the block keys being the queries' own, in query order (true
          for training and for drafting). fp32 on CPU (head dims multiples of 16, N <= 16): one C
          kernel, forward and backward, that visits only the keys a block sees
          (`dspark_cli.kernels.attention`; about twice as fast as the compiled torch code,
          benchmarks/train_speed.py). Elsewhere torch code: a masked
          product of all of a row's queries with its context keys ([B, H, Q, T]) and per-block
          N x N scores, batched matmuls that torch.compile fuses around; it materialises the
          [B, H, Q, T + N] scores, so it is for CPU-sized batches (faster than "sdpa" compiled,
          no faster eagerly: docs/train.md, Speed).
- "sdpa"  `F.scaled_dot_product_attention` with a boolean [B, 1, Q, K] mask. Forward and
          backward on CPU and GPU. On CPU (benchmarks/results/draft_model.md): as fast as
          "eager" on short batches (the vocab projection dominates there), faster on long
          sequences; "flex" forward is slower than SDPA there, after a compile.
- "flex"  `flex_attention` (compiled) with a `BlockMask` built from the same rule; skips fully
          masked key tiles, which matters on GPU where A * N and T are large (SDPA with an
          arbitrary boolean mask may fall back to a kernel that reads every masked tile, or to
          the math kernel that materialises B*H*Q*K scores).
          Pad batches to a fixed T and A to avoid recompiles (training does: training/shapes.py).
          On CPU it has no backward (PyTorch raises), so use it there only under `torch.no_grad()`.
          Not run on a GPU in this repository's CI: the CPU forward is tested against SDPA, compiled
          and eager, also under training's FLOP counter (tests/training/test_train_gpu_path.py). Compiled
          CPU flex computes wrong values at 12 queries x 24 keys (torch 2.11 and 2.13, any mask;
          measured), a shape no training bucket takes.
- "eager" explicit fp32 `softmax(q k^T * scale) v`: slow, transparent, for debugging.
- "auto"  "flex" on CUDA; on CPU "blockwise" when dspark's C kernels are built (the usual case)
          or under torch.compile, "sdpa" otherwise (`resolve_attn_impl`).

The dense mask materialises B * Q * K booleans; flex's BlockMask stores per-128-tile indices.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import _disable_current_modes, _get_current_dispatch_mode

from dspark_cli.draft.compiling import compile_fn
from dspark_cli.kernels import attention as cpu_kernel

ATTN_IMPLS = ("blockwise", "sdpa", "flex", "eager", "auto")


def check_attn_impl(impl: str) -> str:
    if impl not in ATTN_IMPLS:
        raise ValueError(f"attn_impl must be one of {ATTN_IMPLS}, got {impl!r}")
    return impl


def resolve_attn_impl(impl: str, device: torch.device, *, compiled: bool = False) -> str:
    """The kernel `impl` names on `device`. `auto` on CPU is "blockwise": with dspark's C kernel
    (fp32, `dspark_cli.kernels.attention`) it beats SDPA eagerly and the compiled torch blockwise;
    without the kernel, "blockwise" under torch.compile (inductor fuses its masking and softmax around
    the batched matmuls) and "sdpa" eagerly (the unfused torch blockwise costs as much as it saves).
    The step timings behind this are in benchmarks/train_speed.py and docs/train.md, Speed."""
    if check_attn_impl(impl) == "auto":
        if device.type == "cuda":
            return "flex"
        return "blockwise" if compiled or cpu_kernel.kernel_on() else "sdpa"
    return impl


@dataclass
class BlockLayout:
    """The attention pattern of one forward pass; masks are built once and shared by all layers."""

    num_ctx: int  # context key slots before the block keys
    block_size: int  # N
    ctx_limit: torch.Tensor  # [B, A] int64: block j of row b sees context slots < ctx_limit[b, j]
    _cache: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def num_queries(self) -> int:
        return self.ctx_limit.shape[1] * self.block_size

    @property
    def num_keys(self) -> int:
        return self.num_ctx + self.num_queries

    def mask_mod(self, b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
        """True where query q may attend key k (flex's mask_mod signature; broadcasts too)."""
        del h
        block = q // self.block_size
        is_ctx = k < self.num_ctx
        sees_ctx = is_ctx & (k < self.ctx_limit[b, block])
        sees_block = ~is_ctx & ((k - self.num_ctx) // self.block_size == block)
        return sees_ctx | sees_block

    def dense_mask(self) -> torch.Tensor:
        """Boolean [B, 1, Q, K] mask for SDPA / eager."""
        if "dense" not in self._cache:
            device = self.ctx_limit.device
            b = torch.arange(self.ctx_limit.shape[0], device=device).view(-1, 1, 1, 1)
            q = torch.arange(self.num_queries, device=device).view(1, 1, -1, 1)
            k = torch.arange(self.num_keys, device=device).view(1, 1, 1, -1)
            self._cache["dense"] = self.mask_mod(b, None, q, k)
        return self._cache["dense"]

    def additive_mask(self, dtype: torch.dtype) -> torch.Tensor:
        """`dense_mask` as 0 / -inf in `dtype`, for SDPA: given a boolean mask, CPU SDPA converts it to
        this on every call, forward and backward (docs/train.md, Speed)."""
        key = f"additive-{dtype}"
        if key not in self._cache:
            allowed = self.dense_mask()
            self._cache[key] = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(
                ~allowed, float("-inf")
            )
        return self._cache[key]

    def context_bias(self, dtype: torch.dtype) -> torch.Tensor:
        """[B, 1, 1, Q, num_ctx] 0 / -inf: query q may see context slot k (for "blockwise"; the
        two singleton dims broadcast over KV heads and the query heads sharing one)."""
        key = f"context-{dtype}"
        if key not in self._cache:
            device = self.ctx_limit.device
            block = torch.arange(self.num_queries, device=device) // self.block_size
            allowed = torch.arange(self.num_ctx, device=device) < self.ctx_limit[:, block, None]  # [B, Q, T]
            bias = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill_(~allowed, float("-inf"))
            self._cache[key] = bias[:, None, None]
        return self._cache[key]

    def block_mask(self):
        if "block" not in self._cache:
            from torch.nn.attention.flex_attention import create_block_mask

            def mask_mod(b, h, q, k):  # a plain 4-argument function, as flex requires
                return self.mask_mod(b, h, q, k)

            self._cache["block"] = create_block_mask(
                mask_mod,
                B=self.ctx_limit.shape[0],
                H=None,
                Q_LEN=self.num_queries,
                KV_LEN=self.num_keys,
                device=self.ctx_limit.device,
            )
        return self._cache["block"]


_compiled_flex = None
FLEX_RECOMPILE_LIMIT = 16  # shapes compiled before dynamo runs flex eagerly (the recipe's bucket limit)


def _flex(q, k, v, block_mask, scale):
    global _compiled_flex
    from torch.nn.attention.flex_attention import flex_attention

    if q.device.type == "cpu" and torch.is_grad_enabled() and (q.requires_grad or k.requires_grad):
        from dspark_cli.errors import UsageError

        raise UsageError(
            "draft.attention=flex has no backward on CPU (PyTorch's flex attention is forward-only there)",
            "train on CPU with draft.attention=auto, blockwise or sdpa",
        )
    if _compiled_flex is None:
        # dynamic=False: one compile per shape. (Dynamic-shape flex fails to build its C++
        # kernel on CPU with torch 2.13 when the shape changes.) Training pads its batches to at most
        # FLEX_RECOMPILE_LIMIT shapes (train.length_buckets), so it never falls back to eager flex.
        _compiled_flex = compile_fn(flex_attention, dynamic=False, recompile_limit=FLEX_RECOMPILE_LIMIT)
    return _compiled_flex(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=q.shape[1] != k.shape[1])


def _eager(q, k, v, mask, scale):
    if q.shape[1] != k.shape[1]:
        repeat = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
    scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.matmul(scores.softmax(dim=-1), v.float()).to(q.dtype)


def _blockwise(q, k, v, layout: BlockLayout, scale: float):
    """Exact block attention as context scores + per-block scores under one softmax (see the module
    docstring). Query head h uses KV head h // (Hq / Hk), as SDPA's `enable_gqa`."""
    bsz, num_heads, num_q, dim = q.shape
    num_kv, dim_v = k.shape[1], v.shape[-1]
    rep, t, n = num_heads // num_kv, layout.num_ctx, layout.block_size
    blocks = num_q // n
    if k.shape[2] != t + num_q:
        raise ValueError(
            f"blockwise attention needs the block keys to be the queries' own: "
            f"{k.shape[2]} keys for {t} context slots + {num_q} queries"
        )
    if cpu_kernel.applies(q, k, v, n):  # fp32 on CPU: one C kernel, forward and backward
        return cpu_kernel.cpu_block_attention(q, k, v, layout.ctx_limit, n, scale)
    k_ctx, k_blk, v_ctx, v_blk = k[:, :, :t], k[:, :, t:], v[:, :, :t], v[:, :, t:]
    acc = torch.promote_types(q.dtype, torch.float32)  # scores and softmax in fp32 (or fp64) under bf16
    # the query heads sharing a KV head are stacked along the query axis: one [rep * Q, T] product
    s_ctx = torch.matmul(q.reshape(bsz, num_kv, rep * num_q, dim), k_ctx.transpose(-1, -2))
    s_ctx = s_ctx.view(bsz, num_kv, rep, num_q, t).to(acc) * scale + layout.context_bias(acc)
    s_blk = torch.matmul(
        q.reshape(bsz, num_kv, rep, blocks, n, dim), k_blk.reshape(bsz, num_kv, 1, blocks, n, dim).transpose(-1, -2)
    )
    s_blk = s_blk.reshape(bsz, num_kv, rep, num_q, n).to(acc) * scale
    p = torch.softmax(torch.cat([s_ctx, s_blk], dim=-1), dim=-1).to(v.dtype)
    out = torch.matmul(p[..., :t].reshape(bsz, num_kv, rep * num_q, t), v_ctx).view(bsz, num_kv, rep, num_q, dim_v)
    out_blk = torch.matmul(
        p[..., t:].reshape(bsz, num_kv, rep, blocks, n, n), v_blk.reshape(bsz, num_kv, 1, blocks, n, dim_v)
    )
    return (out + out_blk.view(bsz, num_kv, rep, num_q, dim_v)).view(bsz, num_heads, num_q, dim_v)


def block_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    layout: BlockLayout,
    scale: float,
    impl: str,
) -> torch.Tensor:
    """q [B, Hq, Q, D], k [B, Hk, K, D], v [B, Hk, K, Dv] -> [B, Hq, Q, Dv]; Hk divides Hq.

    Under a torch dispatch mode (training's FLOP counter, `training/flops.py`) the kernel runs outside
    the mode, forward and backward (`_OutsideDispatchModes`): the same kernel as without the mode, and
    one that works there -- flex attention's operator has no rule for such a mode (a TypeError, "no
    implementation found for 'torch.ops.higher_order.flex_attention'"), and dynamo does not compile
    under one. The counter leaves attention to its analytic count anyway."""
    if not torch.compiler.is_compiling() and _get_current_dispatch_mode() is not None:
        return _OutsideDispatchModes.apply(q, k, v, layout, scale, impl, torch.is_grad_enabled())
    return _attend(q, k, v, layout, scale, impl)


class _OutsideDispatchModes(torch.autograd.Function):
    """`_attend` with the active dispatch modes set aside, in the forward and in the backward.

    The forward records its own autograd graph (on detached inputs, in the caller's grad mode) with
    the modes off; the backward differentiates that graph, modes off again, so a compiled
    kernel's backward (flex on CUDA) never runs, or compiles, under the mode either."""

    @staticmethod
    def forward(ctx, q, k, v, layout, scale, impl, grad):
        inputs = [t.detach().requires_grad_(t.requires_grad) for t in (q, k, v)]
        with _disable_current_modes(), torch.set_grad_enabled(grad):
            out = _attend(*inputs, layout, scale, impl)
        ctx.inputs, ctx.out = inputs, out
        return out.detach()

    @staticmethod
    def backward(ctx, grad_out):
        wanted = [t for t in ctx.inputs if t.requires_grad]
        with _disable_current_modes():
            grads = iter(torch.autograd.grad(ctx.out, wanted, grad_out, allow_unused=True))
        return (*(next(grads) if t.requires_grad else None for t in ctx.inputs), None, None, None, None)


def _attend(q, k, v, layout: BlockLayout, scale: float, impl: str) -> torch.Tensor:
    if impl == "blockwise":
        return _blockwise(q, k, v, layout, scale)
    if impl == "sdpa":
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=layout.additive_mask(q.dtype), scale=scale, enable_gqa=q.shape[1] != k.shape[1]
        )
    if impl == "flex":
        return _flex(q, k, v, layout.block_mask(), scale)
    if impl == "eager":
        return _eager(q, k, v, layout.dense_mask(), scale)
    raise ValueError(f"attn_impl must be resolved to blockwise, sdpa, flex or eager, got {impl!r}")
