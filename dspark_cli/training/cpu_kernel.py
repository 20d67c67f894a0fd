"""A fused CPU kernel for the row-wise part of the vocabulary loss, built with the system C compiler.

    kernel = vocab_kernel()            # None where it cannot be built (no gcc, not x86/ARM Linux, ...)
    kernel.rows(z, table, rows, labels, top, w_ce, w_l1, out_scale, by_l1, stats, grads=True)
    kernel.argmax(table)               # [U] int64, the row-wise top-1

Why: on CPU the vocabulary loss of the issue-7 setup spent ~2.8 ms of a ~21 ms step (2 threads) in
a dozen element-wise passes over the [slots, vocab] logits (softmax, p - q gathered from the target
table, |.| and its sum, copysign, the gradient's scale and add, the top-1 tests), each one reading
and writing 3.5 MB, plus an index-returning argmax that is ~15x slower than a plain max on CPU.
This kernel does the same per row in four passes over 4 KB that stay in L1, reading the target row
from the table in place (no gathered copy), in parallel over rows. `loss.vocab_loss` uses it for
fp32 on CPU and keeps the torch implementation everywhere else (GPU, bf16, no compiler, or
DSPARK_CPU_KERNEL=0); tests run both against the same slow reference.

Built once per machine with `gcc -O3 -march=native -fopenmp` into ~/.cache/dspark/ (or
$DSPARK_CACHE_DIR), named by a hash of the source, the flags and the CPU model, written to a
temporary file and renamed (concurrent ranks do not see half a library). gcc links the same
`libgomp.so.1` torch loads, so the kernel's threads are torch's (`torch.get_num_threads()` of them).
Plain C on purpose: no torch headers, no ninja, ~0.3 s to build. The loops are written with GCC's
vector extensions (16 floats: one AVX-512 register or two AVX2 ones) because the auto-vectoriser
left the exp loop scalar (4.1 ms per 880 x 1024 slots on one thread; 0.7 ms vectorised, against
~2.8 ms for the torch passes); `exp` is Cephes' single-precision polynomial (~1 ulp on the range
used, checked against torch in the tests), no -ffast-math (its finite-math assumptions would be
wrong for a loss).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

SOURCE = r"""
#include <math.h>
#include <stdint.h>

/* GCC / clang vector extensions: 16 floats (one AVX-512 register, two AVX2 ones), lane-wise ops. */
typedef float vf __attribute__((vector_size(64)));
typedef int32_t vi __attribute__((vector_size(64)));
#define W 16
#define SIGN ((vi){0} + (int32_t)0x80000000)

static inline vf vload(const float *p) { vf v; __builtin_memcpy(&v, p, sizeof v); return v; }
static inline void vstore(float *p, vf v) { __builtin_memcpy(p, &v, sizeof v); }
static inline vf vsplat(float x) { return (vf){0} + x; }
static inline vf vmax(vf a, vf b) { vi m = a > b; return (vf)((m & (vi)a) | (~m & (vi)b)); }
static inline vf vabs(vf a) { return (vf)((vi)a & ~SIGN); }
static inline vf vcopysign_pos(vf p, vf d) { return (vf)((vi)p | ((vi)d & SIGN)); }  /* p >= 0 */
static inline float hsum(vf v) { float s = 0.0f; for (int k = 0; k < W; k++) s += v[k]; return s; }
static inline float hmax(vf v) { float m = v[0]; for (int k = 1; k < W; k++) m = v[k] > m ? v[k] : m; return m; }

/* exp(x) for x <= 0 (logits minus their row max): Cephes expf, ~1 ulp; below -87 it returns
   ~1e-38 instead of underflowing, which is 0 for every use here. */
static inline vf vexp_le0(vf x) {
    vi low = x < -87.0f;  /* false for NaN: a NaN logit stays NaN and so does the loss */
    x = (vf)((low & (vi)vsplat(-87.0f)) | (~low & (vi)x));
    vi ni = __builtin_convertvector(x * 1.44269504088896341f - 0.5f, vi);  /* round half away (x <= 0) */
    vf n = __builtin_convertvector(ni, vf);
    vf r = x - n * 0.693359375f + n * 2.12194440e-4f;
    vf p = vsplat(1.9875691500e-4f);
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    vf e = p * r * r + r + 1.0f;
    return e * (vf)((ni + 127) << 23);
}
static inline float row_max(const float *x, int64_t V) {
    const int64_t body = V - V % W;
    int64_t v;
    vf mv = vsplat(x[0]);
    for (v = 0; v < body; v += W) mv = vmax(mv, vload(x + v));
    float m = hmax(mv);
    for (; v < V; v++) m = x[v] > m ? x[v] : m;
    return m;
}
static inline float exp_le0(float x) {
    vf v = vexp_le0(vsplat(x));
    return v[0];
}

/* Per row i of z [c, V] (logits, overwritten): p = softmax(z), q = table[rows[i]];
   stats[i] = (CE, L1 = sum|p - q|, z[label] is the max, z[top[rows[i]]] is the max);
   with grads, z becomes d/dz of w_ce*CE + w_l1*L1 divided by out_scale[i]:
   a * copysign(p, p - q) + p * (w_ce - w_l1 * sum_v copysign(p, p - q)_v) / out_scale - onehot * w_ce / out_scale,
   a = 1 when by_l1 (out_scale = w_l1) and w_l1 otherwise. */
void dspark_vocab_rows(int64_t c, int64_t V, float *z, const float *table, const int64_t *rows,
                       const int64_t *labels, const int64_t *top, const float *w_ce, const float *w_l1,
                       const float *out_scale, int by_l1, int grads, float *stats, int threads) {
    const int64_t body = V - V % W;
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t i = 0; i < c; i++) {
        float *zr = z + i * V;
        const float *qr = table + rows[i] * V;
        int64_t v;
        float m = row_max(zr, V);
        float z_label = zr[labels[i]], z_top = zr[top[rows[i]]];
        vf sv = vsplat(0.0f);
        for (v = 0; v < body; v += W) { vf e = vexp_le0(vload(zr + v) - m); vstore(zr + v, e); sv += e; }
        float s = hsum(sv);
        for (; v < V; v++) { float e = exp_le0(zr[v] - m); zr[v] = e; s += e; }
        float inv = 1.0f / s;
        vf l1v = vsplat(0.0f), cv = vsplat(0.0f);
        for (v = 0; v < body; v += W) {
            vf p = vload(zr + v) * inv, d = p - vload(qr + v), ps = vcopysign_pos(p, d);
            l1v += vabs(d);
            cv += ps;
            vstore(zr + v, ps);
        }
        float l1 = hsum(l1v), centre = hsum(cv);
        for (; v < V; v++) {
            float p = zr[v] * inv, d = p - qr[v], ps = copysignf(p, d);
            l1 += fabsf(d);
            centre += ps;
            zr[v] = ps;
        }
        stats[4 * i + 0] = m + logf(s) - z_label;
        stats[4 * i + 1] = l1;
        stats[4 * i + 2] = z_label >= m ? 1.0f : 0.0f;
        stats[4 * i + 3] = z_top >= m ? 1.0f : 0.0f;
        if (grads) {
            float row_scale = (w_ce[i] - w_l1[i] * centre) / out_scale[i];
            float a = by_l1 ? 1.0f : w_l1[i];
            for (v = 0; v < body; v += W) { vf ps = vload(zr + v); vstore(zr + v, ps * a + vabs(ps) * row_scale); }
            for (; v < V; v++) { float ps = zr[v]; zr[v] = ps * a + fabsf(ps) * row_scale; }
            zr[labels[i]] -= w_ce[i] / out_scale[i];
        }
    }
}

/* out[i] = the first index of the largest value of row i of x [n, V] (torch.argmax's tie rule). */
void dspark_row_argmax(int64_t n, int64_t V, const float *x, int64_t *out, int threads) {
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        const float *r = x + i * V;
        float m = row_max(r, V);
        int64_t k = 0;
        while (k < V - 1 && r[k] != m) k++;
        out[i] = k;
    }
}
"""

FLAGS = ["-O3", "-march=native", "-fopenmp", "-fPIC", "-shared", "-std=gnu11"]
_P = ctypes.c_void_p
_I64 = ctypes.c_int64
_loaded: dict[str, object] = {}


def cache_dir() -> Path:
    return Path(os.environ.get("DSPARK_CACHE_DIR") or Path.home() / ".cache" / "dspark") / "kernels"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("model name", "flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor()


def build(compiler: str) -> Path:
    """The shared library for this machine, compiled if it is not in the cache yet."""
    key = hashlib.sha256("\0".join([SOURCE, compiler, *FLAGS, _cpu_model()]).encode()).hexdigest()[:16]
    target = cache_dir() / f"vocab_{key}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        src = Path(tmp) / "vocab.c"
        src.write_text(SOURCE)
        out = Path(tmp) / target.name
        subprocess.run([compiler, *FLAGS, str(src), "-o", str(out), "-lm"], check=True, capture_output=True,
                       timeout=120)
        os.replace(out, target)
    return target


class VocabKernel:
    def __init__(self, lib: ctypes.CDLL) -> None:
        self._rows = lib.dspark_vocab_rows
        self._rows.argtypes = [_I64, _I64, _P, _P, _P, _P, _P, _P, _P, _P, ctypes.c_int, ctypes.c_int, _P,
                               ctypes.c_int]
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

    def rows(self, z, table, rows, labels, top, w_ce, w_l1, out_scale, by_l1: bool, stats, *, grads: bool) -> None:
        """In place: z [c, V] logits -> gradient (with `grads`), stats [c, 4]; see SOURCE."""
        self._check(z=z, table=table, rows=rows, labels=labels, top=top, w_ce=w_ce, w_l1=w_l1,
                    out_scale=out_scale, stats=stats)
        c, vocab = z.shape
        if table.shape[1] != vocab or stats.shape != (c, 4) or not (rows.numel() == labels.numel() == c):
            raise ValueError("vocab kernel: shapes do not line up")
        if c and not (0 <= int(labels.min()) and int(labels.max()) < vocab):  # the C code indexes with them
            raise IndexError(f"vocab kernel: a label is outside the vocabulary of {vocab}")
        self._rows(c, vocab, z.data_ptr(), table.data_ptr(), rows.data_ptr(), labels.data_ptr(), top.data_ptr(),
                   w_ce.data_ptr(), w_l1.data_ptr(), out_scale.data_ptr(), int(by_l1), int(grads), stats.data_ptr(),
                   torch.get_num_threads())

    def argmax(self, x: torch.Tensor) -> torch.Tensor:
        self._check(x=x)
        out = torch.empty(x.shape[0], dtype=torch.int64)
        self._argmax(x.shape[0], x.shape[1], x.data_ptr(), out.data_ptr(), torch.get_num_threads())
        return out


def vocab_kernel() -> VocabKernel | None:
    """The kernel, built on first use; None when switched off (DSPARK_CPU_KERNEL=0), when there is no
    gcc, or when building or loading fails (the torch implementation is then used: same results)."""
    if os.environ.get("DSPARK_CPU_KERNEL", "1") == "0":
        return None
    if "kernel" not in _loaded:
        kernel = None
        compiler = os.environ.get("DSPARK_CC") or shutil.which("gcc")
        if compiler and platform.system() == "Linux":
            try:
                kernel = VocabKernel(ctypes.CDLL(str(build(compiler))))
            except (OSError, subprocess.SubprocessError):
                kernel = None
        _loaded["kernel"] = kernel
    return _loaded["kernel"]  # type: ignore[return-value]
