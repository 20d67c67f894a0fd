"""Offline capture spread over `capture.workers` processes, each with its own engine (and, on GPUs, its own devices).

    run_capture(load_recipe("tiny", ["capture.workers=2"]))        # starts the workers, merges the manifest
    python -m dspark_cli.capture.workers RECIPE_YAML WORKER WORKERS  # one worker (what run_capture starts)

Worker w captures the planned shards `CapturePlan.worker_shards(w, W)` (shard i belongs to worker i % W)
that are not done yet. After each shard it lists the shard (name, size, checksum) in its own
`.worker-W.json`, so a killed worker's finished shards are kept: the next run folds every worker file
into the manifest before it starts the workers again. The launching process writes the merged
manifest at the end. Shard files and the capture fingerprint are those of a single-process capture:
the plan, each shard's samples and their batching do not depend on who captures them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from dspark_cli.artifacts.files import MANIFEST_NAME, write_json_atomic
from dspark_cli.capture.plan import CapturePlan, build_plan
from dspark_cli.capture.shards import shard_name
from dspark_cli.errors import DsparkError, UsageError
from dspark_cli.recipe import Recipe, load_recipe, write_resolved
from dspark_cli.recipe.bounded import read_json

WORKER_GLOB = ".worker-*.json"


def worker_file(out_dir: Path, worker: int) -> Path:
    return out_dir / f".worker-{worker}.json"


def worker_entries(out_dir: Path, plan: CapturePlan) -> dict[str, dict[str, Any]]:
    """Shards the workers of this plan listed (name -> entry) whose files are whole (size as listed)."""
    found: dict[str, dict[str, Any]] = {}
    for path in sorted(out_dir.glob(WORKER_GLOB)):
        try:
            data = read_json(path)
        except (OSError, ValueError):  # written atomically: unreadable means not ours; ignore it
            continue
        if data.get("fingerprint") != plan.fingerprint:
            continue
        for entry in data.get("shards", []):
            file = out_dir / entry["file"]
            if file.is_file() and file.stat().st_size == entry["bytes"]:
                found[entry["file"]] = entry
    return found


def worker_environ(recipe: Recipe, worker: int, workers: int) -> dict[str, str]:
    """The worker's environment, as an online producer's (`devices.producer_environ`: its share of
    `capture.devices` when the recipe names them); without them, on GPUs, an even share of the visible
    devices. On CPU the threads are the launching process's: fewer threads per worker would change the
    float summation order, and with it the shard bytes, which must not depend on how many workers
    captured them."""
    from dspark_cli.machine.devices import producer_environ

    env = producer_environ(recipe, worker, _child_environ())
    if recipe.capture.devices:
        return env
    import torch

    if torch.cuda.is_available():
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        ids = visible.split(",") if visible else [str(i) for i in range(torch.cuda.device_count())]
        per = len(ids) // workers
        if per == 0:
            raise UsageError(
                f"capture.workers={workers} needs a GPU each; {len(ids)} visible",
                f"set capture.workers={len(ids)} or fewer, or capture.devices",
            )
        env["CUDA_VISIBLE_DEVICES"] = ",".join(ids[worker * per : (worker + 1) * per])
    return env


def _child_environ() -> dict[str, str]:
    env = dict(os.environ)
    if env.pop("DSPARK_BOUND_THREADS", None):  # a binding chosen for one process would stack the workers
        env.pop("OMP_PROC_BIND", None)
    return env


def capture_with_workers(
    recipe: Recipe, plan: CapturePlan, out_dir: Path, done: dict[str, dict[str, Any]], on_progress: Any, manifest: Any
) -> dict[str, Any]:
    """Start the workers for the shards not in `done`, report progress, merge; the backend description.

    `manifest(backend, entries, complete)` writes the stage manifest (capture/sinks.py)."""
    workers = plan.num_workers  # capture.workers, at most one per shard
    done = {**done, **worker_entries(out_dir, plan)}
    manifest({"backend": recipe.capture.backend_here(), "workers": workers}, done, False)
    for path in out_dir.glob(WORKER_GLOB):  # their shards are in the manifest now
        path.unlink()
    recipe_file = write_resolved(recipe, out_dir)
    from dspark_cli.machine.procs import dies_with_parent

    # resumable: a worker of a killed capture stage is SIGKILLed with it, the rerun keeps its finished shards
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "dspark_cli.capture.workers", str(recipe_file), str(w), str(workers)],
            env=worker_environ(recipe, w, workers),
            preexec_fn=dies_with_parent(signal.SIGKILL),
        )
        for w in range(workers)
    ]
    sizes = {shard_name(s.index): (len(s.ids), s.tokens) for s in plan.shards}
    try:
        while any(p.poll() is None for p in procs):
            time.sleep(0.5)
            if on_progress is not None:
                merged = {**done, **worker_entries(out_dir, plan)}
                on_progress(sum(sizes[n][0] for n in merged), plan.num_sequences, sum(sizes[n][1] for n in merged))
    except BaseException:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait()
        raise
    finally:
        merged = {**done, **worker_entries(out_dir, plan)}
        failed = [(w, p.returncode) for w, p in enumerate(procs) if p.returncode != 0]
        backend = _backend(out_dir, recipe, workers)
        if failed or len(merged) < len(plan.shards):
            manifest(backend, merged, False)  # the finished shards are kept for the next run
    if failed or len(merged) < len(plan.shards):
        worker, code = failed[0] if failed else (None, 0)
        raise DsparkError(
            f"capture worker {worker} of {workers} failed (exit code {code}); "
            f"{len(merged)} of {len(plan.shards)} shards are finished and kept",
            "its error is printed above; run the same command again to capture the rest",
        )
    manifest(backend, merged, True)
    for path in out_dir.glob(WORKER_GLOB):
        path.unlink()
    return backend


def _backend(out_dir: Path, recipe: Recipe, workers: int) -> dict[str, Any]:
    try:
        data = read_json(worker_file(out_dir, 0))
        return {**data["backend"], "workers": workers}
    except (OSError, ValueError, KeyError):
        return {"backend": recipe.capture.backend_here(), "workers": workers, "resumed": True}


def run_worker(recipe: Recipe, worker: int, workers: int) -> int:
    """Capture this worker's pending shards, listing each in its worker file; the number captured."""
    import itertools

    from dspark_cli.artifacts.files import read_manifest
    from dspark_cli.capture.capturer import capture_shard, make_capturer
    from dspark_cli.capture.shards import write_shard

    plan = build_plan(recipe)
    out_dir = Path(recipe.stage_dir("capture"))
    listed = (
        {e["file"] for e in read_manifest(out_dir).get("shards", [])} if (out_dir / MANIFEST_NAME).is_file() else set()
    )
    mine = {s.index for s in plan.worker_shards(worker, workers) if shard_name(s.index) not in listed}
    entries: list[dict[str, Any]] = []
    capturer = make_capturer(plan, out_dir) if mine else None
    record = {
        "fingerprint": plan.fingerprint,
        "worker": worker,
        "workers": workers,
        "backend": capturer.describe() if capturer is not None else {},
        "shards": entries,
    }
    write_json_atomic(worker_file(out_dir, worker), record)
    for index, group in itertools.groupby(plan.samples(), key=lambda item: item[0]):
        if index not in mine:
            continue
        sequences = capture_shard(capturer, recipe.capture.batch_size, [item[1:] for item in group])
        entries.append(
            write_shard(
                out_dir / shard_name(index), sequences, layer_ids=plan.layer_ids, hidden_size=plan.geometry.hidden_size
            )
        )
        write_json_atomic(worker_file(out_dir, worker), record)
    return len(entries)


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit("usage: python -m dspark_cli.capture.workers RECIPE_YAML WORKER WORKERS")
    run_worker(load_recipe(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
