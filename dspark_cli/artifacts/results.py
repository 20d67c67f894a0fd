"""What each stage returns: a dataclass of typed fields, the same record its manifest and `--format json` hold.

    from dspark_cli.artifacts.results import TrainSummary
    summary = run_train(recipe)                  # a TrainSummary
    summary.final_metrics["loss"], summary.stream.peak_shards
    summary.to_dict()                            # JSON: the train manifest's "summary", `--format json`
    TrainSummary.from_dict(manifest["summary"])  # read back (a torchrun run's summary, from rank 0's manifest)

The commands (cli/, pipeline.py) read fields, never string keys. Records *inside* a result that are a
file format of their own (a draft's config.json, a training step's metrics) stay the dictionaries that
format defines. Bench's result is bench.json itself, typed section by section: `BenchSummary` and
`TauLine` live with its reader in artifacts/bench.py and are imported from here too. `Record` (to and
from JSON) is artifacts/records.py. Import-light: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dspark_cli.artifacts.bench import BenchSummary as BenchSummary
from dspark_cli.artifacts.bench import TauLine as TauLine
from dspark_cli.artifacts.records import Record as Record


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
    validation: int = 0  # of `conversations`, those held out as the validation split (never trained on)
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
    validation_sequences: int | None = None  # the validation split's, captured apart (offline: `validation/`)


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
    utilisation: dict[str, Any] | None = None  # training/stream_source.py's `utilisation`


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
    best: dict[str, Any] | None = (
        None  # {step, metric, value} of the validation that chose best/ (training/validation.py)
    )
    stopped: dict[str, Any] | None = None  # {reason: "early", step} when early stopping ended the run


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
    selected: dict[str, Any] | None = None  # which draft of the training run: {checkpoint: best|final, step, ...}


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
    selected: dict[str, Any] | None = None  # which draft of the training run: {checkpoint: best|final, step, ...}


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
