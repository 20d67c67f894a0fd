"""Model FLOPs per token and the peak they are compared with (model FLOPs utilisation, MFU).

    flops = count_flops(lambda: loss_fn().backward())     # FLOPs of one forward + backward, as run
    peak_flops(torch.device("cuda"), torch.bfloat16)     # dense peak of this device, or None

FLOPs are counted by `torch.utils.flop_counter.FlopCounterMode` over one real training step
(matmuls forward and backward, exactly as executed; the fused vocabulary pass is counted too because
its matmuls run through aten). Attention is added analytically (`attention_flops`) and whatever the
attention kernels execute is left out of the count (SDPA and flex ops, and the batched matmuls of the
blockwise kernel -- the step's other matmuls are 2-D): only the attended pairs are model FLOPs (a
block sees the context before its anchor and its own N slots), not the masked ones a dense kernel
also computes, so MFU does not depend on the attention kernel. MFU = FLOPs/token * tokens/s / peak. The peak of
a CUDA device comes from a table of dense tensor-core numbers; on a CPU, or any device not in the
table, set DSPARK_PEAK_TFLOPS (the benchmark measures one) or MFU is left out.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch

# Dense (no sparsity) peak TFLOP/s by device-name fragment: (bf16/fp16, fp32 via TF32).
CUDA_PEAKS = {
    "H200": (989.0, 494.0),
    "H100": (989.0, 494.0),
    "H800": (989.0, 494.0),
    "H20": (148.0, 74.0),
    "A100": (312.0, 156.0),
    "A800": (312.0, 156.0),
    "L40S": (362.0, 183.0),
    "B200": (2250.0, 1100.0),
}


ATTENTION_OPS = ("bmm", "scaled_dot_product", "flex_attention")  # counted by `attention_flops` instead


def count_flops(fn: Callable[[], object]) -> int:
    """FLOPs `fn` executes, attention kernels excepted (see the module docstring)."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        fn()
    counts = counter.get_flop_counts().get("Global", {})
    return int(sum(flops for op, flops in counts.items() if not any(name in str(op) for name in ATTENTION_OPS)))


def attention_flops(anchors: torch.Tensor, anchor_mask: torch.Tensor, config) -> int:
    """Forward + backward (x3) FLOPs of the attended (query, key) pairs of one batch's blocks."""
    n = config.block_size
    if config.arch == "mla":
        qk, v = config.qk_nope_head_dim + config.qk_rope_head_dim, config.v_head_dim
    else:
        qk = v = config.head_dim
    keys = int(((anchors + n) * anchor_mask).sum())  # per block: anchor context positions + its own N slots
    return 3 * 2 * keys * n * config.num_attention_heads * (qk + v) * config.num_hidden_layers


def peak_flops(device: torch.device, dtype: torch.dtype) -> float | None:
    """Peak FLOP/s of one device for `dtype`; DSPARK_PEAK_TFLOPS overrides; None when unknown."""
    override = os.environ.get("DSPARK_PEAK_TFLOPS")
    if override:
        return float(override) * 1e12
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for fragment, (half, single) in CUDA_PEAKS.items():
        if fragment in name:
            return (half if dtype in (torch.bfloat16, torch.float16) else single) * 1e12
    return None
