"""`dspark train RECIPE`: capture (here, when its output is not complete), then train the draft here or
under torchrun (or show the plan)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.text import Text

from dspark_cli.cli.common import DryRunOpt, OverridesArg, RecipeArg, load, preflight_stage
from dspark_cli.ui import handle_errors, print_table, say, stderr, stdout

if TYPE_CHECKING:
    from dspark_cli.artifacts.results import TrainDryRun, TrainSummary


@handle_errors
def train(
    recipe: RecipeArg,
    overrides: OverridesArg = None,
    output_dir: Annotated[str | None, typer.Option("--output-dir", "-o", help="Sets train.output_dir.")] = None,
    resume: Annotated[
        str, typer.Option(help="`auto` (latest checkpoint if any), `never`, or a checkpoint path.")
    ] = "auto",
    nproc: Annotated[int | None, typer.Option(help="Sets train.nproc_per_node; >1 launches torchrun.")] = None,
    dry_run: DryRunOpt = False,
) -> None:
    """Capture hidden states and train the draft (FSDP2; torchrun when several processes)."""
    # --resume auto continues from the latest checkpoint (a crash costs at most train.checkpoint_every
    # steps); --nproc N > 1 starts torchrun, whose children (`-m dspark_cli.training`) train the recipe
    # validated here. An offline capture that is not complete runs first, in this process, before any
    # rank starts (`training.train` does all of it; this renders).
    loaded = load(recipe, overrides, {"train.output_dir": output_dir, "train.nproc_per_node": nproc})
    preflight_stage(loaded, ["capture", "train"], recipe, machine=not dry_run, resume=resume)
    if dry_run:
        from dspark_cli.training import plan_train

        _render_plan(plan_train(loaded))
        return
    from dspark_cli.training import is_main_process
    from dspark_cli.training.metrics import format_summary

    summary = _interruptible(lambda: _train(loaded, resume, bar=is_main_process() and stdout.is_terminal))
    if is_main_process():
        say(format_summary(summary), style="green")


INTERRUPTED = "interrupted; run the same command again to resume (--resume auto: from the last checkpoint)"


def _interruptible(run: Callable[[], TrainSummary]) -> TrainSummary:
    """`run()`, where Ctrl-C ends the command with exit 130 and the one line saying how to go on: the ranks
    and the stream's producers stopped cleanly (SIGTERM too, once training runs: training/launch.py), so the
    same command resumes."""
    from dspark_cli.errors import debug_enabled

    try:
        return run()
    except KeyboardInterrupt:
        if debug_enabled():
            raise
        stderr.print(Text(INTERRUPTED, style="yellow"))
        raise typer.Exit(130) from None


def _train(loaded, resume: str, *, bar: bool) -> TrainSummary:
    """`training.train` with one log line per logged step and, with `bar`, a progress bar below them from
    the start of training: at once, or when the capture's own bar closes if the capture runs first (one
    live display at a time)."""
    from contextlib import ExitStack, contextmanager

    from dspark_cli.capture import capture_pending
    from dspark_cli.training import train as train_draft
    from dspark_cli.training.metrics import format_line
    from dspark_cli.ui import progress_bar

    with ExitStack() as stack:
        shown: dict[str, Any] = {"update": None, "tokens": 0}

        def start() -> None:
            if bar and shown["update"] is None:
                shown["update"] = stack.enter_context(progress_bar("train", unit="steps"))

        @contextmanager
        def capture_bar(stage: str, unit: str) -> Iterator[Callable[..., None]]:
            with progress_bar(stage, unit=unit) as update:
                yield update
            start()

        def show(record: dict[str, Any]) -> None:
            say(format_line(record))
            if shown["update"] is not None and record.get("kind") != "validation":
                shown["tokens"] += record["tokens"]
                shown["update"](record["step"], record["num_steps"], tokens=shown["tokens"])

        if capture_pending(loaded) is None:
            start()
        return train_draft(loaded, resume=resume, on_log=show, say=say, progress=capture_bar)


def _render_plan(plan: TrainDryRun) -> None:
    disk = f"{plan.capture_bytes / 2**30:.2f} GiB" if plan.capture_bytes else "unknown (run datagen first)"
    rows = [
        ["steps", plan.num_steps],
        ["tokens per step (all ranks)", plan.tokens_per_step],
        ["sequences per epoch", plan.num_sequences],
        ["tokens per epoch", plan.num_tokens],
        ["sequences per step", round(plan.sequences_per_step or 0, 2) or "-"],
        ["processes", plan.world_size],
        ["anchors per sequence", plan.num_anchors],
        ["block size", plan.block_size],
        [f"capture cache ({plan.capture_mode}) disk", disk],
        ["output", plan.output_dir],
    ]
    print_table(f"train plan ({'exact' if plan.exact else 'estimated'}; nothing written)", ["", "value"], rows)
