"""How `dspark train` runs: here, in one process, or relaunched under torchrun with one child per rank.

    code = relaunch_under_torchrun(recipe, recipe_arg="tiny", overrides=[], resume="auto")
    if code is None:             # train here (a single process, or a torchrun child)
        run_train(recipe, resume="auto")

Import-light: nothing here imports torch, because a single process pins its OpenMP threads
(`host.bind_threads`) through variables libgomp reads only once, when torch loads.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable

from dspark_cli.recipe.schema import Recipe
from dspark_cli.training.host import bind_threads, under_torchrun


def is_main_process() -> bool:
    """True in a single process and on torchrun's rank 0: the one that prints."""
    return os.environ.get("RANK", "0") == "0"


def child_args(recipe_arg: str, overrides: list[str], *, nproc: int, resume: str, output_dir: str | None) -> list[str]:
    """The `dspark train ...` arguments each torchrun child runs with.

    Flags travel as key=value overrides or `--flag=value`: torchrun's parser would take `--nproc` as
    an abbreviation of its own `--nproc-per-node`.
    """
    args = ["train", recipe_arg, *overrides, f"train.nproc_per_node={nproc}", f"--resume={resume}"]
    return args + ([f"train.output_dir={output_dir}"] if output_dir else [])


def relaunch_under_torchrun(recipe: Recipe, *, recipe_arg: str, overrides: list[str], resume: str,
                            output_dir: str | None = None,
                            on_launch: Callable[[list[str]], None] | None = None) -> int | None:
    """Prepare this process for training, or train in torchrun's children instead.

    With `train.nproc_per_node` 1 this binds the process's threads to their cores and returns None
    (train here). With more processes and outside torchrun it runs `dspark train` under torchrun
    (after `on_launch(command)`) and returns its exit code; inside a torchrun child it returns None.
    """
    nproc = recipe.train.nproc_per_node
    if nproc == 1:  # one process on every core: keep its threads on their cores
        bind_threads()
        return None
    if under_torchrun():
        return None
    from dspark_cli.training.distributed import torchrun_command

    args = child_args(recipe_arg, overrides, nproc=nproc, resume=resume, output_dir=output_dir)
    cmd = torchrun_command(args, nproc=nproc, nnodes=recipe.train.nnodes, rdzv_endpoint=recipe.train.rdzv_endpoint,
                           run_id=recipe.name)
    if on_launch is not None:
        on_launch(cmd)
    return subprocess.run(cmd, check=False).returncode
