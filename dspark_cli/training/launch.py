"""How training is started, the one launcher of `dspark train` and `dspark run`: here, in one process,
or under torchrun with one child per rank -- after the capture stage, which runs here, never in a rank.

    code = relaunch_under_torchrun(recipe, recipe_arg="tiny", overrides=[], resume="auto",
                                   before=lambda: ensure_capture(recipe))
    if code is None:             # train here (a single process, or a torchrun child)
        run_train(recipe, resume="auto")

Import-light: nothing here imports torch, because a single process pins its OpenMP threads
(`host.bind_threads`) through variables libgomp reads only once, when torch loads.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable

from dspark_cli.machine.cpu import bind_threads, under_torchrun
from dspark_cli.recipe.schema import Recipe


def is_main_process() -> bool:
    """True in a single process and on torchrun's rank 0: the one that prints."""
    return os.environ.get("RANK", "0") == "0"


def world_size(recipe: Recipe) -> int:
    return recipe.train.nproc_per_node * recipe.train.nnodes


def child_args(
    recipe_arg: str,
    overrides: list[str],
    *,
    nproc: int,
    resume: str,
    output_dir: str | None,
    devices: tuple[list[int], list[int]] | None = None,
) -> list[str]:
    """The arguments of each torchrun child (`python -m dspark_cli.training`, training/__main__.py);
    `devices` (the launcher's producer / trainer split) travels as `capture.devices=[..]` and `train.devices=[..]`.

    Flags travel as key=value overrides or `--flag=value`: torchrun's parser would take `--nproc` as
    an abbreviation of its own `--nproc-per-node`.
    """
    args = [recipe_arg, *overrides, f"train.nproc_per_node={nproc}", f"--resume={resume}"]
    if devices is not None:
        args += [
            f"capture.devices=[{','.join(map(str, devices[0]))}]",
            f"train.devices=[{','.join(map(str, devices[1]))}]",
        ]
    return args + ([f"train.output_dir={output_dir}"] if output_dir else [])


# torchrun (since torch 2.5) shares its rendezvous TCPStore with the ranks' init_process_group, with no
# per-restart prefix: a gang restarted by --max-restarts reads its dead predecessors' keys (gloo / NCCL
# addresses) and fails to connect or hangs (pytorch/pytorch#135712). The ranks get a store of their own.
UNSHARED_STORE = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


def torchrun_environ(base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment torchrun runs in: this one, with the ranks' store not shared (the user's own
    TORCH_DISABLE_SHARE_RDZV_TCP_STORE wins; training/distributed.py then keys the store per restart)."""
    return {**UNSHARED_STORE, **(dict(os.environ) if base is None else base)}


def resolve_device_split(recipe: Recipe, gpus: int | None = None) -> str | None:
    """Online training with local producers on a machine with GPUs and neither `capture.devices` nor
    `train.devices` set: put the default split (machine/devices.py `default_split`) on `recipe` in
    place, once, here in the launcher, so every rank and the producers rank 0 starts agree on it.
    `gpus` None counts this machine's (without starting CUDA). Returns the line to print, or None."""
    from dspark_cli.machine.devices import apply_default_split, visible_gpus

    if recipe.capture.mode != "online":
        return None
    line = apply_default_split(recipe, visible_gpus() if gpus is None else gpus)
    return (
        None
        if line is None
        else f"devices: {line} (the default split; set capture.devices and train.devices to choose)"
    )


def launch_command(
    recipe: Recipe,
    *,
    recipe_arg: str,
    overrides: list[str],
    resume: str,
    output_dir: str | None,
    devices: tuple[list[int], list[int]] | None = None,
) -> list[str]:
    """The torchrun command line that trains `recipe` in `nproc_per_node x nnodes` children."""
    from dspark_cli.training.distributed import torchrun_command

    nproc = recipe.train.nproc_per_node
    args = child_args(recipe_arg, overrides, nproc=nproc, resume=resume, output_dir=output_dir, devices=devices)
    return torchrun_command(
        args,
        nproc=nproc,
        nnodes=recipe.train.nnodes,
        rdzv_endpoint=recipe.train.rdzv_endpoint,
        run_id=recipe.name,
        max_restarts=recipe.train.max_restarts,
    )


def relaunch_under_torchrun(
    recipe: Recipe,
    *,
    recipe_arg: str,
    overrides: list[str],
    resume: str,
    output_dir: str | None = None,
    on_launch: Callable[[list[str]], None] | None = None,
    before: Callable[[], None] | None = None,
    on_line: Callable[[str], None] | None = None,
    say: Callable[[str], None] | None = None,
    gpus: int | None = None,
) -> int | None:
    """Prepare this process for training, or train in torchrun's children instead.

    `before()` (the capture stage) runs first in this process -- never in a torchrun child, whose
    peers would wait for it in a collective. With one process in all (`nproc_per_node x nnodes`)
    this binds the process's threads to their cores (before `before`, which may load torch) and
    returns None (train here). With more, outside torchrun, it runs the training module (`-m dspark_cli.training`) under torchrun
    (after `on_launch(command)`) and returns its exit code; `on_line` receives each line the
    children print (else they print to this process's stdout). Inside a torchrun child it returns None.

    With `train.nnodes > 1` (one launcher per machine, a shared output directory) only the launcher
    that takes the capture directory's lock runs `before`; the others wait for the capture to be
    complete (capture/gate.py).

    Online with local producers on GPUs and no device lists, the default producer / trainer split is
    resolved first (`resolve_device_split`, announced through `say`) and given to the ranks: set on
    `recipe` for one process, as overrides for torchrun's children (`gpus`: the machine's count, None
    to count it).
    """
    if under_torchrun():
        return None
    split = resolve_device_split(recipe, gpus)
    if split is not None:
        (say or print)(split)
    if world_size(recipe) == 1:  # one process on every core: keep its threads on their cores
        bind_threads()
        if before is not None:
            before()
        return None
    if before is not None and recipe.train.nnodes > 1 and recipe.capture.mode == "offline":
        from dspark_cli.capture import capture_once

        capture_once(recipe, before, say=say or print)  # one machine captures, the others wait for it
    elif before is not None:
        before()
    cmd = launch_command(
        recipe,
        recipe_arg=recipe_arg,
        overrides=overrides,
        resume=resume,
        output_dir=output_dir,
        devices=(recipe.capture.devices, recipe.train.devices) if split is not None else None,
    )
    if on_launch is not None:
        on_launch(cmd)
    env = torchrun_environ()
    from dspark_cli.machine.procs import dies_with_parent

    bind = dies_with_parent(signal.SIGTERM)  # a killed launcher: torchrun stops its ranks, not train on unwatched
    if on_line is None:
        return subprocess.run(cmd, check=False, env=env, preexec_fn=bind).returncode
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, bufsize=1, env=env, preexec_fn=bind) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            on_line(line.rstrip("\n"))
    return proc.returncode
