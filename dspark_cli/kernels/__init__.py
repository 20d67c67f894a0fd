"""Small C kernels for fp32 training on CPU, built with the system C compiler on first use.

    from dspark_cli.kernels import library
    lib = library()        # ctypes.CDLL, or None: no gcc, not Linux, DSPARK_CPU_KERNEL=0, build failed

What is here (each with a torch implementation of the same math that runs wherever the kernel does
not: GPU, bf16, no compiler; tests run both against slow references):
- `vocab.py` / `csrc/vocab.c`: the vocabulary loss's row-wise passes (used by `training.loss`);
- `attention.py` / `csrc/attention.c`: DSpark block attention forward and backward, as a torch
  custom op (used by `draft.attention`'s "blockwise" on CPU, eager and under torch.compile).

The sources in `csrc/` are compiled together into one shared library, once per machine, with
`gcc -O3 -march=native -fopenmp` into ~/.cache/dspark/kernels (or $DSPARK_CACHE_DIR/kernels), named
by a hash of the sources, the flags and the CPU model, written to a temporary file and renamed
(concurrent ranks never load half a library). gcc links the same `libgomp.so.1` torch loads, so the
kernels' threads are torch's (`torch.get_num_threads()` of them). Plain C on purpose: no torch
headers, no ninja, ~1 s to build. The loops use GCC's vector extensions (16 floats: one AVX-512
register or two AVX2 ones; `csrc/prelude.h`) because the auto-vectoriser left the exp loops scalar;
`exp` is Cephes' single-precision polynomial (~1 ulp on the range used, checked in the tests), and
there is no -ffast-math (its finite-math assumptions would be wrong for a loss or a masked softmax).
$DSPARK_CC picks another compiler.
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

CSRC = Path(__file__).resolve().parent / "csrc"
SOURCES = ("vocab.c", "attention.c")
FLAGS = ["-O3", "-march=native", "-fopenmp", "-fPIC", "-shared", "-std=gnu11"]
_loaded: dict[str, ctypes.CDLL | None] = {}


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
    texts = [(CSRC / name).read_text() for name in ("prelude.h", *SOURCES)]
    key = hashlib.sha256("\0".join([*texts, compiler, *FLAGS, _cpu_model()]).encode()).hexdigest()[:16]
    target = cache_dir() / f"dspark_{key}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        out = Path(tmp) / target.name
        subprocess.run([compiler, *FLAGS, f"-I{CSRC}", *(str(CSRC / name) for name in SOURCES), "-o", str(out),
                        "-lm"], check=True, capture_output=True, timeout=300)
        os.replace(out, target)
    return target


def enabled() -> bool:
    return os.environ.get("DSPARK_CPU_KERNEL", "1") != "0"


def library() -> ctypes.CDLL | None:
    """The kernels, built on first use; None when switched off (DSPARK_CPU_KERNEL=0), when there is
    no gcc, or when building or loading fails (callers then run their torch code: same results)."""
    if not enabled():
        return None
    if "lib" not in _loaded:
        lib = None
        compiler = os.environ.get("DSPARK_CC") or shutil.which("gcc")
        if compiler and platform.system() == "Linux":
            try:
                lib = ctypes.CDLL(str(build(compiler)))
            except (OSError, subprocess.SubprocessError):
                lib = None
        _loaded["lib"] = lib
    return _loaded["lib"]
