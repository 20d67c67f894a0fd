"""Capture orchestration: plan -> capturer -> shards into a sink (offline directory or online stream), resumably.

    from dspark_cli.capture import run_capture
    run_capture(load_recipe("tiny"))          # runs/tiny/hidden/shard-*.safetensors + manifest.json

Offline (`sinks.DirectorySink`): shards are written in plan order; after each one the manifest
(complete: false) lists it with its checksum, so a killed run re-started with the same recipe skips
exactly the listed shards and rewrites any other (a shard renamed into place just before the kill is
simply written again): no shard is missing or duplicated. `capture.workers > 1` spreads the shards
over worker processes (capture/workers.py), with the same files. A directory made by another plan
(datagen output, layer ids, target, shard size, ...) is refused. Online (`sinks.StreamSink`): the same
shards go to a stream producer instead (capture/stream.py).

The datagen validation split (`plan.validation_plan`) is captured after the training shards, with the
same engine, into `<capture dir>/validation/`: the same shard files and manifest, resumable the same
way, read by `iter_captured(<capture dir>/validation, expect=contract)`; never into the training shards.
Online, producer 0 publishes it into the stream (capture/validation_stream.py).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dspark_cli.artifacts.files import MANIFEST_NAME
from dspark_cli.artifacts.results import CaptureSummary
from dspark_cli.capture.capturer import capture_shard, make_capturer
from dspark_cli.capture.plan import (
    VALIDATION_DIR,
    CapturePlan,
    build_plan,
    goal_bytes_per_token,
    validation_plan,
    workers_beyond_shards,
)
from dspark_cli.capture.shards import shard_name
from dspark_cli.capture.sinks import DirectorySink, StreamSink, write_manifest
from dspark_cli.recipe import Recipe

log = logging.getLogger(__name__)
Progress = Callable[[int, int, int], None]  # (sequences done, total, tokens captured so far)


def run_capture(
    recipe: Recipe, *, on_progress: Progress | None = None, queue: Any = None, capturer: Any = None
) -> CaptureSummary:
    """Capture every planned shard not done yet, offline (stage dir) or into `queue` (an online stream
    producer, `capture.stream.StreamProducer`: open / put / fail / finish)."""
    plan = build_plan(recipe)  # every refusal of the recipe first, before the directory is made
    if queue is not None:
        return _run_capture(plan, StreamSink(plan, queue), on_progress, capturer)
    from dspark_cli.artifacts.files import exclusive_output

    held_out = validation_plan(recipe)
    out_dir = Path(recipe.stage_dir("capture"))
    with exclusive_output(out_dir, "capture.output_dir", kind="dspark.capture"):  # one writer
        made: list[Any] = []  # an engine made for the training shards, kept for the validation ones
        try:
            summary = _run_capture(plan, DirectorySink(plan, out_dir), on_progress, capturer, made)
            if held_out is None:
                return summary
            engine = capturer if capturer is not None else next(iter(made), None)
            _run_capture(held_out, DirectorySink(held_out, out_dir / VALIDATION_DIR), None, engine, made)
            return dataclasses.replace(summary, validation_sequences=held_out.num_sequences)
        finally:
            for engine in made:
                if hasattr(engine, "close"):
                    engine.close()  # a vLLM engine's devices are the trainers' next


def _run_capture(
    plan: CapturePlan,
    sink: DirectorySink | StreamSink,
    on_progress: Progress | None,
    capturer: Any,
    made: list[Any] | None = None,
) -> CaptureSummary:
    """Capture `plan`'s pending shards into `sink`. An engine made here is closed at the end, or appended
    to `made` (the caller reuses it, then closes it)."""
    recipe = plan.recipe
    done = sink.open()
    pending = [s for s in plan.shards if shard_name(s.index) not in done]
    workers = recipe.capture.workers if plan.split == "train" else 1  # the split: here, in one process
    if isinstance(sink, DirectorySink) and capturer is None and workers > 1 and pending:
        if (beyond := workers_beyond_shards(recipe.capture.workers, plan)) is not None:
            log.warning("%s; starting %d", beyond.split("; ")[0], plan.num_workers)
        if plan.num_workers > 1:
            return _capture_with_workers(plan, sink.out_dir, done, on_progress)
    make = pending and capturer is None
    if make:
        capturer = make_capturer(plan, Path(recipe.stage_dir("capture")))
        if made is not None:
            made.append(capturer)
    try:
        return _capture_pending(plan, sink, done, on_progress, capturer)
    finally:
        if make and made is None and hasattr(capturer, "close"):
            capturer.close()  # a vLLM engine's devices are the trainers' next


def _capture_pending(
    plan: CapturePlan,
    sink: DirectorySink | StreamSink,
    done: dict[str, Any],
    on_progress: Progress | None,
    capturer: Any,
) -> CaptureSummary:
    recipe = plan.recipe
    backend = (
        capturer.describe() if capturer is not None else {"backend": recipe.capture.backend_here(), "resumed": True}
    )
    sink.start(backend, done)
    started, captured, seq_done = time.perf_counter(), 0, 0
    try:
        for index, group in itertools.groupby(plan.samples(), key=lambda item: item[0]):
            samples = [item[1:] for item in group]
            if shard_name(index) not in done:
                sequences = capture_shard(capturer, recipe.capture.batch_size, samples)
                sink.put(index, sequences)
                captured += sum(s.num_tokens for s in sequences)
            seq_done += len(samples)
            if on_progress is not None and shard_name(index) not in done:
                on_progress(seq_done, plan.num_sequences, captured)
    except KeyboardInterrupt:  # Ctrl-C / SIGTERM: stopped, not failed (a stream producer's next run goes on)
        raise
    except BaseException as exc:
        sink.fail(str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__)
        raise
    elapsed = time.perf_counter() - started
    busy = elapsed - sink.wait_s
    summary = _summary(
        plan,
        sink.location,
        sink.mode,
        backend,
        captured,
        elapsed,
        round(captured / busy, 1) if captured and busy > 0 else None,
    )
    summary = dataclasses.replace(summary, **sink.finish())
    log.info(
        "capture: %d sequences, %d tokens in %d shards -> %s",
        plan.num_sequences,
        plan.num_tokens,
        len(plan.shards),
        summary.output_dir,
    )
    return summary


def _summary(
    plan: CapturePlan,
    location: str,
    mode: str,
    backend: dict[str, Any],
    captured: int,
    elapsed: float,
    tokens_per_second: float | None,
) -> CaptureSummary:
    """What a capture run returns (the sink adds its own: bytes on disk, or the stream's peaks)."""
    return CaptureSummary(
        output_dir=location,
        mode=mode,
        backend=backend.get("backend"),
        sequences=plan.num_sequences,
        tokens=plan.num_tokens,
        loss_tokens=plan.num_loss_tokens,
        shards=len(plan.shards),
        captured_tokens=captured,
        seconds=round(elapsed, 2),
        tokens_per_second=tokens_per_second,
        goal_bytes_per_token=goal_bytes_per_token(len(plan.layer_ids), plan.geometry.hidden_size),
        truncated=plan.truncated,
        skipped_no_loss=plan.skipped_no_loss,
    )


def _capture_with_workers(
    plan: CapturePlan, out_dir: Path, done: dict[str, dict[str, Any]], on_progress: Progress | None
) -> CaptureSummary:
    """Offline capture by `capture.workers` processes (capture/workers.py); the same summary."""
    from dspark_cli.capture.workers import capture_with_workers

    def write(backend: dict[str, Any], entries: dict[str, dict[str, Any]], complete: bool) -> None:
        write_manifest(out_dir, plan, backend, entries, complete)

    started = time.perf_counter()
    backend = capture_with_workers(plan.recipe, plan, out_dir, done, on_progress, write)
    elapsed = time.perf_counter() - started
    from dspark_cli.artifacts.files import read_manifest

    manifest = read_manifest(out_dir)
    captured = sum(s.tokens for s in plan.shards if shard_name(s.index) not in done)
    log.info(
        "capture: %d sequences, %d tokens in %d shards by %d workers -> %s",
        plan.num_sequences,
        plan.num_tokens,
        len(plan.shards),
        plan.num_workers,
        out_dir,
    )
    summary = _summary(
        plan, str(out_dir), "offline", backend, captured, elapsed, round(captured / elapsed, 1) if elapsed else None
    )
    return dataclasses.replace(
        summary,
        workers=plan.num_workers,
        bytes=manifest["bytes"],
        bytes_per_token=manifest["bytes_per_token"],
    )


def capture_pending(recipe: Recipe) -> str | None:
    """Why offline training cannot start on the capture output yet (None: it is complete and whole).

    Incomplete (or never made), or a listed shard file is missing: the capture stage resumes and
    writes just what is not there. No torch: `dspark train` asks before it loads anything."""
    from dspark_cli.artifacts.capture import damaged_shards
    from dspark_cli.artifacts.datagen import datagen_manifest, validation_ids
    from dspark_cli.artifacts.files import read_manifest

    if recipe.capture.mode != "offline":
        return None
    directory = Path(recipe.stage_dir("capture"))
    if not (directory / MANIFEST_NAME).is_file():
        return "not made yet"
    manifest = read_manifest(directory)
    if not manifest.get("complete"):
        return "not complete"
    missing = damaged_shards(directory, manifest)
    if missing:
        return f"missing {', '.join(missing)}"
    if not validation_ids(datagen_manifest(recipe) or {}):
        return None
    held_out = directory / VALIDATION_DIR
    if not (held_out / MANIFEST_NAME).is_file() or not read_manifest(held_out).get("complete"):
        return "without its validation split (validation/ not complete)"
    missing = damaged_shards(held_out, read_manifest(held_out))
    return f"missing validation/{', validation/'.join(missing)}" if missing else None


def ensure_capture(recipe: Recipe, *, on_progress: Progress | None = None) -> CaptureSummary | None:
    """The capture stage, when training would need it: run (resume) the offline capture if its output
    is pending; None when there is nothing to do (complete, or capture.mode online)."""
    reason = capture_pending(recipe)
    if reason is None:
        return None
    log.info("capture output %s is %s: capturing first", recipe.stage_dir("capture"), reason)
    return run_capture(recipe, on_progress=on_progress)
