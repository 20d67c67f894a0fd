"""`dspark init TEMPLATE`: copy a template recipe to edit (`--slurm`: and the online run's Slurm job script)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from dspark_cli.cli.common import OverridesArg
from dspark_cli.ui import handle_errors, say


@handle_errors
def init(
    template: Annotated[
        str, typer.Argument(help="Template to copy: `tiny`, `qwen3-8b`, `llama-3.1-8b`, `kimi-k3`.")
    ] = "tiny",
    overrides: OverridesArg = None,
    output: Annotated[Path, typer.Option("--output", "-o", help="Where to write the recipe.")] = Path("dspark.yaml"),
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing file.")] = False,
    slurm: Annotated[
        bool,
        typer.Option(
            "--slurm",
            help="Also write OUTPUT.sbatch: the whole online run on a Slurm allocation (producer nodes, "
            "then torchrun nodes); the overrides (capture.workers, train.nnodes, ...) set its shape.",
        ),
    ] = False,
    gpus_per_node: Annotated[int, typer.Option("--gpus-per-node", min=1, help="With --slurm: GPUs per node.")] = 8,
) -> None:
    """Copy a template recipe to edit (`dspark init qwen3-8b -o my.yaml`)."""
    from dspark_cli.errors import UsageError
    from dspark_cli.recipe.loader import copy_template

    if overrides and not slurm:
        raise UsageError(
            "overrides only shape the --slurm job script", "edit the copied recipe instead, or add --slurm"
        )
    if any(ord(c) < 32 or ord(c) == 127 for c in str(output)):  # a newline would split the job script's lines
        raise UsageError(
            f"-o {str(output)!r}: a file name with a control character (a newline, a tab, ...)",
            "choose a file name of printable characters",
        )
    script_path = output.with_suffix(".sbatch")
    script = None
    if slurm:
        from dspark_cli.cli.common import load
        from dspark_cli.training.slurm import slurm_script

        if script_path.exists() and not force:
            raise UsageError(f"{script_path} already exists", "pass --force to overwrite, or -o another path")
        shaped = ["capture.mode=online", *(overrides or [])]
        # the endpoint is the first training node's, known once the job runs: the script sets it
        loaded = load(template, [*shaped, "train.rdzv_endpoint=first-training-node:29400"])
        script = slurm_script(loaded, str(output), shaped, gpus_per_node=gpus_per_node)
    copy_template(template, output, force=force)
    if script is None:
        say(f"wrote {output} (from template {template}); next: dspark validate {output}")
        return
    tmp = script_path.with_name(f".{script_path.name}.tmp")
    tmp.write_text(script)
    tmp.chmod(0o755)
    tmp.replace(script_path)
    say(f"wrote {output} (from template {template}) and {script_path}; next: sbatch {script_path}")
