"""What the CLI tests share: a `dspark` run in this process and the shape of a user error.

from cli_support import assert_user_error, invoke, invoke_process
assert_user_error(invoke("validate", "missing.yaml"), "missing.yaml")     # exit 2 by default
invoke_process("validate", "bomb.yaml", timeout=60)    # a `dspark` process, for what might hang
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

from typer.testing import CliRunner

from dspark_cli.cli import app

runner = CliRunner()


def invoke(*args: str):
    """`dspark ARGS` through typer's CliRunner, in this process."""
    return runner.invoke(app, list(args))


# runs its arguments as a child and writes the child's peak RSS (KiB, Linux) as the last line of stderr
_PEAK = (
    "import resource, subprocess, sys; code = subprocess.run(sys.argv[1:]).returncode; "
    "print('peak_rss_kib', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); "
    "sys.exit(code)"
)


def invoke_process(*args: str, timeout: float):
    """`dspark ARGS` as a process of its own, killed after `timeout` s (subprocess.TimeoutExpired): for input
    that might hang the CLI, which in this process would hang the test run. Its result reads as `invoke`'s
    (`exit_code`, `output`: stdout and stderr), plus `peak_rss_mib`, the process's peak memory."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _PEAK, str(Path(sys.executable).with_name("dspark")), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the wrapper and the dspark process under it
        proc.communicate()
        raise
    lines, kib = stderr.splitlines(), 0
    if lines and lines[-1].startswith("peak_rss_kib "):
        kib = int(lines.pop().split()[1])
    return SimpleNamespace(
        exit_code=proc.returncode, output=stdout + "".join(f"{line}\n" for line in lines), peak_rss_mib=kib / 1024
    )


def assert_user_error(result, *needles: str, exit_code: int = 2) -> None:
    """One `error:` line naming what is wrong, one `hint:` line, no traceback and no "internal error"."""
    lines = result.output.strip().splitlines()
    assert result.exit_code == exit_code, result.output
    assert "internal error" not in result.output and "Traceback" not in result.output, result.output
    assert len(lines) == 2 and lines[0].startswith("error: ") and lines[1].startswith("hint: "), result.output
    for needle in needles:
        assert needle in lines[0], (needle, result.output)
