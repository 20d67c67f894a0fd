"""Package faces that import their modules on first use, so `dspark --help` stays free of torch.

    _EXPORTS = {"export_draft": "dspark_cli.export.writer"}
    if TYPE_CHECKING:                                  # the same names, for editors and type checkers
        from dspark_cli.export.writer import export_draft
    __all__ = sorted(_EXPORTS)
    __getattr__ = lazy_exports(__name__, _EXPORTS)     # in a package's __init__.py

tests/project/test_layout.py checks that `_EXPORTS` and the `TYPE_CHECKING` imports name the same things.
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
