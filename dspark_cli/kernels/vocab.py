"""The vocabulary loss's row-wise passes as one CPU kernel (`csrc/vocab.c`; built as `kernels/__init__.py` says).

    kernel = vocab_kernel()            # None where the kernels cannot be built (see `kernels.library`)
    kernel.rows(z, table, rows, labels, top, w_ce, w_l1, out_scale, by_l1, stats, grads=True, shares=(0, 0, 1))
    kernel.argmax(table)               # [U] int64, the row-wise top-1

Why: on CPU the vocabulary loss of the tiny training setup spent a large share of a step in
a dozen element-wise passes over the [slots, vocab] logits (softmax, p - q gathered from the target
table, |.| and its sum, copysign, the gradient's scale and add, the top-1 tests), each one reading
and writing 3.5 MB, plus an index-returning argmax that is ~15x slower than a plain max on CPU.
This kernel does the same per row in four passes over 4 KB that stay in L1, reading the target row
from the table in place (no gathered copy), in parallel over rows. `loss.vocab_loss` uses it for
fp32 on CPU and keeps the torch implementation everywhere else (GPU, bf16, no compiler, or
DSPARK_CPU_KERNEL=0); tests run both against the same slow reference. A first, auto-vectorised
version was slower than the torch passes (gcc left the exp loop scalar); written with vector
extensions it is several times faster than them (benchmarks/train_speed.py has the timings).
"""

from __future__ import annotations

import ctypes

import torch

from dspark_cli.kernels import library

_P = ctypes.c_void_p
_I64 = ctypes.c_int64
_loaded: dict[str, object] = {}


class VocabKernel:
    def __init__(self, lib: ctypes.CDLL) -> None:
        self._rows = lib.dspark_vocab_rows
        self._rows.argtypes = [
            _I64,
            _I64,
            _P,
            _P,
            _P,
            _P,
            _P,
            _P,
            _P,
            _P,
            ctypes.c_int,
            ctypes.c_float,
            ctypes.c_float,
            ctypes.c_float,
            ctypes.c_int,
            _P,
            ctypes.c_int,
        ]
        self._rows.restype = None
        self._argmax = lib.dspark_row_argmax
        self._argmax.argtypes = [_I64, _I64, _P, _P, ctypes.c_int]
        self._argmax.restype = None

    @staticmethod
    def _check(**tensors: torch.Tensor) -> None:
        for name, t in tensors.items():
            want = torch.int64 if name in ("rows", "labels", "top") else torch.float32
            if t.device.type != "cpu" or t.dtype != want or not t.is_contiguous():
                raise ValueError(f"{name}: need a contiguous CPU {want} tensor, got {t.dtype} on {t.device}")

    def rows(
        self,
        z,
        table,
        rows,
        labels,
        top,
        w_ce,
        w_l1,
        out_scale,
        by_l1: bool,
        stats,
        *,
        grads: bool,
        shares: tuple[float, float, float] = (0.0, 0.0, 1.0),
    ) -> None:
        """In place: z [c, V] logits -> gradient (with `grads`), stats [c, 4]; see csrc/vocab.c. `shares`:
        the CE target's weights on q, on the target's top-1 and on the label (`loss.ce_shares`)."""
        self._check(
            z=z, table=table, rows=rows, labels=labels, top=top, w_ce=w_ce, w_l1=w_l1, out_scale=out_scale, stats=stats
        )
        c, vocab = z.shape
        if table.shape[1] != vocab or stats.shape != (c, 4) or not (rows.numel() == labels.numel() == c):
            raise ValueError("vocab kernel: shapes do not line up")
        if c and not (0 <= int(labels.min()) and int(labels.max()) < vocab):  # the C code indexes with them
            raise IndexError(f"vocab kernel: a label is outside the vocabulary of {vocab}")
        self._rows(
            c,
            vocab,
            z.data_ptr(),
            table.data_ptr(),
            rows.data_ptr(),
            labels.data_ptr(),
            top.data_ptr(),
            w_ce.data_ptr(),
            w_l1.data_ptr(),
            out_scale.data_ptr(),
            int(by_l1),
            *map(float, shares),
            int(grads),
            stats.data_ptr(),
            torch.get_num_threads(),
        )

    def argmax(self, x: torch.Tensor) -> torch.Tensor:
        self._check(x=x)
        out = torch.empty(x.shape[0], dtype=torch.int64)
        self._argmax(x.shape[0], x.shape[1], x.data_ptr(), out.data_ptr(), torch.get_num_threads())
        return out


def vocab_kernel() -> VocabKernel | None:
    """The kernel, or None where `kernels.library()` is None (the torch implementation is then used:
    same results)."""
    lib = library()
    if lib is None:
        return None
    if "kernel" not in _loaded:
        _loaded["kernel"] = VocabKernel(lib)
    return _loaded["kernel"]  # type: ignore[return-value]
