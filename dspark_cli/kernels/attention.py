"""DSpark block attention on CPU as one C kernel (`csrc/attention.c`), forward and backward.

    from dspark_cli.kernels.attention import cpu_block_attention, applies
    if applies(q, k, v, block_size):
        out = cpu_block_attention(q, k, v, ctx_limit, block_size, scale)   # differentiable

Same contract as `draft.attention._blockwise` (q [B, Hq, Q, D], k [B, Hk, T + Q, D], v [B, Hk, T + Q, Dv],
block j of N queries sees context keys < ctx_limit[b, j] and its own N keys), for fp32 CPU tensors
with D and Dv multiples of 16 and N <= 16; `_blockwise` calls it when `applies` and runs its torch
code otherwise. It is a torch custom op (`dspark::block_attention`, with a fake implementation and
an autograd formula), so torch.compile keeps it as one call inside the compiled graph.

Why: on CPU attention was a large share of a compiled training step (measured by swapping it for a
no-op): two batched matmuls over every (query, context key) pair of which a block uses only the keys
before its anchor (~half), a [B, H, Q, T + N] score tensor written and re-read by the fused softmax,
and the same again in backward. The kernel visits only the keys a block sees and keeps a block's
scores in L1. When gradients are wanted the forward also keeps the softmax rows for the backward (up
to PROBS_BYTES per layer), which is faster than recomputing them from the saved log-sum-exp as flash
attention does; above that size it recomputes. Per layer it is about twice as fast as the
torch.compile'd blockwise code; the timings are in benchmarks/train_speed.py (DIAGNOSIS) and
docs/train.md, Speed.
"""

from __future__ import annotations

import ctypes

import torch

from dspark_cli.kernels import library

WIDTH = 16  # floats per vector in csrc/prelude.h: head dims must be multiples, blocks at most this
PROBS_BYTES = 64 << 20  # the forward keeps its softmax for the backward up to this size, else it is recomputed
_P, _I64 = ctypes.c_void_p, ctypes.c_int64
_fns: dict[str, object] = {}


def _lib():
    if "fwd" not in _fns:
        lib = library()
        if lib is None:
            raise RuntimeError("dspark CPU kernels are not available (see dspark_cli.kernels)")
        fwd, bwd = lib.dspark_block_attn_fwd, lib.dspark_block_attn_bwd
        strides = ctypes.POINTER(ctypes.c_int64)
        fwd.argtypes = [_I64] * 8 + [strides, _P, _P, _P, _P, ctypes.c_float, _P, _P, _P, ctypes.c_int]
        bwd.argtypes = [_I64] * 8 + [
            strides,
            _P,
            _P,
            _P,
            _P,
            ctypes.c_float,
            _P,
            _P,
            _P,
            _P,
            _P,
            _P,
            _P,
            _I64,
            ctypes.c_int,
        ]
        fwd.restype = bwd.restype = None
        _fns.update(fwd=fwd, bwd=bwd)
    return _fns["fwd"], _fns["bwd"]


def kernel_on() -> bool:
    return library() is not None


# torch.compile takes the answer at trace time, as a constant: what `torch.compiler.assume_constant_result`
# marks, without the import of all of torch._dynamo that the decorator does (~2 s in every process that
# loads the draft, e.g. `dspark publish`); tests/draft/test_cpu_attention_kernel.py checks the two agree
kernel_on._dynamo_marked_constant = True  # type: ignore[attr-defined]


def _supported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_size: int) -> bool:
    """fp32 CPU tensors, head dims in whole vectors, whole blocks of 1 to WIDTH queries."""
    return (
        all(t.device.type == "cpu" and t.dtype == torch.float32 for t in (q, k, v))
        and q.shape[-1] % WIDTH == 0
        and v.shape[-1] % WIDTH == 0
        and 1 <= block_size <= WIDTH
        and q.shape[2] % block_size == 0
    )


def applies(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_size: int) -> bool:
    """Whether the kernel runs these inputs (else the caller's torch code does)."""
    return _supported(q, k, v, block_size) and kernel_on()


def _unit_last(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def _strides(*tensors: torch.Tensor):
    flat = [s for t in tensors for s in t.stride()[:3]]
    return (ctypes.c_int64 * len(flat))(*flat)


def _dims(q, k, v, ctx_limit, block_size):
    """The kernel's size arguments, after checking everything the C code relies on (it indexes with them)."""
    bsz, hq, nq, d = q.shape
    hk, nk, dv = k.shape[1], k.shape[2], v.shape[-1]
    if (
        not _supported(q, k, v, block_size)
        or k.shape[0] != bsz
        or v.shape[:3] != k.shape[:3]
        or k.shape[-1] != d
        or hq % hk
        or nk < nq
        or tuple(ctx_limit.shape) != (bsz, nq // block_size)
    ):
        raise ValueError(
            f"block attention kernel: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}, "
            f"ctx_limit {tuple(ctx_limit.shape)}, blocks of {block_size}: not fp32 CPU tensors of "
            f"fitting shapes (head dims multiples of {WIDTH}, blocks of 1 to {WIDTH})"
        )
    return bsz, hq, hk, nk - nq, nq, block_size, d, dv


def _probs_shape(q: torch.Tensor, k: torch.Tensor, keep: bool) -> tuple[int, ...]:
    """Rows x row width of the softmax the forward keeps ((0,) when not asked to or over PROBS_BYTES): one
    row per query head and query, the context padded to WIDTH plus one vector for the block (csrc/attention.c)."""
    bsz, hq, nq = q.shape[:3]
    width = -(-(k.shape[2] - nq) // WIDTH) * WIDTH + WIDTH
    rows = bsz * hq * nq
    return (rows, width) if keep and rows * width * 4 <= PROBS_BYTES else (0,)


def _segments(bsz: int, hk: int, num_blocks: int) -> int:
    """Block segments per (row, KV head) in backward: enough units for every thread twice over."""
    want = -(-2 * torch.get_num_threads() // max(1, bsz * hk))
    return max(1, min(want, num_blocks))


@torch.library.custom_op("dspark::block_attention", mutates_args=())
def _forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    ctx_limit: torch.Tensor,
    block_size: int,
    scale: float,
    keep_probs: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out, lse, probs): lse and probs (the softmax, kept with `keep_probs` below PROBS_BYTES, else empty) are
    for the backward, which recomputes the softmax when probs is empty (~35% more backward work)."""
    q, k, v = _unit_last(q), _unit_last(k), _unit_last(v)
    dims = _dims(q, k, v, ctx_limit, block_size)
    bsz, hq, _, _, nq, _, _, dv = dims
    out = q.new_empty(bsz, nq, hq, dv).transpose(1, 2)  # [B, H, Q, Dv] laid out as [B, Q, H, Dv]
    lse = q.new_empty(bsz, hq, nq)
    probs = q.new_empty(_probs_shape(q, k, keep_probs))
    if out.numel():
        limit = ctx_limit.to(torch.int64).contiguous()
        strides = _strides(q, k, v, out)
        _lib()[0](
            *dims,
            strides,
            q.data_ptr(),
            k.data_ptr(),
            v.data_ptr(),
            limit.data_ptr(),
            scale,
            out.data_ptr(),
            lse.data_ptr(),
            probs.data_ptr() if probs.numel() else None,
            torch.get_num_threads(),
        )
    return out, lse, probs


@_forward.register_fake
def _(q, k, v, ctx_limit, block_size, scale, keep_probs):
    bsz, hq, nq = q.shape[:3]
    return (
        q.new_empty(bsz, nq, hq, v.shape[-1]).transpose(1, 2),
        q.new_empty(bsz, hq, nq),
        q.new_empty(_probs_shape(q, k, keep_probs)),
    )


@torch.library.custom_op("dspark::block_attention_backward", mutates_args=())
def _backward_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    ctx_limit: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    probs: torch.Tensor,
    grad_out: torch.Tensor,
    block_size: int,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    q, k, v, out, grad_out = (_unit_last(t) for t in (q, k, v, out, grad_out))
    dims = _dims(q, k, v, ctx_limit, block_size)
    want = (*q.shape[:3], v.shape[-1])
    if (
        tuple(out.shape) != want
        or tuple(grad_out.shape) != want
        or tuple(lse.shape) != want[:3]
        or (probs.numel() and tuple(probs.shape) != _probs_shape(q, k, True))
    ):
        raise ValueError("block attention kernel backward: out, grad_out, lse or probs do not fit q, k, v")
    grads = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    if q.numel() and k.numel():
        limit = ctx_limit.to(torch.int64).contiguous()
        lse = lse.contiguous()
        strides = _strides(q, k, v, out, grad_out, *grads)
        segs = _segments(dims[0], dims[2], dims[4] // block_size)
        _lib()[1](
            *dims,
            strides,
            q.data_ptr(),
            k.data_ptr(),
            v.data_ptr(),
            limit.data_ptr(),
            scale,
            out.data_ptr(),
            lse.data_ptr(),
            probs.data_ptr() if probs.numel() else None,
            grad_out.data_ptr(),
            *(g.data_ptr() for g in grads),
            segs,
            torch.get_num_threads(),
        )
    else:
        for g in grads:
            g.zero_()
    return grads


@_backward_op.register_fake
def _(q, k, v, ctx_limit, out, lse, probs, grad_out, block_size, scale):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs, output):
    q, k, v, ctx_limit, block_size, scale, _ = inputs
    ctx.save_for_backward(q, k, v, ctx_limit, *output)
    ctx.block_size, ctx.scale = block_size, scale
    ctx.mark_non_differentiable(output[1], output[2])


def _backward(ctx, grad_out, grad_lse, grad_probs):
    del grad_lse, grad_probs  # auxiliary outputs for the backward, marked non-differentiable
    q, k, v, ctx_limit, out, lse, probs = ctx.saved_tensors
    dq, dk, dv = _backward_op(q, k, v, ctx_limit, out, lse, probs, grad_out, ctx.block_size, ctx.scale)
    return dq, dk, dv, None, None, None, None


_forward.register_autograd(_backward, setup_context=_setup_context)


def cpu_block_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx_limit: torch.Tensor, block_size: int, scale: float
) -> torch.Tensor:
    """[B, Hq, Q, Dv] block attention (see the module docstring); call only where `applies`."""
    keep = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    return _forward(q, k, v, ctx_limit, block_size, scale, keep)[0]
