"""What each stage returns: a dataclass of typed fields, the same record its manifest and `--format json` hold.

    from dspark_cli.artifacts.results import TrainSummary
    summary = run_train(recipe)                  # a TrainSummary
    summary.final_metrics["loss"], summary.stream.peak_shards
    summary.to_dict()                            # JSON: the train manifest's "summary", `--format json`
    TrainSummary.from_dict(manifest["summary"])  # read back (a torchrun run's summary, from rank 0's manifest)

The commands (cli/, pipeline.py) read fields, never string keys. Records *inside* a result that are a
file format of their own (a bench report's runs, a draft's config.json, a training step's metrics) stay
the dictionaries that format defines. Import-light: no torch.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any, TypeVar

R = TypeVar("R", bound="Record")


@dataclass
class Record:
    """A result as JSON (`to_dict`) and back (`from_dict`: unknown keys are ignored, missing ones default)."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls: type[R], data: dict[str, Any]) -> R:
        hints = typing.get_type_hints(cls)
        return cls(**{f.name: _revive(hints[f.name], data[f.name]) for f in dataclasses.fields(cls) if f.name in data})


def _revive(hint: Any, value: Any) -> Any:
    """`value` (from JSON) as the field type `hint` says: a Record from its dict, a list of them, else as is."""
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    for option in typing.get_args(hint) if union else (hint,):  # `StreamSummary | None` -> StreamSummary
        if isinstance(option, type) and issubclass(option, Record) and isinstance(value, dict):
            return option.from_dict(value)
        if typing.get_origin(option) is list and isinstance(value, list):
            return [_revive(typing.get_args(option)[0], item) for item in value]
    return value


@dataclass
class FilterCounts(Record):
    """Conversations per source: read, kept, and dropped per reason."""

    read: dict[str, int] = field(default_factory=dict)
    kept: dict[str, int] = field(default_factory=dict)
    dropped: dict[str, dict[str, int]] = field(default_factory=dict)  # reason -> source -> count


@dataclass
class DatagenSummary(Record):
    """`run_datagen`: the plan's numbers, then the dry run's (`already_done`) or the run's own."""

    output_dir: str
    conversations: int
    turns: int  # assistant turns to generate
    shards: int
    counts: FilterCounts
    engine: str  # what generates, e.g. "vllm (in process)"
    already_done: int | None = None  # dry run: shards already written
    generated_tokens: int | None = None  # a run: tokens generated now (0 when every shard was there)
    seconds: float | None = None
    tokens_per_second: float | None = None


@dataclass
class CaptureSummary(Record):
    """`run_capture`: what was captured, by which backend, into which sink (directory or stream)."""

    output_dir: str  # the capture directory, or the stream's location
    mode: str  # "offline" | "online"
    backend: str | None  # "vllm" | "hf": what captured (or would have, when every shard was there)
    sequences: int
    tokens: int
    loss_tokens: int
    shards: int
    captured_tokens: int  # captured now (0 when every shard was there)
    seconds: float
    tokens_per_second: float | None
    goal_bytes_per_token: float
    truncated: int
    skipped_no_loss: int
    workers: int | None = None  # offline, by several worker processes
    bytes: int | None = None  # offline: the shards on disk
    bytes_per_token: float | None = None
    peak_disk_bytes: int | None = None  # online: this producer's peak stream bytes
    peak_shards: int | None = None
    producer_wait_seconds: float | None = None


@dataclass
class StreamSummary(Record):
    """An online run's stream: its bound, its peaks, the producers, and who waited for whom."""

    location: str
    producers: int
    peak_bytes: int
    peak_shards: int
    max_shards: int
    producer_restarts: int
    producer_wait_s: list[float]
    rewinds: int
    required_shards: int | None = None
    planned_steps: int | None = None
    utilisation: dict[str, Any] | None = None  # training/online.py's `utilisation`


@dataclass
class TrainSummary(Record):
    """`run_train`: also the train manifest's "summary" (written by rank 0)."""

    output_dir: str
    steps: int  # the last step trained
    num_steps: int
    resumed_from: str | None
    tokens: int
    world_size: int
    final_metrics: dict[str, Any] | None  # the last logged step's metrics record (training/metrics.py)
    wall_s: float
    shapes: dict[str, Any] | None  # training/loop.py's `shape_summary`
    final: str  # the final draft directory
    stream: StreamSummary | None = None  # online runs


@dataclass
class TrainDryRun(Record):
    """`plan_train`: what `dspark train --dry-run` shows; exact when the capture (or datagen, online) exists."""

    output_dir: str
    world_size: int
    tokens_per_step: int  # budget, all ranks
    num_anchors: int
    block_size: int
    capture_mode: str  # "offline" | "online"
    capture_bytes: int | None  # the offline cache's size on disk; None before datagen
    exact: bool
    num_steps: int | None = None
    num_sequences: int | None = None  # per epoch
    num_tokens: int | None = None  # per epoch
    sequences_per_step: float | None = None
    stream_shards_needed: int | None = None  # online: the window one step needs


@dataclass
class ProduceSummary(Record):
    """`supervise`: this machine's producers, done."""

    stream: str
    producers: int
    restarts: int
    seconds: float


@dataclass
class ExportSummary(Record):
    """`export_checkpoint` (not a dry run): the draft directory written and checked."""

    output_dir: str
    architecture: str
    num_tensors: int
    num_bytes: int
    warnings: list[str]


@dataclass
class ExportPlan(Record):
    """An export dry run: the config.json and every tensor; nothing written."""

    architecture: str
    config: dict[str, Any]  # the config.json (vLLM's, or its speculators form)
    num_tensors: int
    num_bytes: int
    tensors: list[dict[str, Any]]  # name, shape, dtype
    source: str | None = None  # the checkpoint; None for `--meta` (the recipe alone)
    files: list[str] | None = None  # what export would write
    format: str = "vllm"
    num_parameters: int | None = None
    findings: list[str] | None = None  # checks against the target that a real export would fail or warn on


@dataclass
class TauLine(Record):
    """One measured (dataset, temperature) of an offline bench, at confidence threshold 0."""

    dataset: str
    temperature: float
    tau: float
    ci95: list[float] | None  # None from a single prompt
    baselines: dict[str, float]  # baseline name -> its tau on the same prompts
    calibration: str | None  # the confidence head's verdict
    ece: float | None


@dataclass
class BenchSummary(Record):
    """`run_bench`: the report's frame; `offline` / `online` hold the bench.json sections as written."""

    kind: str
    format_version: int
    dspark: str
    name: str
    created: str
    target: str
    draft_dir: str | None
    bench: dict[str, Any]  # the bench settings used
    serve: dict[str, Any]
    warnings: list[str]
    complete: bool
    offline: dict[str, Any] | None = None
    online: dict[str, Any] | None = None
    reference: list[Any] | None = None
    files: dict[str, Any] | None = None  # markdown, json, plots

    def to_dict(self) -> dict[str, Any]:  # bench.json has no keys for what was not run
        return {
            k: v
            for k, v in super().to_dict().items()
            if v is not None or k not in ("offline", "online", "reference", "files")
        }

    def tau_lines(self) -> list[TauLine]:
        """tau per (dataset, temperature) of the offline runs at threshold 0, with its baselines."""
        offline = self.offline or {}
        lines = []
        for run in offline.get("runs", []):
            if run.get("threshold", 0.0) != 0.0:
                continue
            key = (run["dataset"], run["temperature"])
            baselines = {
                b["name"]: b["tau"]["mean"]
                for b in offline.get("baselines", [])
                if (b["dataset"], b["temperature"]) == key and b["tau"]["mean"] is not None
            }
            calibration = run.get("calibration") or {}
            lines.append(
                TauLine(
                    run["dataset"],
                    run["temperature"],
                    run["tau"]["mean"],
                    run["tau"].get("ci95"),
                    baselines,
                    calibration.get("verdict"),
                    (calibration.get("overall") or {}).get("ece"),
                )
            )
        return lines


@dataclass
class PublishedFile(Record):
    path: str  # in the repo
    bytes: int
    source: str  # "generated", or the file it was read from


@dataclass
class PublishSummary(Record):
    """`publish_draft`: what went (or would go, dry run) where."""

    repo_id: str
    hubs: list[str]
    private: bool
    draft_dir: str
    architecture: str | None
    card: str  # where the model card came from
    files: list[PublishedFile]
    dry_run: bool
    urls: dict[str, str] = field(default_factory=dict)  # hub -> the repo's URL (after upload)
    card_text: str | None = None  # dry run: the model card
