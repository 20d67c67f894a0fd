"""The stages of a dspark run, in order, and `run_pipeline` which chains them.

    recipe -> datagen -> capture -> train -> export -> bench -> publish

Each stage is one library function taking the resolved recipe; the CLI commands call the same
functions. A stage that fails raises, and `run_pipeline` with it: every later stage needs its output.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dspark_cli.recipe import Recipe

if TYPE_CHECKING:
    from dspark_cli.artifacts.results import (
        BenchSummary,
        CaptureSummary,
        DatagenSummary,
        ExportSummary,
        PublishSummary,
        Record,
        TrainSummary,
    )


Update = Callable[..., None]  # update(done, total, tokens=0)
# progress(stage, unit) -> a context manager yielding `update`; the CLI passes ui.progress_bar.
ProgressFactory = Callable[[str, str], Any]
LogLine = Callable[[str], None]


@dataclass(frozen=True)
class Stage:
    name: str
    summary: str
    run: Callable[..., Record | None]  # run(recipe, progress=None, log_line=None): the stage's own result


@dataclass
class StageResult:
    name: str
    status: str  # "done": a stage that fails raises, and the run ends with it
    detail: str = ""
    outputs: Record | None = None  # the stage's result (None: online capture, which runs while training)


@contextmanager
def _quiet(_stage: str, _unit: str) -> Iterator[Update]:
    yield lambda *args, **kwargs: None


def run_datagen(
    recipe: Recipe, progress: ProgressFactory | None = None, log_line: LogLine | None = None
) -> DatagenSummary:
    from dspark_cli.datagen.run import run_datagen as regenerate

    with (progress or _quiet)("datagen", "conversations") as update:
        return regenerate(recipe, on_progress=lambda done, total, tokens: update(done, total, tokens=tokens))


def run_capture(
    recipe: Recipe, progress: ProgressFactory | None = None, log_line: LogLine | None = None
) -> CaptureSummary | None:
    if recipe.capture.mode == "online":
        return None  # captured while training, into the bounded stream
    from dspark_cli.capture import run_capture as capture

    with (progress or _quiet)("capture", "sequences") as update:
        return capture(recipe, on_progress=lambda done, total, tokens: update(done, total, tokens=tokens))


def run_train(recipe: Recipe, progress: ProgressFactory | None = None, log_line: LogLine | None = None) -> TrainSummary:
    """Train as `dspark train` does (`training.train`): an offline capture that is not complete first, in
    this process, then here in one process or under torchrun (`train.nproc_per_node x nnodes > 1`; gloo
    on CPU, NCCL on GPU); each logged step of rank 0 is one line to `log_line`."""
    from dspark_cli.training import train
    from dspark_cli.training.metrics import format_line

    on_log = (lambda record: log_line(format_line(record))) if log_line is not None else None
    return train(recipe, resume="auto", on_log=on_log, say=log_line, progress=progress)


def run_export(
    recipe: Recipe, progress: ProgressFactory | None = None, log_line: LogLine | None = None
) -> ExportSummary:
    from dspark_cli.artifacts.results import ExportPlan
    from dspark_cli.export.run import export_checkpoint

    # the recipe's export section decides dtype, format and embeddings, and the output directory
    summary = export_checkpoint(recipe.stage_dir("train"), recipe=recipe, force=True)
    assert not isinstance(summary, ExportPlan)  # not a dry run
    return summary


def run_bench(recipe: Recipe, progress: ProgressFactory | None = None, log_line: LogLine | None = None) -> BenchSummary:
    from dspark_cli.artifacts.profile import place_profile
    from dspark_cli.bench.run import run_bench as bench

    with (progress or _quiet)("bench", "turns") as update:
        summary = bench(
            recipe,
            draft_dir=recipe.stage_dir("export"),
            offline=True,
            endpoint=recipe.bench.endpoint,
            on_progress=update,
        )
    place_profile(recipe, recipe.stage_dir("export"))  # the draft directory ends with its acceptance profile
    return summary


def run_publish(
    recipe: Recipe, progress: ProgressFactory | None = None, log_line: LogLine | None = None
) -> PublishSummary:
    from dspark_cli.publish import publish_draft

    return publish_draft(recipe, recipe.stage_dir("export"))


STAGES: tuple[Stage, ...] = (
    Stage("datagen", "regenerate responses with the target", run_datagen),
    Stage("capture", "capture the target's hidden states", run_capture),
    Stage("train", "train the draft", run_train),
    Stage("export", "write a vLLM draft directory", run_export),
    Stage("bench", "measure acceptance length offline", run_bench),
    Stage("publish", "upload to the hubs", run_publish),
)


def run_pipeline(
    recipe: Recipe,
    *,
    stages: list[str] | None = None,
    on_stage: Callable[[StageResult], None] | None = None,
    progress: ProgressFactory | None = None,
    log_line: LogLine | None = None,
) -> list[StageResult]:
    """Run `stages` (default: all but publish) in order; a stage that fails raises, ending the run."""
    wanted = stages or [s.name for s in STAGES if s.name != "publish"]
    results: list[StageResult] = []
    for stage in STAGES:
        if stage.name not in wanted:
            continue
        result = StageResult(stage.name, "done", stage.summary, stage.run(recipe, progress=progress, log_line=log_line))
        results.append(result)
        if on_stage is not None:
            on_stage(result)
    return results
