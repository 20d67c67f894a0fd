"""`dspark init TEMPLATE`: copy a template recipe to edit."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from dspark_cli.ui import handle_errors, say


@handle_errors
def init(
    template: Annotated[str, typer.Argument(help="Template to copy: `tiny`, `qwen3-8b`, `llama-3.1-8b`, `kimi-k3`.")] = "tiny",
    output: Annotated[Path, typer.Option("--output", "-o", help="Where to write the recipe.")] = Path("dspark.yaml"),
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing file.")] = False,
) -> None:
    """Copy a template recipe to edit (`dspark init qwen3-8b -o my.yaml`)."""
    from dspark_cli.recipe.loader import copy_template

    copy_template(template, output, force=force)
    say(f"wrote {output} (from template {template}); next: dspark validate {output}")
