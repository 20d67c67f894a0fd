"""User-facing errors: one line saying what is wrong, one hint saying what to do next.

Library code raises these; the CLI renders them (`ui.handle_errors`) and exits with
`exit_code`: 1 for runtime failures, 2 for usage mistakes (bad recipe, bad flag,
bad input file), 130 when interrupted. `DSPARK_DEBUG=1` shows the traceback.
"""

from __future__ import annotations

import os


class DsparkError(Exception):
    """A failure the user can act on. `message` is one line; `hint` names the next step."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message} ({self.hint})"


class UsageError(DsparkError):
    """The user asked for something invalid: a flag, a path, an input file."""

    exit_code = 2


class RecipeError(UsageError):
    """A recipe field is unknown, mistyped or out of range. `problems` lists all of them."""

    def __init__(self, problems: list[str], hint: str | None = None) -> None:
        self.problems = list(problems)
        first = self.problems[0] if self.problems else "invalid recipe"
        more = f" (+{len(self.problems) - 1} more)" if len(self.problems) > 1 else ""
        super().__init__(first + more, hint)


class ContractError(DsparkError):
    """Two artifacts disagree on the DSpark contract (layer ids, target, mask token, ...)."""


class DataError(DsparkError):
    """An input artifact is corrupt, truncated or inconsistent with its manifest."""


# --- operating-system errors, as users meet them ------------------------------------------------------

_ROOM = "free some space, or set output_dir (or -o) to a disk with room, and run again"
_RIGHTS = "check the permissions of that path and its directory, or choose another output_dir (-o)"
_OS_ERRORS = {
    # errno name: (message, hint, a usage mistake (exit 2)?)
    "ENOSPC": ("no space left on device", _ROOM, False),
    "EDQUOT": ("disk quota exceeded", _ROOM, False),
    "EACCES": ("permission denied", _RIGHTS, True),
    "EPERM": ("operation not permitted", _RIGHTS, True),
    "EROFS": ("read-only file system", "write somewhere writable: set output_dir (or -o) to another directory", True),
    "ENOTDIR": ("not a directory", "a file stands where a directory is needed: move it, or choose another path", True),
    "EISDIR": ("is a directory", "pass a file path here, not a directory", True),
    "EEXIST": ("already exists", "something is already at that path: move it, or choose another path", True),
    "ENOENT": ("no such file or directory", "check the path", True),
    "ENAMETOOLONG": ("file name too long", "choose a shorter path", True),
    "EMFILE": ("too many open files", "raise the limit (`ulimit -n`) and run again", False),
}


def os_error(exc: OSError) -> DsparkError:
    """An OSError (permissions, disk full, a file where a directory should be, ...) as one line + hint.

    The path named is the one the operation failed on: for two-path calls (rename, copy, link) the
    destination, which is where a write fails.
    """
    import errno as errno_module

    name = errno_module.errorcode.get(exc.errno or -1, "")
    path = exc.filename2 if exc.filename2 is not None else exc.filename
    where = f": {os.fsdecode(path)}" if path is not None else ""
    if name in _OS_ERRORS:
        message, hint, usage = _OS_ERRORS[name]
        return (UsageError if usage else DsparkError)(message + where, hint)
    text = (exc.strerror or str(exc)).strip().splitlines()
    first = text[0] if text else type(exc).__name__
    return DsparkError(
        f"{first}{where}" if path is not None and str(path) not in first else first,
        "check the path, the network or the device, and run again",
    )


def debug_enabled() -> bool:
    """`DSPARK_DEBUG=1`: show tracebacks instead of one-line errors."""
    return os.environ.get("DSPARK_DEBUG", "") not in ("", "0", "false", "False")


_OUT_OF_MEMORY_HINT = (
    "a file may claim an impossible size, or this needs a machine with more memory; DSPARK_DEBUG=1 shows where"
)


def user_error(exc: BaseException) -> DsparkError | None:
    """What `exc` means to the user as one line and a hint: a DsparkError as it is, an OSError (permissions,
    disk full, not a directory, ...) through `os_error`, running out of memory; None for anything else,
    an internal error to report. The CLI (`ui.handle_errors`) and a torchrun rank (`training/__main__.py`)
    render these the same way."""
    if isinstance(exc, DsparkError):
        return exc
    if isinstance(exc, OSError):
        return os_error(exc)
    if isinstance(exc, MemoryError):
        return DsparkError("out of memory", _OUT_OF_MEMORY_HINT)
    return None
