"""Package faces that import their modules on first use, so `dspark --help` stays free of torch.

    _EXPORTS = {"export_draft": "dspark_cli.export.writer"}
    if TYPE_CHECKING:                                  # the same names, for editors and type checkers
        from dspark_cli.export.writer import export_draft
    __all__ = sorted(_EXPORTS)
    if not TYPE_CHECKING:                              # in a package's __init__.py
        __getattr__ = lazy_exports(__name__, _EXPORTS)

tests/project/test_layout.py checks that `_EXPORTS` and the `TYPE_CHECKING` imports name the same things. The
`__getattr__` is hidden from type checkers: mypy reads a module-level `__getattr__` as "any other name exists"
(typed Any), so `from dspark_cli.export import typo` would pass the check.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_exports(package: str, exports: dict[str, str]) -> Callable[[str], Any]:
    """A module `__getattr__` serving `exports` (public name -> module holding it), imported when asked."""

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(exports[name]), name)

    return __getattr__
