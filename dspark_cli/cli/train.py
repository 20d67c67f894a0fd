"""`dspark train RECIPE`: capture (here, when its output is not complete), then train the draft here or
under torchrun (or show the plan)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from dspark_cli.cli.common import DryRunOpt, OverridesArg, RecipeArg, load, preflight_stage
from dspark_cli.ui import handle_errors, print_table, say, stdout

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
    # steps); --nproc N > 1 starts torchrun, whose children (`-m dspark_cli.training`) train. An offline
    # capture that is not complete runs first, in this process, before any rank starts.
    loaded = load(recipe, overrides, {"train.output_dir": output_dir, "train.nproc_per_node": nproc})
    preflight_stage(loaded, ["capture", "train"], recipe, machine=not dry_run, resume=resume)
    if dry_run:
        from dspark_cli.training.run import plan_train

        _render_plan(plan_train(loaded))
        return
    from dspark_cli.training.launch import is_main_process, relaunch_under_torchrun

    code = relaunch_under_torchrun(
        loaded,
        recipe_arg=recipe,
        overrides=list(overrides or []),
        resume=resume,
        output_dir=output_dir,
        before=lambda: _capture_first(loaded),
        say=say,
        on_launch=lambda cmd: say(f"launching {loaded.train.nproc_per_node} processes: {' '.join(cmd[1:5])} ..."),
    )
    if code is not None:
        raise typer.Exit(code)
    from dspark_cli.training.run import run_train

    if is_main_process() and stdout.is_terminal:
        summary = _train_with_progress(loaded, resume)
    else:
        summary = run_train(loaded, resume=resume, on_log=lambda record: say(_log_line(record)))
    if is_main_process():
        from dspark_cli.training.metrics import format_summary

        say(format_summary(summary), style="green")


def _capture_first(loaded) -> None:
    """The capture stage, before training, when its output is not complete (resumes a killed one)."""
    from dspark_cli.capture import capture_pending, ensure_capture
    from dspark_cli.ui import progress_bar

    if capture_pending(loaded) is None:
        return
    with progress_bar("capture", unit="sequences") as update:
        summary = ensure_capture(loaded, on_progress=lambda done, total, tokens: update(done, total, tokens=tokens))
    if summary is not None:
        say(
            f"capture: {summary.sequences} sequences, {summary.tokens} tokens in {summary.shards} shards "
            f"-> {summary.output_dir}"
        )


def _log_line(record: dict[str, Any]) -> str:
    from dspark_cli.training.metrics import format_line

    return format_line(record)


def _train_with_progress(loaded, resume: str) -> TrainSummary:
    """run_train with one log line per logged step and a progress bar below them (a terminal only)."""
    from dspark_cli.training.run import run_train
    from dspark_cli.ui import progress_bar

    seen = {"tokens": 0}
    with progress_bar("train", unit="steps") as update:

        def show(record: dict[str, Any]) -> None:
            seen["tokens"] += record["tokens"]
            say(_log_line(record))
            update(record["step"], record["num_steps"], tokens=seen["tokens"])

        return run_train(loaded, resume=resume, on_log=show)


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
