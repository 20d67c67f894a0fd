"""Child processes that do not outlive the process that started them, or the stage that needed them.

    subprocess.Popen(cmd, preexec_fn=dies_with_parent(signal.SIGTERM))
    stop_vllm_engine(llm)      # a vllm.LLM's engine-core process, when datagen / capture are done with it

A parent that is killed outright (SIGKILL, the OOM killer) cannot stop its children itself. On Linux
the child asks the kernel, between fork and exec, for `sig` when the thread that started it ends
(`PR_SET_PDEATHSIG`): SIGTERM for a child that stops cleanly on it (vLLM, torchrun, which stop their
own children), SIGKILL for one whose work is resumable anyway (capture producers and workers).
Elsewhere there is no such call, and `dies_with_parent` returns None (no preexec_fn).
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable
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
