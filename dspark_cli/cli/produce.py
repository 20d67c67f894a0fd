"""`dspark produce RECIPE`: the online capture producers of an inference machine (capture.mode=online)."""

from __future__ import annotations

from typing import Annotated

import typer

from dspark_cli.cli.common import OverridesArg, RecipeArg, load
from dspark_cli.ui import handle_errors, say


@handle_errors
def produce(
    recipe: RecipeArg,
    overrides: OverridesArg = None,
    only: Annotated[
        str | None,
        typer.Option("--only", help="This machine's producers, e.g. `0` or `2,3` (of capture.workers); default all."),
    ] = None,
    stream: Annotated[
        str | None, typer.Option("--stream", help="Sets capture.stream (a directory or mooncake://).")
    ] = None,
) -> None:
    """Capture hidden states into the online stream for trainers elsewhere (`dspark train ...
    capture.external_producers=true`); restarts a killed producer, stays until the trainers finish."""
    from dspark_cli.errors import UsageError

    loaded = load(recipe, overrides, {"capture.stream": stream})
    if loaded.capture.mode != "online":
        raise UsageError(
            "dspark produce feeds online training; the recipe has capture.mode=offline",
            "add capture.mode=online (and the same to the trainers' command)",
        )
    workers = None
    if only is not None:
        try:
            workers = [int(w) for w in only.split(",") if w.strip()]
        except ValueError:
            raise UsageError(f"--only {only}: not a list of producer numbers", "write e.g. --only 0,1") from None
    from dspark_cli.capture import supervise

    _claim_capture_dir(loaded.stage_dir("capture"))
    extra = list(overrides or []) + ([f"capture.stream={stream}"] if stream else [])
    try:
        summary = supervise(recipe, loaded, overrides=extra, only=workers)
    except KeyboardInterrupt:  # the producers stopped cleanly, recording nothing: the same command resumes
        from dspark_cli.errors import debug_enabled

        if debug_enabled():
            raise
        from rich.text import Text

        from dspark_cli.ui import stderr

        stderr.print(
            Text(
                "interrupted; run the same command again to resume (the producers go on where they stopped)",
                style="yellow",
            )
        )
        raise typer.Exit(130) from None
    say(
        f"produce: {summary.producers} producer(s) done in {summary.seconds} s, restarts "
        f"{summary.restarts or 'none'} -> {summary.stream}",
        style="green",
    )


def _claim_capture_dir(path: str) -> None:
    """The producers' logs go to `<capture dir>/logs/`: the directory is claimed as the capture stage claims
    it (its owner mark first), so a trainer sharing it on another machine reads it as dspark's, not a
    stranger's; one dspark did not make is refused."""
    from pathlib import Path

    from dspark_cli.artifacts.files import OWNER_NAME, manifest_kind, ownership_problem, write_json_atomic
    from dspark_cli.errors import UsageError

    kind, field, out = "dspark.capture", "capture.output_dir", Path(path)
    problem = ownership_problem(out, kind, field)
    if problem is not None:
        raise UsageError(problem.removeprefix(f"{field}: "), f"{field} names a directory dspark did not make")
    out.mkdir(parents=True, exist_ok=True)
    if manifest_kind(out, OWNER_NAME) != kind:
        write_json_atomic(out / OWNER_NAME, {"kind": kind})
