"""The one entry of training, for `dspark train` and `dspark run` alike: `train(recipe)` runs the offline
capture first when its output is not complete (here, never in a rank), then trains here in one process or
under torchrun with one child per rank, and returns the run's summary.

    from dspark_cli.training import train
    summary = train(recipe, resume="auto", on_log=lambda record: print(format_line(record)))

Under torchrun every rank loads the recipe this process validated, written resolved to a temporary file
(`recipe.yaml`: overrides, flags, a rehearsal's changes and the device split applied), never the user's
file again: that file may have changed since, and a gang torchrun restarts (`train.max_restarts`) would
read it again hours later. Rank 0 prints each logged step as one JSON line (`RECORD`), read back here
into `on_log`; the summary is then read from the train manifest.

Everything else the ranks write, and torchrun's own messages, go to the run's log,
`<train dir>/logs/train-<time>.log`, each rank's lines marked `[rankN]:` (the capture producers rank 0
starts write `logs/producer-<w>.log` beside it); rank 0's warnings are shown as well. A failed run is one line: the first failing rank's own error (each rank records
its failure in torchrun's error file, machine/procs.py `record_failure`), with a hint naming the log. One
process trains here, and an internal error there is the same line, its traceback in the same place.

Import-light: nothing here imports torch, because a single process pins its OpenMP threads
(`machine.cpu.bind_threads`) through variables libgomp reads only once, when torch loads.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dspark_cli.errors import DsparkError, UsageError, debug_enabled, user_error
from dspark_cli.machine.cpu import bind_threads, under_torchrun
from dspark_cli.recipe.schema import Recipe

if TYPE_CHECKING:
    from dspark_cli.artifacts.results import TrainSummary

log = logging.getLogger(__name__)

# rank 0's stdout under `train`: this prefix, then one logged step's record as JSON (training/__main__.py)
RECORD = "dspark-train-record "

OnLog = Callable[[dict[str, Any]], None]  # on_log(record): one logged step (training/metrics.py `format_line`)
Say = Callable[[str], None]  # say(line): one line for the user
# progress(stage, unit) -> a context manager yielding `update(done, total, tokens=0)` (the CLI: ui.progress_bar)
ProgressFactory = Callable[[str, str], AbstractContextManager[Callable[..., None]]]


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
    """The arguments of each torchrun child (`python -m dspark_cli.training`, training/__main__.py): rank 0
    prints its records for `train` to read (`--records`); `devices` (the launcher's producer / trainer
    split) travels as `capture.devices=[..]` and `train.devices=[..]`.

    Flags travel as key=value overrides, `--flag=value` or a flag no torchrun option begins with:
    torchrun's parser would take `--nproc` as an abbreviation of its own `--nproc-per-node`.
    """
    args = [recipe_arg, *overrides, f"train.nproc_per_node={nproc}", f"--resume={resume}", "--records"]
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


# torchrun marks each rank's lines it copies into the log (`--tee`) with this (string.Template: rank, local_rank)
LOG_LINE_PREFIX = {"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "[rank${rank}]: "}


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
    log_dir: str | None = None,
) -> list[str]:
    """The torchrun command line that trains `recipe` in `nproc_per_node x nnodes` children (`log_dir`:
    where torchrun keeps each rank's error file and stderr; see `torchrun_command`)."""
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
        log_dir=log_dir,
    )


TRAIN_KIND = "dspark.train"


def run_log(recipe: Recipe) -> Path:
    """A new log file for this launch, `<train dir>/logs/train-<time>.log` (`-<host>-<pid>` added with
    train.nnodes > 1: one launcher per machine, one shared directory). The train directory is claimed as
    rank 0 claims it (its owner mark first; a directory dspark did not make is a UsageError) but not
    locked: rank 0 takes the lock, and on several machines it may already hold it."""
    from dspark_cli.artifacts.files import OWNER_NAME, manifest_kind, ownership_problem, write_json_atomic

    field = "train.output_dir"
    out = Path(recipe.stage_dir("train"))
    problem = ownership_problem(out, TRAIN_KIND, field)
    if problem is not None:
        raise UsageError(problem.removeprefix(f"{field}: "), f"{field} names a directory dspark did not make")
    out.mkdir(parents=True, exist_ok=True)
    if manifest_kind(out, OWNER_NAME) != TRAIN_KIND:
        write_json_atomic(out / OWNER_NAME, {"kind": TRAIN_KIND})
    (out / "logs").mkdir(exist_ok=True)
    host = f"-{socket.gethostname()}-{os.getpid()}" if recipe.train.nnodes > 1 else ""
    return out / "logs" / f"train-{time.strftime('%Y%m%d-%H%M%S')}{host}.log"


def rank_failure(log_dir: str | os.PathLike[str], code: int, log: Path) -> DsparkError:
    """Why torchrun failed (exit `code`): the first failure the ranks of its last attempt recorded in their
    error files under `log_dir` (torchrun's `--log-dir`), as one line with `log` (the run's log) in its
    hint; when none did (a rank killed outright, or torchrun itself failed), what is known."""
    from dspark_cli.machine.procs import first_failure

    attempts = sorted(Path(log_dir).glob("*/attempt_*"), key=lambda p: int(p.name.removeprefix("attempt_")))
    failure = first_failure(attempts[-1].glob("*/error.json")) if attempts else None
    if failure is not None:
        return failure.error(log)
    return DsparkError(
        f"training under torchrun failed (exit code {code}) and no rank recorded why",
        f"a rank may have been killed (out of memory?) or torchrun itself failed: the full log is {log}",
    )


def train(
    recipe: Recipe,
    *,
    resume: str = "auto",
    on_log: OnLog | None = None,
    say: Say | None = None,
    progress: ProgressFactory | None = None,
) -> TrainSummary:
    """Train the draft `recipe` describes, capturing first when needed; the summary (on every rank).

    `resume`: `auto` (the latest checkpoint, if any), `never`, or a checkpoint path. `on_log(record)`
    gets each logged step on rank 0, from this process or from torchrun's rank 0. `say(line)` gets the
    lines for the user: the device split, the capture's result, torchrun's start and whatever else the
    ranks print (default: logged). `progress(stage, unit)` wraps the capture (default: nothing shown).

    One process in all (`train.nproc_per_node x train.nnodes`): its threads are bound to their cores
    (before the capture, which may load torch) and it trains here. More: torchrun runs the ranks
    (training/__main__.py) and a non-zero exit is a DsparkError; with `train.nnodes > 1` (one launcher
    per machine, a shared output directory) the launcher that takes the capture directory's lock
    captures and the others wait for it (capture/gate.py). Inside a torchrun child (a user's own
    torchrun) this trains its share at once: the launcher captured. Online with local producers on
    GPUs and no device lists, the default producer / trainer split is resolved first, once, here.
    """
    say = say or _log
    if under_torchrun():
        return _train_here(recipe, resume, on_log)
    split = resolve_device_split(recipe)
    if split is not None:
        say(split)
    if world_size(recipe) == 1:  # one process on every core: keep its threads on their cores
        bind_threads()
        _capture_first(recipe, say, progress)
        return _train_alone(recipe, resume, on_log)
    if recipe.train.nnodes > 1 and recipe.capture.mode == "offline":
        from dspark_cli.capture import capture_once

        capture_once(recipe, lambda: _capture_first(recipe, say, progress), say=say)  # one machine captures
    else:
        _capture_first(recipe, say, progress)
    devices = (recipe.capture.devices, recipe.train.devices) if split is not None else None
    with tempfile.TemporaryDirectory(prefix="dspark-launch-") as tmp:
        from dspark_cli.recipe import write_resolved

        recipe_file = write_resolved(recipe, tmp, keep_secrets=True)  # what every rank loads while torchrun runs
        log_file, log_dir = run_log(recipe), os.path.join(tmp, "torchrun")
        cmd = launch_command(
            recipe,
            recipe_arg=str(recipe_file),
            overrides=[],
            resume=resume,
            output_dir=None,
            devices=devices,
            log_dir=log_dir,
        )
        say(
            f"launching {recipe.train.nproc_per_node} x {recipe.train.nnodes} processes: {' '.join(cmd[1:5])} ... "
            f"(log: {log_file})"
        )
        code, interrupted = _run_torchrun(cmd, on_log, say, log_file)
        if interrupted:  # the ranks stopped cleanly: what they recorded is no failure
            raise KeyboardInterrupt
        if code != 0:
            raise rank_failure(log_dir, code, log_file)
    if log_file.stat().st_size == 0:  # nothing said: no empty file per launch
        log_file.unlink()
    from dspark_cli.artifacts.results import TrainSummary
    from dspark_cli.artifacts.train import read_train_manifest

    return TrainSummary.from_dict(read_train_manifest(Path(recipe.stage_dir("train")))["summary"])


def _log(line: str) -> None:
    log.info("%s", line)


def _train_here(recipe: Recipe, resume: str, on_log: OnLog | None) -> TrainSummary:
    from dspark_cli.training.run import run_train

    return run_train(recipe, resume=resume, on_log=on_log)


def _train_alone(recipe: Recipe, resume: str, on_log: OnLog | None) -> TrainSummary:
    """Train in this one process. An internal error (not the user's to fix) is the line a failed rank
    gives (`training failed: TYPE: MESSAGE`), its traceback written to a run log in the train directory;
    a user error goes up as it is, and `DSPARK_DEBUG=1` shows the traceback here instead."""
    try:
        return _train_here(recipe, resume, on_log)
    except Exception as exc:
        if debug_enabled() or user_error(exc) is not None:
            raise
        import traceback

        from dspark_cli.machine.procs import ChildFailure

        log_file = None
        with contextlib.suppress(OSError, DsparkError):  # nowhere to keep it: the hint says DSPARK_DEBUG=1
            path = run_log(recipe)
            with open(path, "a", encoding="utf-8") as out:
                out.write("".join(traceback.format_exception(exc)))
            log_file = path
        raise ChildFailure.of(exc, "training").error(log_file) from exc


def _capture_first(recipe: Recipe, say: Say, progress: ProgressFactory | None) -> None:
    """The capture stage, when its output is not complete (resumes a killed one); nothing otherwise."""
    from dspark_cli.capture import capture_pending, ensure_capture

    if capture_pending(recipe) is None:
        return
    with (progress or _no_progress)("capture", "sequences") as update:
        summary = ensure_capture(recipe, on_progress=lambda done, total, tokens: update(done, total, tokens=tokens))
    if summary is not None:
        say(
            f"capture: {summary.sequences} sequences, {summary.tokens} tokens in {summary.shards} shards "
            f"-> {summary.output_dir}"
        )


def _no_progress(_stage: str, _unit: str) -> AbstractContextManager[Callable[..., None]]:
    return nullcontext(lambda *args, **kwargs: None)


def _run_torchrun(cmd: list[str], on_log: OnLog | None, say: Say, log_file: Path) -> tuple[int, bool]:
    """Run `cmd` (torchrun) to its end: rank 0's records to `on_log`, every other line on stdout to `say`,
    torchrun's stderr (its own messages and the ranks' stderr it copies) to `log_file`. Returns its exit
    code and whether this process was interrupted meanwhile.
    If this process fails meanwhile (its own output closed), the pipe closes with it: rank 0's next line
    fails there, and torchrun stops the gang. Ctrl-C or SIGTERM here is passed on to torchrun, once
    (it runs in a process group of its own, so a terminal's Ctrl-C reaches it only this way), which stops
    its ranks as it stops them on its own SIGINT; this process waits for that, so nothing of the run is
    left when `dspark train` exits."""
    from dspark_cli.machine.procs import dies_with_parent, forwarding_interrupts

    bind = dies_with_parent(signal.SIGTERM)  # a killed launcher: torchrun stops its ranks, not train on unwatched
    env = {**LOG_LINE_PREFIX, **torchrun_environ()}
    asked: list[int] = []
    with (
        open(log_file, "a", encoding="utf-8") as log_out,
        subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=log_out,
            text=True,
            errors="replace",
            bufsize=1,
            env=env,
            preexec_fn=bind,
            process_group=0,
        ) as proc,
    ):
        assert proc.stdout is not None
        with forwarding_interrupts(proc, asked):
            for line in proc.stdout:
                line = line.rstrip("\n")
                if not line.startswith(RECORD):
                    say(line)
                elif on_log is not None:
                    on_log(json.loads(line.removeprefix(RECORD)))
            proc.wait()
    return proc.returncode, bool(asked)
