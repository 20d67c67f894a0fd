"""Capture orchestration: plan -> backend -> shards (offline directory or online stream), resumably.

    from dspark_cli.capture import run_capture
    run_capture(load_recipe("tiny"))          # runs/tiny/hidden/shard-*.safetensors + manifest.json

Offline: shards are written in plan order; after each one the manifest (complete: false) lists it with
its checksum, so a killed run re-started with the same recipe skips exactly the listed shards and
rewrites any other (a shard renamed into place just before the kill is simply written again): no
shard is missing or duplicated. `capture.workers > 1` spreads the shards over worker processes
(capture/workers.py), with the same files. A directory made by another plan (datagen output, layer ids, target,
shard size, ...) is refused. Online: the same shards go to a stream producer instead (capture/stream.py).
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dspark_cli import __version__
from dspark_cli.capture.capturer import capture_shard, make_capturer
from dspark_cli.capture.plan import CapturePlan, build_plan, goal_bytes_per_token
from dspark_cli.artifacts.capture import KIND as MANIFEST_KIND
from dspark_cli.capture.shards import shard_name, write_shard
from dspark_cli.artifacts.files import MANIFEST_NAME, resumable_manifest, write_json_atomic
from dspark_cli.recipe import Recipe, write_resolved

log = logging.getLogger(__name__)
Progress = Callable[[int, int, int], None]  # (sequences done, total, tokens captured so far)


def layout_of(plan: CapturePlan) -> dict[str, Any]:
    return {"target_layer_ids": plan.layer_ids, "hidden_size": plan.geometry.hidden_size, "dtype": "bfloat16",
            "aux_hidden": "[tokens, len(target_layer_ids) * hidden_size], layers concatenated in target_layer_ids order",
            "last_hidden": "[loss tokens, hidden_size], post-final-norm, loss-masked rows only",
            "input_ids": "int32", "loss_mask": "bool", "seq_lens": "int32"}


def _manifest(plan: CapturePlan, backend: dict[str, Any], shards: list[dict[str, Any]], complete: bool) -> dict[str, Any]:
    recipe, geometry = plan.recipe, plan.geometry
    tokens = sum(s["tokens"] for s in shards)
    size = sum(s["bytes"] for s in shards)
    return {
        "kind": MANIFEST_KIND, "format_version": 1, "dspark": __version__, "complete": complete,
        "fingerprint": plan.fingerprint, "contract": plan.contract.to_dict(), "layout": layout_of(plan),
        "target": {"model": recipe.target.model, "path": geometry.location, "model_type": geometry.model_type,
                   "num_hidden_layers": geometry.num_hidden_layers, "hidden_size": geometry.hidden_size},
        "backend": {**backend, "requested": recipe.capture.backend},
        "datagen": {"dir": str(plan.datagen_dir), "fingerprint": plan.datagen.get("fingerprint")},
        "max_seq_len": recipe.capture.max_seq_len, "shard_tokens": recipe.capture.shard_tokens,
        "truncated": plan.truncated, "skipped_no_loss": plan.skipped_no_loss,
        "num_sequences": sum(s["sequences"] for s in shards), "num_tokens": tokens,
        "num_loss_tokens": sum(s["loss_tokens"] for s in shards), "bytes": size,
        "bytes_per_token": round(size / tokens, 2) if tokens else None, "shards": shards,
    }


def _previous_shards(out_dir: Path, plan: CapturePlan) -> dict[str, dict[str, Any]]:
    """Shards a previous run of the same plan finished (name -> entry); refuse another plan's output."""
    previous = resumable_manifest(out_dir, kind=MANIFEST_KIND, fingerprint=plan.fingerprint,
                                  shard_glob="shard-*.safetensors", section="capture",
                                  changed="datagen output, target, layer ids or shard size")
    done = {}
    for entry in previous.get("shards", []):
        file = out_dir / entry["file"]
        if file.is_file() and file.stat().st_size == entry["bytes"]:
            done[entry["file"]] = entry
    return done


def run_capture(recipe: Recipe, *, on_progress: Progress | None = None, queue: Any = None,
                capturer: Any = None) -> dict[str, Any]:
    """Capture every planned shard not done yet, offline (stage dir) or into `queue` (an online stream
    producer, `capture.stream.StreamProducer`: open / put / fail / finish)."""
    plan = build_plan(recipe)  # every refusal of the recipe first, before the directory is made
    if queue is not None:
        return _run_capture(recipe, plan, on_progress, queue, capturer)
    from dspark_cli.artifacts.files import exclusive_output

    with exclusive_output(recipe.stage_dir("capture"), "capture.output_dir", kind="dspark.capture"):  # one writer
        return _run_capture(recipe, plan, on_progress, queue, capturer)


def _run_capture(recipe: Recipe, plan: Any, on_progress: Progress | None, queue: Any, capturer: Any) -> dict[str, Any]:
    out_dir = Path(recipe.stage_dir("capture"))
    layout = layout_of(plan)
    if queue is None:
        done = _previous_shards(out_dir, plan)
        out_dir.mkdir(parents=True, exist_ok=True)
        for stale in out_dir.glob(".shard-*.tmp"):
            stale.unlink()
        write_resolved(recipe, out_dir)
    else:
        done = {shard_name(i): {} for i in queue.open(fingerprint=plan.fingerprint, contract=plan.contract,
                                                      layout=layout, num_shards=len(plan.shards))}
    pending = [s for s in plan.shards if shard_name(s.index) not in done]
    if queue is None and capturer is None and recipe.capture.workers > 1 and pending:
        return _capture_with_workers(plan, out_dir, done, on_progress)
    made = pending and capturer is None
    if made:
        capturer = make_capturer(plan, out_dir)
    try:
        return _capture_pending(recipe, plan, out_dir, done, on_progress, queue, capturer)
    finally:
        if made and hasattr(capturer, "close"):
            capturer.close()  # a vLLM engine's devices are the trainers' next


def _capture_pending(recipe: Recipe, plan: Any, out_dir: Path, done: dict[str, Any], on_progress: Progress | None,
                     queue: Any, capturer: Any) -> dict[str, Any]:
    backend = capturer.describe() if capturer is not None else {"backend": recipe.capture.backend_here(), "resumed": True}
    entries: dict[str, dict[str, Any]] = dict(done)
    if queue is not None and isinstance(getattr(queue, "status", None), dict):
        queue.status["backend"] = backend  # the producer's status names its engine (saved with its first shard)
    if queue is None:
        write_json_atomic(out_dir / MANIFEST_NAME, _manifest(plan, backend, _ordered(plan, entries), complete=False))
    started, captured, seq_done, wait_s = time.perf_counter(), 0, 0, 0.0
    try:
        for index, group in itertools.groupby(plan.samples(), key=lambda item: item[0]):
            name = shard_name(index)
            samples = [item[1:] for item in group]
            if name in done:
                seq_done += len(samples)
                continue
            sequences = capture_shard(capturer, recipe.capture.batch_size, samples)
            if queue is None:
                entries[name] = write_shard(out_dir / name, sequences, layer_ids=plan.layer_ids,
                                            hidden_size=plan.geometry.hidden_size)
                write_json_atomic(out_dir / MANIFEST_NAME, _manifest(plan, backend, _ordered(plan, entries), False))
            else:
                before = time.perf_counter()
                entries[name] = queue.put(index, sequences)
                wait_s += time.perf_counter() - before
            seq_done += len(samples)
            captured += sum(s.num_tokens for s in sequences)
            if on_progress is not None:
                on_progress(seq_done, plan.num_sequences, captured)
    except BaseException as exc:
        if queue is not None:
            queue.fail(str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__)
        raise
    elapsed = time.perf_counter() - started
    summary = {"output_dir": str(out_dir) if queue is None else str(queue.directory), "mode": "offline" if queue is None else "online",
               "backend": backend.get("backend"), "sequences": plan.num_sequences, "tokens": plan.num_tokens,
               "loss_tokens": plan.num_loss_tokens, "shards": len(plan.shards), "captured_tokens": captured,
               "seconds": round(elapsed, 2),
               "tokens_per_second": round(captured / (elapsed - wait_s), 1) if captured and elapsed > wait_s else None,
               "goal_bytes_per_token": goal_bytes_per_token(len(plan.layer_ids), plan.geometry.hidden_size),
               "truncated": plan.truncated, "skipped_no_loss": plan.skipped_no_loss}
    if queue is None:
        manifest = _manifest(plan, backend, _ordered(plan, entries), complete=True)
        write_json_atomic(out_dir / MANIFEST_NAME, manifest)
        summary.update({"bytes": manifest["bytes"], "bytes_per_token": manifest["bytes_per_token"]})
    else:
        queue.finish()
        summary.update({"peak_disk_bytes": queue.status["peak_bytes"], "peak_shards": queue.status["peak_shards"],
                        "producer_wait_seconds": round(wait_s, 2)})
    log.info("capture: %d sequences, %d tokens in %d shards -> %s", plan.num_sequences, plan.num_tokens,
             len(plan.shards), summary["output_dir"])
    return summary


def _capture_with_workers(plan: CapturePlan, out_dir: Path, done: dict[str, dict[str, Any]],
                          on_progress: Progress | None) -> dict[str, Any]:
    """Offline capture by `capture.workers` processes (capture/workers.py); the same summary."""
    from dspark_cli.capture.workers import capture_with_workers

    def write(backend: dict[str, Any], entries: dict[str, dict[str, Any]], complete: bool) -> None:
        write_json_atomic(out_dir / MANIFEST_NAME, _manifest(plan, backend, _ordered(plan, entries), complete))

    started = time.perf_counter()
    backend = capture_with_workers(plan.recipe, plan, out_dir, done, on_progress, write)
    elapsed = time.perf_counter() - started
    from dspark_cli.artifacts.files import read_manifest

    manifest = read_manifest(out_dir)
    captured = sum(s.tokens for s in plan.shards if shard_name(s.index) not in done)
    log.info("capture: %d sequences, %d tokens in %d shards by %d workers -> %s", plan.num_sequences,
             plan.num_tokens, len(plan.shards), plan.recipe.capture.workers, out_dir)
    return {"output_dir": str(out_dir), "mode": "offline", "backend": backend.get("backend"),
            "workers": plan.recipe.capture.workers, "sequences": plan.num_sequences, "tokens": plan.num_tokens,
            "loss_tokens": plan.num_loss_tokens, "shards": len(plan.shards), "captured_tokens": captured,
            "seconds": round(elapsed, 2), "tokens_per_second": round(captured / elapsed, 1) if elapsed else None,
            "goal_bytes_per_token": goal_bytes_per_token(len(plan.layer_ids), plan.geometry.hidden_size),
            "truncated": plan.truncated, "skipped_no_loss": plan.skipped_no_loss,
            "bytes": manifest["bytes"], "bytes_per_token": manifest["bytes_per_token"]}


def _ordered(plan: CapturePlan, entries: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    return [entries[shard_name(s.index)] for s in plan.shards if shard_name(s.index) in entries]


def capture_pending(recipe: Recipe) -> str | None:
    """Why offline training cannot start on the capture output yet (None: it is complete and whole).

    Incomplete (or never made), or a listed shard file is missing: the capture stage resumes and
    writes just what is not there. No torch: `dspark train` asks before it loads anything."""
    from dspark_cli.artifacts.files import read_manifest
    from dspark_cli.artifacts.capture import damaged_shards

    if recipe.capture.mode != "offline":
        return None
    directory = Path(recipe.stage_dir("capture"))
    if not (directory / MANIFEST_NAME).is_file():
        return "not made yet"
    manifest = read_manifest(directory)
    if not manifest.get("complete"):
        return "not complete"
    missing = damaged_shards(directory, manifest)
    return f"missing {', '.join(missing)}" if missing else None


def ensure_capture(recipe: Recipe, *, on_progress: Progress | None = None) -> dict[str, Any] | None:
    """The capture stage, when training would need it: run (resume) the offline capture if its output
    is pending; None when there is nothing to do (complete, or capture.mode online)."""
    reason = capture_pending(recipe)
    if reason is None:
        return None
    log.info("capture output %s is %s: capturing first", recipe.stage_dir("capture"), reason)
    return run_capture(recipe, on_progress=on_progress)
