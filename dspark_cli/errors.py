"""User-facing errors: one line saying what is wrong, one hint saying what to do next.

Library code raises these; the CLI renders them (see `cli.py`) and exits with
`exit_code`: 1 for runtime failures, 2 for usage mistakes (bad recipe, bad flag,
bad input file), 130 when interrupted. `DSPARK_DEBUG=1` shows the traceback.
"""

from __future__ import annotations


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


class NotBuiltError(UsageError):
    """A command or option that dspark does not implement yet. Never pretend."""


class ContractError(DsparkError):
    """Two artifacts disagree on the DSpark contract (layer ids, target, mask token, ...)."""


class DataError(DsparkError):
    """An input artifact is corrupt, truncated or inconsistent with its manifest."""
