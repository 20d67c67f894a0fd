"""The C block-attention kernel (dspark_cli/kernels/attention.py) against a float64 dense-mask reference.

The reference is the textbook computation: every (query, key) score, the mask from the layout's rule
(`BlockLayout.dense_mask`), softmax, times v, and autograd for the gradients, in float64. The kernel
runs in fp32, so agreement is to fp32 rounding (~1e-6 here)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from requirements_support import requires

from dspark_cli.draft.attention import BlockLayout, block_attention
from dspark_cli.kernels import attention as kernel

pytestmark = requires("gcc")  # the C kernels built


def reference(q, k, v, ctx_limit, n, scale):
    """float64 dense masked softmax attention, GQA by repeating KV heads."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    mask = BlockLayout(num_ctx=k.shape[2] - q.shape[2], block_size=n, ctx_limit=ctx_limit).dense_mask()
    scores = (q @ k.transpose(-1, -2) * scale).masked_fill(~mask, float("-inf"))
    return scores.softmax(-1) @ v


def inputs(bsz, hq, hk, ctx, blocks, n, d, dv, *, strided, seed=0):
    g = torch.Generator().manual_seed(seed)
    q_len, k_len = blocks * n, ctx + blocks * n
    if strided:  # as the attention modules pass them: [B, S, H, D] transposed to [B, H, S, D]
        q = torch.randn(bsz, q_len, hq, d, generator=g).transpose(1, 2)
        k = torch.randn(bsz, k_len, hk, d, generator=g).transpose(1, 2)
        v = torch.randn(bsz, k_len, hk, dv, generator=g).transpose(1, 2)
    else:
        q, k = torch.randn(bsz, hq, q_len, d, generator=g), torch.randn(bsz, hk, k_len, d, generator=g)
        v = torch.randn(bsz, hk, k_len, dv, generator=g)
    # limits below 0 and above the context are clamped (a block then sees no / all context)
    ctx_limit = torch.randint(-2, ctx + 3, (bsz, blocks), generator=g)
    return q, k, v, ctx_limit


CASES = {  # bsz, Hq, Hk, context, blocks, N, D, Dv
    "issue-7 shapes": (4, 4, 2, 128, 32, 7, 16, 16),
    "one kv head, wider q (segments path)": (1, 3, 1, 37, 5, 4, 32, 16),
    "block of 16, MLA-like dims": (2, 2, 1, 50, 3, 16, 48, 32),
    "block of 1": (2, 2, 2, 200, 9, 1, 16, 48),
    "no context": (2, 2, 2, 0, 9, 3, 16, 16),
}


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("strided", [False, True], ids=["contiguous", "strided"])
@pytest.mark.parametrize("keep", [True, False], ids=["kept-softmax", "recomputed-softmax"])
@pytest.mark.parametrize("case", list(CASES))
def test_kernel_matches_float64_reference(monkeypatch, case, keep, strided, threads):
    """Both backward paths: the forward's softmax kept, or recomputed from the log-sum-exp."""
    if not keep:
        monkeypatch.setattr(kernel, "PROBS_BYTES", 0)
    bsz, hq, hk, ctx, blocks, n, d, dv = CASES[case]
    q, k, v, ctx_limit = inputs(bsz, hq, hk, ctx, blocks, n, d, dv, strided=strided)
    scale = d**-0.5
    assert kernel.applies(q, k, v, n)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        out = kernel.cpu_block_attention(*leaves, ctx_limit, n, scale)
        grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
        grads = torch.autograd.grad(out, leaves, grad_out)
    finally:
        torch.set_num_threads(before)
    ref_leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    ref = reference(*ref_leaves, ctx_limit, n, scale)
    ref_grads = torch.autograd.grad(ref, ref_leaves, grad_out.double())
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=2e-6)
    for got, want, name in zip(grads, ref_grads, "qkv"):
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=5e-6, msg=lambda m, name=name: f"d{name}: {m}")


def test_block_attention_uses_the_kernel_only_where_it_applies(monkeypatch):
    """fp32 with head dims that are multiples of 16 run the kernel; fp64, other head dims and
    DSPARK_CPU_KERNEL=0 run the torch code; all agree."""
    q, k, v, ctx_limit = inputs(2, 4, 2, 20, 4, 3, 16, 16, strided=True)
    layout = BlockLayout(num_ctx=20, block_size=3, ctx_limit=ctx_limit)
    calls = []
    real = kernel.cpu_block_attention
    monkeypatch.setattr(kernel, "cpu_block_attention", lambda *a: calls.append(1) or real(*a))
    fast = block_attention(q, k, v, layout, 0.25, "blockwise")
    assert calls == [1]
    slow64 = block_attention(q.double(), k.double(), v.double(), layout, 0.25, "blockwise")
    q12, k12 = q[..., :12], k[..., :12]
    assert not kernel.applies(q12, k12, v, 3)
    block_attention(q12, k12, v, layout, 0.25, "blockwise")
    monkeypatch.setenv("DSPARK_CPU_KERNEL", "0")
    slow = block_attention(q, k, v, layout, 0.25, "blockwise")
    assert calls == [1]
    torch.testing.assert_close(fast, slow, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(fast.double(), slow64, rtol=1e-5, atol=1e-6)


def test_inputs_the_c_code_cannot_take_are_refused():
    """The C code indexes with the sizes it is given: anything else is a ValueError before it runs."""
    q, k, v, ctx_limit = inputs(1, 2, 1, 16, 2, 4, 16, 16, strided=False)
    for bad in (
        (q[..., :8], k[..., :8], v, ctx_limit, 4),
        (q, k, v[..., :8], ctx_limit, 4),
        (q, k, v, ctx_limit, 3),
        (q, k, v, ctx_limit[:, :1], 4),
        (q.double(), k.double(), v.double(), ctx_limit, 4),
    ):
        with pytest.raises(ValueError):
            torch.ops.dspark.block_attention(*bad, 0.25, False)


def test_nan_input_gives_nan_output_rows():
    """A NaN in one query row must show (a diverged run must not look healthy)."""
    q, k, v, ctx_limit = inputs(1, 2, 1, 16, 2, 4, 16, 16, strided=False)
    q[0, 1, 5, 3] = float("nan")
    out = kernel.cpu_block_attention(q, k, v, ctx_limit, 4, 0.25)
    assert out[0, 1, 5].isnan().all()
    assert not out[0, 0].isnan().any() and not out[0, 1, :5].isnan().any()


@pytest.mark.slow  # torch.compile of the custom op: ~25 s loaded
def test_custom_op_registration_and_torch_compile():
    """torch's own checks of the op (schema, fake tensors, autograd registration); under a fullgraph
    torch.compile (no graph break: the kernel decision is taken at trace time) the traced graph calls
    the op, and inductor's code gives the eager kernel's output and gradients."""
    q, k, v, ctx_limit = inputs(2, 4, 2, 24, 3, 5, 16, 32, strided=True)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    for keep in (True, False):
        torch.library.opcheck(torch.ops.dspark.block_attention.default, (*leaves, ctx_limit, 5, 0.25, keep))

    def attend(q, k, v, ctx_limit):
        return (
            block_attention(q, k, v, BlockLayout(num_ctx=24, block_size=5, ctx_limit=ctx_limit), 0.25, "blockwise")
            .square()
            .sum()
        )

    traced: set = set()

    def record(gm, example_inputs):
        traced.update(node.target for node in gm.graph.nodes)
        return gm

    torch.compile(attend, backend=record, fullgraph=True, dynamic=False)(*leaves, ctx_limit)
    assert torch.ops.dspark.block_attention.default in traced
    compiled = torch.compile(attend, fullgraph=True, dynamic=False)
    got = torch.autograd.grad(compiled(*leaves, ctx_limit), leaves)
    want = torch.autograd.grad(attend(*leaves, ctx_limit), leaves)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_kernel_on_is_marked_as_torch_compilers_decorator_would_mark_it():
    """`kernel_on` sets the mark itself (the decorator imports all of torch._dynamo); torch's own
    decorator must set exactly that mark, or compiled graphs would trace into ctypes."""

    def probe() -> bool:
        return True

    marked = torch.compiler.assume_constant_result(probe)
    assert vars(marked) == {"_dynamo_marked_constant": True}
    assert vars(kernel.kernel_on) == vars(marked)


def test_loading_the_draft_does_not_import_torch_dynamo():
    """`dspark publish` or `export --check` lists a draft's tensors on the meta device: no torch._dynamo
    (~2 s of imports per process), and the initialisers torch.nn.init held before are back after."""
    code = (
        "import sys, torch; from dspark_cli.recipe import load_recipe; "
        "from dspark_cli.export.roster import tensor_roster; from dspark_cli.draft.build import draft_config_from_recipe; "
        "r = load_recipe('kimi-k3'); cfg = draft_config_from_recipe(r.draft.model_dump(), r.target.model_dump()); "
        "init = dict(vars(torch.nn.init)); rows = tensor_roster(cfg); "
        "assert rows and vars(torch.nn.init) == init; print('torch._dynamo' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "False"
