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
by a hash of the sources, the compiler and its version, the flags, and the CPU's model and feature
flags (a home directory shared by machines with different instruction sets gets one library per
instruction set, never one that dies with SIGILL), written to a temporary file and renamed
(concurrent ranks never load half a library). gcc links the same `libgomp.so.1` torch loads, so the
kernels' threads are torch's (`torch.get_num_threads()` of them). Plain C on purpose: no torch
headers, no ninja, ~1 s to build. The loops use GCC's vector extensions (16 floats: one AVX-512
register or two AVX2 ones; `csrc/prelude.h`) because the auto-vectoriser left the exp loops scalar;
`exp` is Cephes' single-precision polynomial (~1 ulp on the range used, checked in the tests), and
there is no -ffast-math (its finite-math assumptions would be wrong for a loss or a masked softmax).
$DSPARK_CC picks another compiler. A build that fails is reported once, in one log line, and the
torch code runs instead (about half the speed on CPU).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
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
log = logging.getLogger(__name__)


def cache_dir() -> Path:
    return Path(os.environ.get("DSPARK_CACHE_DIR") or Path.home() / ".cache" / "dspark") / "kernels"


def cpu_identity() -> str:
    """The first processor's model and feature flags (x86 `flags`, Arm `Features`): what -march=native
    compiles for."""
    wanted = ("vendor_id", "model name", "flags", "Features", "CPU implementer", "CPU part")
    try:
        lines = Path("/proc/cpuinfo").read_text().split("\n\n")[0].splitlines()
    except OSError:
        lines = []
    found = [" ".join(line.split()) for line in lines if line.split(":")[0].strip() in wanted]
    return "\n".join(found) or f"{platform.machine()} {platform.processor()}"


def _compiler_version(compiler: str) -> str:
    try:
        return subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def build(compiler: str) -> Path:
    """The shared library for this machine, compiled if it is not in the cache yet."""
    texts = [(CSRC / name).read_text() for name in ("prelude.h", *SOURCES)]
    identity = [*texts, compiler, _compiler_version(compiler), *FLAGS, cpu_identity()]
    key = hashlib.sha256("\0".join(identity).encode()).hexdigest()[:16]
    target = cache_dir() / f"dspark_{key}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        out = Path(tmp) / target.name
        subprocess.run(
            [compiler, *FLAGS, f"-I{CSRC}", *(str(CSRC / name) for name in SOURCES), "-o", str(out), "-lm"],
            check=True,
            capture_output=True,
            timeout=300,
        )
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
            except (OSError, subprocess.SubprocessError) as exc:
                detail = getattr(exc, "stderr", None) or str(exc)
                detail = (detail.decode(errors="replace") if isinstance(detail, bytes) else detail).strip()
                log.warning(
                    "dspark's CPU kernels did not build with %s (%s); training runs the slower torch code "
                    "(DSPARK_CPU_KERNEL=0 silences this)",
                    compiler,
                    (detail.splitlines() or ["?"])[-1][:200],
                )
                lib = None
        _loaded["lib"] = lib
    return _loaded["lib"]
