"""What the CLI tests share: a `dspark` run in this process and the shape of a user error.

    from cli_support import assert_user_error, invoke
    assert_user_error(invoke("validate", "missing.yaml"), "missing.yaml")     # exit 2 by default
"""

from __future__ import annotations

from typer.testing import CliRunner

from dspark_cli.cli import app

runner = CliRunner()


def invoke(*args: str):
    """`dspark ARGS` through typer's CliRunner, in this process."""
    return runner.invoke(app, list(args))


def assert_user_error(result, *needles: str, exit_code: int = 2) -> None:
    """One `error:` line naming what is wrong, one `hint:` line, no traceback and no "internal error"."""
    lines = result.output.strip().splitlines()
    assert result.exit_code == exit_code, result.output
    assert "internal error" not in result.output and "Traceback" not in result.output, result.output
    assert len(lines) == 2 and lines[0].startswith("error: ") and lines[1].startswith("hint: "), result.output
    for needle in needles:
        assert needle in lines[0], (needle, result.output)
