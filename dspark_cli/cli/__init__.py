"""The `dspark` command line: one module per command, each parse -> one library call -> render.

    dspark init tiny                      # copy a template recipe to ./dspark.yaml
    dspark validate dspark.yaml train.lr=3e-4
    dspark run templates/recipes/tiny.yaml

`dspark --help`, `dspark CMD --help` and shell completion import only typer, rich, yaml and
pydantic; torch, transformers and vllm are imported by the library functions a command calls.
Every command accepts `section.key=value` overrides after its positional arguments;
precedence is defaults < recipe file < overrides < flags (`common.load`).
"""

from __future__ import annotations

from typing import Annotated

import typer

from dspark_cli import __version__
from dspark_cli.cli import bench, datagen, export, init, produce, publish, run, serve, train, validate
from dspark_cli.cli.common import load as _load
from dspark_cli.ui import say

__all__ = ["app", "entrypoint", "_load"]

app = typer.Typer(
    name="dspark",
    help="Train, export, serve, benchmark and publish DSpark speculative-decoding drafts for vLLM.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    rich_markup_mode="markdown",
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        say(f"dspark {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """Train, export, serve, benchmark and publish DSpark speculative-decoding drafts for vLLM.

    Set `DSPARK_DEBUG=1` to see tracebacks.
    """


# The order here is the order `dspark --help` and docs/cli.md list them in.
for _command in (
    init.init,
    validate.validate,
    datagen.datagen,
    train.train,
    produce.produce,
    export.export,
    serve.serve,
    bench.bench,
    publish.publish,
    run.run,
):
    app.command()(_command)


def entrypoint() -> None:
    """Console-script entry point (`dspark`)."""
    import os

    # transformers' per-file "Loading weights" bars would interleave with dspark's own progress lines.
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    app()
