"""Terminal output for the CLI layer (rich lives here and in cli/ only).

Errors are one line plus a hint on stderr; `DSPARK_DEBUG=1` re-raises so the traceback shows.
Nothing here imports torch, transformers or vllm.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from dspark_cli.errors import DsparkError, RecipeError, debug_enabled, user_error

stdout = Console(highlight=False, soft_wrap=True)
stderr = Console(stderr=True, highlight=False, soft_wrap=True)

F = TypeVar("F", bound=Callable[..., Any])


def _clean(text: str) -> str:
    """`text` without hub tokens: hub clients' own messages are scrubbed where they are called
    (publish/hubs.py); this catches any other path a token could take to the terminal."""
    from dspark_cli.hubrules import known_tokens, scrub

    return scrub(text, known_tokens())


def report_error(exc: DsparkError) -> None:
    """Print a DsparkError as `error: ...` lines (one per problem) and a `hint:` line."""
    lines = exc.problems if isinstance(exc, RecipeError) else [exc.message]
    for line in lines:
        stderr.print(Text("error: ", style="bold red") + Text(_clean(line)))
    if exc.hint:
        stderr.print(Text("hint: ", style="yellow") + Text(_clean(exc.hint)))


def handle_errors(func: F) -> F:
    """Run a command; turn DsparkError / Ctrl-C / unexpected failures into exit codes 1, 2, 130.

    OSErrors (permissions, disk full, not a directory, ...) are the user's to fix: one line naming the
    path and a hint, like any DsparkError. Only what is left is an "internal error" to report.
    """

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except (DsparkError, OSError, MemoryError) as exc:  # the user's to fix: one line naming what, and a hint
            if debug_enabled():
                raise
            error = user_error(exc)
            assert error is not None
            report_error(error)
            raise typer.Exit(error.exit_code) from None
        except KeyboardInterrupt:
            if debug_enabled():
                raise
            stderr.print(Text("interrupted", style="yellow"))
            raise typer.Exit(130) from None
        except (typer.Exit, typer.Abort):
            raise
        except Exception as exc:  # noqa: BLE001 - the last line of defence: one line, not a traceback
            if debug_enabled():
                raise
            stderr.print(Text("internal error: ", style="bold red") + Text(_clean(f"{type(exc).__name__}: {exc}")))
            stderr.print(
                Text("hint: ", style="yellow") + Text("rerun with DSPARK_DEBUG=1 for the traceback and report it")
            )
            raise typer.Exit(1) from None

    return wrapper  # type: ignore[return-value]


def print_json(data: Any) -> None:
    """Machine-readable output: plain JSON on stdout, nothing else."""
    sys.stdout.write(json.dumps(data, indent=2) + "\n")


def print_table(title: str, columns: list[str], rows: list[list[Any]]) -> None:
    table = Table(title=title, title_justify="left")
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*(Text(str(cell)) for cell in row))
    stdout.print(table)


def say(message: str, style: str | None = None) -> None:
    stdout.print(Text(message, style=style or ""))


class progress_bar:  # noqa: N801 - used as a context manager like a function
    """A rich progress bar on a TTY (items/s and tokens/s); plain log lines otherwise.

    with progress_bar("datagen", unit="conversations") as update:
        update(done, total, tokens=n)
    """

    def __init__(self, description: str, unit: str) -> None:
        self.description, self.unit = description, unit
        self._progress = None
        self._task = None
        self._last_line = 0.0

    def __enter__(self):
        import time

        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self._start = time.perf_counter()
        if stdout.is_terminal:
            self._progress = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn(self.unit),
                TextColumn("{task.fields[rate]}"),
                TimeElapsedColumn(),
                console=stdout,
                transient=False,
            )
            self._progress.__enter__()
            self._task = self._progress.add_task(self.description, total=None, rate="")
        return self.update

    def update(self, done: int, total: int, tokens: int = 0) -> None:
        import time

        elapsed = max(time.perf_counter() - self._start, 1e-9)
        rate = f"{done / elapsed:.2f} {self.unit}/s, {tokens / elapsed:.0f} tokens/s"
        if self._progress is not None:
            self._progress.update(self._task, completed=done, total=total, rate=rate)
        elif time.perf_counter() - self._last_line > 5 or done == total:
            self._last_line = time.perf_counter()
            stdout.print(Text(f"{self.description}: {done}/{total} {self.unit} ({rate})"))

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.__exit__(*exc)
