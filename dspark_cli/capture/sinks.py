"""Where captured shards go: the stage's output directory (offline) or an online stream producer.

    sink = DirectorySink(plan, out_dir)          # shard files + manifest.json, resumable
    sink = StreamSink(plan, producer)            # capture.stream.StreamProducer: open / put / fail / finish
    done = sink.open()                           # shards already there (name -> entry): skipped
    sink.start(backend, entries); sink.put(index, sequences); ...; sink.finish(backend, entries)

capture/run.py drives either one the same way. The directory sink lists each shard in the manifest
(complete: false) as soon as it is written, so a killed run resumes with exactly the shards not listed.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from dspark_cli import __version__
from dspark_cli.artifacts.capture import KIND as MANIFEST_KIND
from dspark_cli.artifacts.files import MANIFEST_NAME, resumable_manifest, write_json_atomic
from dspark_cli.capture.plan import CapturePlan
from dspark_cli.capture.shards import shard_layout, shard_name, write_shard
from dspark_cli.recipe import write_resolved


def capture_manifest(
    plan: CapturePlan, backend: dict[str, Any], shards: list[dict[str, Any]], complete: bool
) -> dict[str, Any]:
    """The capture directory's manifest.json listing `shards` (their entries, in plan order)."""
    recipe, geometry = plan.recipe, plan.geometry
    tokens = sum(s["tokens"] for s in shards)
    size = sum(s["bytes"] for s in shards)
    return {
        "kind": MANIFEST_KIND,
        "format_version": 1,
        "dspark": __version__,
        "complete": complete,
        "fingerprint": plan.fingerprint,
        "contract": plan.contract.to_dict(),
        "layout": shard_layout(plan.layer_ids, geometry.hidden_size),
        "target": {
            "model": recipe.target.model,
            "path": geometry.location,
            "model_type": geometry.model_type,
            "num_hidden_layers": geometry.num_hidden_layers,
            "hidden_size": geometry.hidden_size,
        },
        "backend": {**backend, "requested": recipe.capture.backend},
        "datagen": {"dir": str(plan.datagen_dir), "fingerprint": plan.datagen.get("fingerprint")},
        "max_seq_len": recipe.capture.max_seq_len,
        "shard_tokens": recipe.capture.shard_tokens,
        "truncated": plan.truncated,
        "skipped_no_loss": plan.skipped_no_loss,
        "num_sequences": sum(s["sequences"] for s in shards),
        "num_tokens": tokens,
        "num_loss_tokens": sum(s["loss_tokens"] for s in shards),
        "bytes": size,
        "bytes_per_token": round(size / tokens, 2) if tokens else None,
        "shards": shards,
    }


def ordered(plan: CapturePlan, entries: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The entries of the shards in `entries`, in plan order."""
    return [entries[shard_name(s.index)] for s in plan.shards if shard_name(s.index) in entries]


def write_manifest(
    out_dir: Path, plan: CapturePlan, backend: dict[str, Any], entries: dict[str, dict[str, Any]], complete: bool
) -> dict[str, Any]:
    manifest = capture_manifest(plan, backend, ordered(plan, entries), complete)
    write_json_atomic(out_dir / MANIFEST_NAME, manifest)
    return manifest


def previous_shards(out_dir: Path, plan: CapturePlan) -> dict[str, dict[str, Any]]:
    """Shards a previous run of the same plan finished (name -> entry); refuse another plan's output."""
    previous = resumable_manifest(
        out_dir,
        kind=MANIFEST_KIND,
        fingerprint=plan.fingerprint,
        shard_glob="shard-*.safetensors",
        section="capture",
        changed="datagen output, target, layer ids or shard size",
    )
    done = {}
    for entry in previous.get("shards", []):
        file = out_dir / entry["file"]
        if file.is_file() and file.stat().st_size == entry["bytes"]:
            done[entry["file"]] = entry
    return done


class DirectorySink:
    """Offline: shard files in the stage's output directory, each listed in its manifest once written."""

    mode = "offline"

    def __init__(self, plan: CapturePlan, out_dir: Path) -> None:
        self.plan, self.out_dir, self.location = plan, out_dir, str(out_dir)
        self.wait_s = 0.0  # never waits for a reader
        self.entries: dict[str, dict[str, Any]] = {}
        self.backend: dict[str, Any] = {}

    def open(self) -> dict[str, dict[str, Any]]:
        done = previous_shards(self.out_dir, self.plan)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        for stale in self.out_dir.glob(".shard-*.tmp"):
            stale.unlink()
        write_resolved(self.plan.recipe, self.out_dir)
        return done

    def start(self, backend: dict[str, Any], done: dict[str, dict[str, Any]]) -> None:
        self.backend, self.entries = backend, dict(done)
        write_manifest(self.out_dir, self.plan, backend, self.entries, complete=False)

    def put(self, index: int, sequences: list[Any]) -> None:
        name = shard_name(index)
        self.entries[name] = write_shard(
            self.out_dir / name, sequences, layer_ids=self.plan.layer_ids, hidden_size=self.plan.geometry.hidden_size
        )
        write_manifest(self.out_dir, self.plan, self.backend, self.entries, complete=False)

    def fail(self, message: str) -> None:
        """Nothing to tell: the manifest lists what was finished."""

    def finish(self) -> dict[str, Any]:
        manifest = write_manifest(self.out_dir, self.plan, self.backend, self.entries, complete=True)
        return {"bytes": manifest["bytes"], "bytes_per_token": manifest["bytes_per_token"]}


class StreamSink:
    """Online: shards published into the stream by a producer (`capture.stream.StreamProducer`)."""

    mode = "online"

    def __init__(self, plan: CapturePlan, producer: Any) -> None:
        self.plan, self.producer, self.location = plan, producer, str(producer.directory)
        self.wait_s = 0.0  # time spent waiting for room in the stream's window

    def open(self) -> dict[str, dict[str, Any]]:
        plan = self.plan
        published = self.producer.open(
            fingerprint=plan.fingerprint,
            contract=plan.contract,
            layout=shard_layout(plan.layer_ids, plan.geometry.hidden_size),
            num_shards=len(plan.shards),
        )
        return {shard_name(i): {} for i in published}

    def start(self, backend: dict[str, Any], done: dict[str, dict[str, Any]]) -> None:
        if isinstance(getattr(self.producer, "status", None), dict):
            self.producer.status["backend"] = backend  # the producer's status names its engine

    def put(self, index: int, sequences: list[Any]) -> None:
        before = time.perf_counter()
        self.producer.put(index, sequences)
        self.wait_s += time.perf_counter() - before

    def fail(self, message: str) -> None:
        self.producer.fail(message)

    def finish(self) -> dict[str, Any]:
        self.producer.finish()
        status = self.producer.status
        return {
            "peak_disk_bytes": status["peak_bytes"],
            "peak_shards": status["peak_shards"],
            "producer_wait_seconds": round(self.wait_s, 2),
        }
