"""One torchrun rank of `dspark train`: what torchrun runs in each of its children.

    python -m torch.distributed.run --standalone --nproc-per-node=2 -m dspark_cli.training tiny --resume=auto
    python -m dspark_cli.training RECIPE [section.key=value ...] [--resume=auto|never|CHECKPOINT]

`dspark train --nproc N` and `dspark run` start this through torchrun (training/launch.py `train`) after
they ran the preflight and the capture stage in the launching process; a rank loads the recipe the
launcher resolved and trains its share (`run_train`). Rank 0 prints one line per logged step and the
summary, or with `--records` (what `train` passes) each step's record as JSON for the launcher to render,
and no summary (the launcher reads it from the manifest). Every rank reports a failure as `error: ...`
and `hint: ...` lines on stderr with the CLI's exit codes (1 runtime, 2 usage, 130 interrupted), and
`DSPARK_DEBUG=1` shows the traceback. It also records the failure in torchrun's error file for the rank
(machine/procs.py `record_failure`): torchrun's own failure summary then shows its message and traceback,
and `dspark train` reports the first failing rank's in one line. With `--records` the rank's stderr is the
run's log file (training/launch.py), so the traceback goes there too, and rank 0's warnings go to stdout,
which the launcher shows.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import traceback

from dspark_cli.errors import RecipeError, debug_enabled, user_error
from dspark_cli.machine.procs import record_failure


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m dspark_cli.training", description="One torchrun rank of `dspark train` (launched by it)."
    )
    parser.add_argument("recipe", help="recipe file or template name")
    parser.add_argument("overrides", nargs="*", help="section.key=value overrides")
    parser.add_argument("--resume", default="auto", help="auto, never, or a checkpoint path")
    parser.add_argument(
        "--records", action="store_true", help="rank 0 prints each logged step as JSON for its launcher, no summary"
    )
    return parser


def _show_warnings() -> None:
    """Rank 0's warnings on stdout, for the launcher to show (its stderr goes to the log), and in the log."""
    root = logging.getLogger()
    for stream in (sys.stdout, sys.stderr):
        handler = logging.StreamHandler(stream)
        handler.setLevel(logging.WARNING)
        root.addHandler(handler)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_intermixed_args(argv)
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # as the CLI: no per-file bars between log lines
    who = f"rank {os.environ.get('RANK', '0')}"
    if args.records and who == "rank 0":
        _show_warnings()
    try:
        from dspark_cli.recipe import load_recipe
        from dspark_cli.training.launch import RECORD, is_main_process
        from dspark_cli.training.metrics import format_line, format_summary
        from dspark_cli.training.run import run_train

        recipe = load_recipe(args.recipe, args.overrides)
        show = (lambda record: RECORD + json.dumps(record)) if args.records else format_line
        summary = run_train(recipe, resume=args.resume, on_log=lambda record: print(show(record), flush=True))
        if is_main_process() and not args.records:
            print(format_summary(summary), flush=True)
        return 0
    except KeyboardInterrupt as exc:
        record_failure(exc, who)
        if debug_enabled():
            raise
        if args.records:  # stderr is the run's log: where each rank stopped (torchrun's SIGTERM after a peer failed)
            traceback.print_exc(file=sys.stderr)
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - a rank's failure, as the CLI shows it: one line, not a traceback
        record_failure(exc, who)
        error = user_error(exc)
        if debug_enabled():
            raise
        if args.records:  # stderr is the run's log: the traceback belongs there
            traceback.print_exc(file=sys.stderr)
            if error is None:
                return 1
        if error is None:
            print(f"internal error: {type(exc).__name__}: {exc}", file=sys.stderr)
            print("hint: rerun with DSPARK_DEBUG=1 for the traceback and report it", file=sys.stderr)
            return 1
        for line in error.problems if isinstance(error, RecipeError) else [error.message]:
            print(f"error: {line}", file=sys.stderr)
        if error.hint:
            print(f"hint: {error.hint}", file=sys.stderr)
        return error.exit_code


if __name__ == "__main__":
    sys.exit(main())
