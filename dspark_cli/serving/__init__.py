"""Serving: the `vllm serve` command for a target with its DSpark draft (`command.py`) and the server's
lifecycle (`launcher.py`). What the recipe a draft carries may decide is `dspark_cli.recipe.trust`.

    from dspark_cli.serving import serve_command, shell_line
    argv, env = serve_command(recipe, "runs/tiny/draft")

Other parts import only the names below (publish renders the serve command on its model card; the
preflight asks what `dspark serve` would refuse).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dspark_cli.lazy import lazy_exports

_EXPORTS = {
    "METHODS": "dspark_cli.serving.command",
    "MIN_VLLM": "dspark_cli.serving.launcher",
    "find_vllm": "dspark_cli.serving.launcher",
    "port_free": "dspark_cli.serving.launcher",
    "version_tuple": "dspark_cli.serving.launcher",
    "serve_command": "dspark_cli.serving.command",
    "serve_plan": "dspark_cli.serving.command",
    "shell_line": "dspark_cli.serving.command",
}

if TYPE_CHECKING:  # what editors and type checkers follow; at run time lazy_exports imports on first use
    from dspark_cli.serving.command import METHODS, serve_command, serve_plan, shell_line
    from dspark_cli.serving.launcher import MIN_VLLM, find_vllm, port_free, version_tuple

__all__ = sorted(_EXPORTS)

if not TYPE_CHECKING:  # hidden from type checkers, which would read any name missing above as Any
    __getattr__ = lazy_exports(__name__, _EXPORTS)
