"""A bench report: `bench.json` of a `dspark bench` run as typed records, and the reader.

    report = read_bench_report("runs/tiny/bench/bench.json")   # a BenchSummary, or one line saying why not
    for run in report.offline.runs: run.dataset, run.temperature, run.tau.mean, run.acceptance_per_position[0].mean
    report.to_dict()                                            # bench.json again, key for key

Written by `dspark_cli.bench` (`bench/report.py`: bench.json, bench.md and the plots; bench.json is
written first, with kind dspark.bench, so a report whose plots failed is still a report). The bench's
measuring code builds these sections as the JSON it writes (stats.py, calibration.py, context.py,
adaptive.py, endpoint.py); the report, the plots, the model card and a later bench's baseline read them
here, by attribute. Maps keyed by what was measured (categories, plots, files) stay dictionaries.

`from_dict` reads any bench.json dspark wrote: a key a report lacks takes its field's default (an older
or partial report still reads), a key this version does not know is kept; `to_dict` writes the keys
the report was read with, in their order, then any field set since, so `from_dict(d).to_dict() == d`.
Import-light: no torch.
"""

from __future__ import annotations

import dataclasses
import json
import os
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from dspark_cli.artifacts.records import Record
from dspark_cli.errors import DataError, UsageError

KIND = "dspark.bench"
REPORT = "bench.json"
DRAFT_MANIFEST = "dspark_manifest.json"  # artifacts.draft's name, not imported: that module reads the recipe package

B = TypeVar("B", bound="BenchRecord")


@dataclass
class BenchRecord(Record):
    """A section of bench.json: fields by name, read from and written back to its JSON exactly."""

    _keys: list[str] | None = field(default=None, init=False, repr=False, compare=False)  # as read, in order
    _extra: dict[str, Any] = field(default_factory=dict, init=False, repr=False, compare=False)  # unknown keys

    OPTIONAL: typing.ClassVar[tuple[str, ...]] = ()  # keys a record built in code leaves out while None

    @classmethod
    def from_dict(cls: type[B], data: dict[str, Any]) -> B:
        hints = _hints(cls)
        names = [f.name for f in dataclasses.fields(cls) if f.init]
        record = cls(**{name: _revive(hints[name], data[name]) for name in names if name in data})
        record._keys = list(data)
        record._extra = {k: v for k, v in data.items() if k not in names}
        return record

    def to_dict(self) -> dict[str, Any]:
        fields = {f.name: f for f in dataclasses.fields(self) if f.init}
        if self._keys is None:  # built in code: every field, less the optional ones left at None
            return {
                name: _plain(getattr(self, name))
                for name in fields
                if not (name in self.OPTIONAL and getattr(self, name) is None)
            }
        out = {key: _plain(getattr(self, key)) if key in fields else self._extra[key] for key in self._keys}
        for name, spec in fields.items():  # fields set since the report was read
            if name not in out and getattr(self, name) != _default(spec):
                out[name] = _plain(getattr(self, name))
        return out


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    """The record's field types, resolved once per class (a report holds thousands of records)."""
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def _default(spec: dataclasses.Field) -> Any:
    if spec.default_factory is not dataclasses.MISSING:
        return spec.default_factory()
    return spec.default


def _plain(value: Any) -> Any:
    """A field's value as JSON: records by their `to_dict`, lists and maps item by item."""
    if isinstance(value, Record):
        return value.to_dict()
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _revive(hint: Any, value: Any) -> Any:
    """`value` (from JSON) as the field type `hint` says: a record from its dict, a list or map of them."""
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    for option in typing.get_args(hint) if union else (hint,):  # `Calibration | None` -> Calibration
        origin = typing.get_origin(option)
        if isinstance(option, type) and issubclass(option, Record) and isinstance(value, dict):
            return option.from_dict(value)
        if origin is list and isinstance(value, list):
            return [_revive(typing.get_args(option)[0], item) for item in value]
        if origin is dict and isinstance(value, dict):
            return {k: _revive(typing.get_args(option)[1], v) for k, v in value.items()}
    return value


# --- statistics (bench/stats.py, context.py, calibration.py) -------------------------------------------------


@dataclass
class Estimate(BenchRecord):
    """A pooled ratio with its cluster-robust 95% interval (`stats.ratio_estimate`)."""

    mean: float | None = None
    ci95: list[float | None] = field(default_factory=lambda: [None, None])  # [None, None]: one cluster
    n: int = 0  # steps
    clusters: int = 0  # turns with steps


@dataclass
class CategoryStats(BenchRecord):
    num_turns: int = 0
    num_steps: int = 0
    tau: Estimate = field(default_factory=Estimate)


@dataclass
class ContextBin(BenchRecord):
    """Steps whose context length falls in [low, high) (`context.by_context`)."""

    low: int = 0
    high: int = 0
    num_steps: int = 0
    num_turns: int = 0
    tau: Estimate = field(default_factory=Estimate)
    acceptance_per_position: list[float | None] = field(default_factory=list)


@dataclass
class ReliabilityBin(BenchRecord):
    low: float = 0.0
    high: float = 0.0
    n: int = 0
    predicted: float = 0.0
    observed: float = 0.0


@dataclass
class Reliability(BenchRecord):
    """Predicted against observed acceptance of (confidence, accepted) pairs (`calibration.reliability`)."""

    n: int = 0
    predicted: float | None = None
    observed: float | None = None
    ece: float | None = None
    brier: float | None = None
    auc: float | None = None
    bins: list[ReliabilityBin] = field(default_factory=list)


@dataclass
class PositionReliability(Reliability):
    """One draft position's reliability, and its mean predicted survival against the observed acceptance."""

    position: int = 0
    predicted_survival: float | None = None
    observed_acceptance: float | None = None


@dataclass
class Calibration(BenchRecord):
    """The confidence head's calibration report (`calibration.calibration`)."""

    num_bins: int = 0
    overall: Reliability = field(default_factory=Reliability)
    positions: list[PositionReliability] = field(default_factory=list)
    verdict: str = ""  # calibrated | miscalibrated | uninformative
    reasons: list[str] = field(default_factory=list)


# --- the offline bench (bench/offline.py) ---------------------------------------------------------------------


@dataclass
class EngineInfo(BenchRecord):
    """What ran the offline bench (`OfflineBench.describe`)."""

    engine: str = ""
    target: str = ""
    draft_dir: str = ""
    device: str = ""
    dtype: str = ""
    torch: str = ""
    num_speculative_tokens: int = 0
    draft_sample_method: str = ""
    rejection_sample_method: str = ""
    top_p: float = 1.0
    max_tokens: int = 0
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    chat_template_sha256: str = ""
    has_confidence_head: bool = False
    warnings: list[str] = field(default_factory=list)
    prompt_lookup: str = ""  # prompt_lookup_min/max of the ngram baseline
    batch_size: int = 1  # requests run at once (`bench.batch_size`): tokens/s is the batch's throughput


@dataclass
class OfflineRun(BenchRecord):
    """One dataset at one temperature, every draft verified (threshold 0): `stats.summarize` and more."""

    dataset: str = ""
    temperature: float = 0.0
    threshold: float = 0.0
    num_turns: int = 0
    num_steps: int = 0
    tau: Estimate = field(default_factory=Estimate)
    acceptance_per_position: list[Estimate] = field(default_factory=list)
    verified_per_step: float | None = None
    drafts_per_step: float | None = None
    output_tokens: int = 0
    seconds: float = 0.0
    tokens_per_second: float | None = None
    by_category: dict[str, CategoryStats] = field(default_factory=dict)  # category -> its numbers
    calibration: Calibration | None = None  # a draft with a confidence head
    by_context: list[ContextBin] = field(default_factory=list)

    OPTIONAL = ("calibration",)


@dataclass
class SweepRow(BenchRecord):
    """One dataset x temperature x confidence threshold of the confidence-scheduled verification sweep."""

    dataset: str = ""
    temperature: float = 0.0
    threshold: float = 0.0
    tau: float | None = None
    tau_ci95: list[float | None] = field(default_factory=lambda: [None, None])
    verified_per_step: float | None = None
    drafts_per_step: float | None = None
    tokens_per_verified: float | None = None
    tokens_per_second: float | None = None


@dataclass
class BaselineRun(BenchRecord):
    """A baseline drafter (`ngram`, `untrained`) on the same prompts, in the same engine."""

    name: str = ""
    dataset: str = ""
    temperature: float = 0.0
    tau: Estimate = field(default_factory=Estimate)
    num_steps: int = 0
    acceptance_per_position: list[Estimate] = field(default_factory=list)
    drafts_per_step: float | None = None


@dataclass
class ContextSweep(BenchRecord):
    """Long conversations of the datasets' prompts up to `target.max_model_len`, binned by context."""

    dataset: str = ""  # "<datasets>-chained"
    temperature: float = 0.0
    datasets: list[str] = field(default_factory=list)
    num_conversations: int = 0
    turns_per_conversation: list[int] = field(default_factory=list)
    longest_context: int = 0
    num_turns: int = 0
    num_steps: int = 0
    output_tokens: int = 0
    seconds: float = 0.0
    max_model_len: int = 0
    bins: list[ContextBin] = field(default_factory=list)
    note: str = ""  # where tau drops (`context.drop_note`)


@dataclass
class CostModelInfo(BenchRecord):
    """The step-cost model of the adaptive-verification model (`adaptive.CostModel.describe`)."""

    label: str = ""
    estimate: bool = False
    cudagraph_limit: int = 0
    draft_curve: list[list[float]] = field(default_factory=list)  # [number of requests, ms]
    verify_curve: list[list[float]] = field(default_factory=list)  # [number of target tokens, ms]


@dataclass
class PolicyResult(BenchRecord):
    """One verification policy at one concurrency level, modelled."""

    tokens_per_step: float = 0.0
    drafts_per_request: float = 0.0
    tokens_per_second: float = 0.0


@dataclass
class AdaptiveLevel(BenchRecord):
    concurrency: int = 0
    fixed: PolicyResult = field(default_factory=PolicyResult)
    adaptive: PolicyResult = field(default_factory=PolicyResult)
    none: PolicyResult = field(default_factory=PolicyResult)


@dataclass
class AdaptiveRun(BenchRecord):
    dataset: str = ""
    temperature: float = 0.0
    levels: list[AdaptiveLevel] = field(default_factory=list)


@dataclass
class AdaptiveModel(BenchRecord):
    """vLLM's adaptive verification against fixed-k across concurrency, modelled (`adaptive.py`)."""

    cost_model: CostModelInfo = field(default_factory=CostModelInfo)
    runs: list[AdaptiveRun] = field(default_factory=list)


@dataclass
class OfflineResults(BenchRecord):
    """`run_offline`: the reference engine's runs and everything measured beside them."""

    engine: EngineInfo = field(default_factory=EngineInfo)
    runs: list[OfflineRun] = field(default_factory=list)
    confidence_sweep: list[SweepRow] = field(default_factory=list)  # empty without a threshold > 0
    baselines: list[BaselineRun] = field(default_factory=list)
    context_sweep: list[ContextSweep] = field(default_factory=list)
    adaptive_verification: AdaptiveModel | None = None  # a draft with a confidence head

    def baseline(self, name: str, run: OfflineRun | SweepRow) -> BaselineRun | None:
        """Baseline `name` on the same dataset and temperature as `run`."""
        return next(
            (
                b
                for b in self.baselines
                if b.name == name and b.dataset == run.dataset and b.temperature == run.temperature
            ),
            None,
        )

    def baseline_names(self) -> list[str]:
        return list(dict.fromkeys(b.name for b in self.baselines))


# --- a live server (bench/endpoint.py) -----------------------------------------------------------------------


@dataclass
class SpecDecode(BenchRecord):
    """The deltas of vLLM's speculative-decoding counters over one level (`endpoint.counter_delta`)."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_tokens_per_pos: list[int] = field(default_factory=list)
    tau: float | None = None
    acceptance_rate: float | None = None
    acceptance_per_position: list[float] = field(default_factory=list)


@dataclass
class OnlineLevel(BenchRecord):
    """Every conversation at one concurrency and temperature against one endpoint (`endpoint.measure_level`)."""

    concurrency: int = 0
    temperature: float = 0.0
    num_requests: int = 0
    num_failed: int = 0
    errors: list[str] = field(default_factory=list)
    output_tokens: int = 0
    seconds: float = 0.0
    output_tokens_per_second: float | None = None
    requests_per_second: float | None = None
    ttft_mean: float | None = None
    ttft_p50: float | None = None
    ttft_p99: float | None = None
    tpot_mean: float | None = None
    tpot_p50: float | None = None
    tpot_p99: float | None = None
    itl_mean: float | None = None
    itl_p50: float | None = None
    itl_p99: float | None = None
    spec_decode: SpecDecode | None = None  # None: a server without speculation


@dataclass
class EndpointRuns(BenchRecord):
    """One endpoint across temperatures and concurrency levels (`endpoint.sweep`)."""

    endpoint: str = ""
    model: str | None = None
    datasets: list[str] = field(default_factory=list)
    levels: list[OnlineLevel] = field(default_factory=list)
    source: str | None = None  # a baseline taken from a saved report: that bench.json

    OPTIONAL = ("source",)


@dataclass
class Speedup(BenchRecord):
    temperature: float = 0.0
    concurrency: int = 0
    output_tokens_per_second: float | None = None
    baseline_output_tokens_per_second: float | None = None
    speedup: float | None = None
    tpot_speedup: float | None = None


@dataclass
class OnlineResults(BenchRecord):
    """`run_online`: the endpoint's runs, and the baseline's with the speedups when there is one."""

    endpoint_runs: EndpointRuns | None = None
    baseline_runs: EndpointRuns | None = None
    speedup: list[Speedup] | None = None

    OPTIONAL = ("baseline_runs", "speedup")


# --- the report ---------------------------------------------------------------------------------------------


@dataclass
class ReferenceRow(BenchRecord):
    """A published number (`bench.reference`) beside ours."""

    key: str = ""  # <dataset>_tau_t<temperature>
    reference: float | None = None
    offline: float | None = None
    online: float | None = None


@dataclass
class TauLine(Record):
    """One measured (dataset, temperature) of an offline bench, at confidence threshold 0."""

    dataset: str
    temperature: float
    tau: float | None  # None: no verification step
    ci95: list[float | None] | None  # [None, None] from a single prompt
    baselines: dict[str, float]  # baseline name -> its tau on the same prompts
    calibration: str | None  # the confidence head's verdict
    ece: float | None


@dataclass
class DraftResults(BenchRecord):
    """One draft of a several-draft bench (`dspark bench A B --offline`): who it is, and its offline results."""

    name: str = ""  # its hub id, else its folder's name (with the folders above where two share one)
    draft_dir: str = ""  # as `BenchSummary.draft_dir`: relative to the report folder, or a hub id
    published: bool = False  # no dspark_manifest.json: checked as a published draft (export/published.py)
    draft_sha256: str | None = None  # a dspark draft: of its dspark_manifest.json
    draft_weights_sha256: str | None = None  # a published draft: of its model.safetensors
    offline: OfflineResults = field(default_factory=OfflineResults)

    OPTIONAL = ("draft_sha256", "draft_weights_sha256")


@dataclass
class BenchSummary(BenchRecord):
    """`run_bench`, and bench.json: the run's frame, then what was measured (no key for what was not run)."""

    kind: str = KIND
    format_version: int = 1
    dspark: str = ""
    name: str = ""
    created: str = ""
    target: str = ""
    draft_dir: str | None = None  # relative to the report folder (`../draft`), or the draft's name alone
    draft_sha256: str | None = None  # of the draft's dspark_manifest.json: which draft this is, wherever it lies
    draft_published: bool | None = None  # True: a published draft (no manifest), known by its weights instead
    draft_weights_sha256: str | None = None  # a published draft's model.safetensors
    bench: dict[str, Any] = field(default_factory=dict)  # the bench settings used
    serve: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    complete: bool | None = None  # False while measuring (bench.json is written as results come)
    offline: OfflineResults | None = None
    online: OnlineResults | None = None
    reference: list[ReferenceRow] | None = None
    files: dict[str, Any] | None = None  # json, markdown, plots {name: file name}, checksums {file name: sha256}
    drafts: list[DraftResults] | None = None  # several drafts (then no draft_dir, offline, online)
    report_dir: Path | None = field(default=None, init=False, repr=False, compare=False)  # where it lies; not written

    OPTIONAL = (
        "draft_sha256",
        "draft_published",
        "draft_weights_sha256",
        "offline",
        "online",
        "reference",
        "files",
        "drafts",
    )

    def local(self, name: str) -> Path:
        """A file of the report (`files["markdown"]`, a plot) on this machine: `name` in the report folder."""
        return Path(self.report_dir or ".") / name

    def measured_draft(self, draft_dir: str | os.PathLike[str]) -> bool:
        """Did this report measure the draft now in `draft_dir`? By the sha256 of its manifest (a re-exported
        draft in the same directory is another draft); a published draft's report by its weights, and only for a
        directory that is one still; a report without either by its `draft_dir` as recorded; a report of several
        drafts measured none alone."""
        from dspark_cli.artifacts.files import sha256_file

        manifest = Path(draft_dir) / DRAFT_MANIFEST
        if self.drafts is not None:
            return False
        if self.draft_weights_sha256 is not None:
            weights = Path(draft_dir) / "model.safetensors"
            return not manifest.exists() and weights.is_file() and sha256_file(weights) == self.draft_weights_sha256
        if self.draft_sha256 is not None:
            return manifest.is_file() and sha256_file(manifest) == self.draft_sha256
        return bool(self.draft_dir) and Path(str(self.draft_dir)).resolve() == Path(draft_dir).resolve()

    def tau_lines(self) -> list[TauLine]:
        """tau per (dataset, temperature) of the offline runs at threshold 0, with its baselines."""
        if self.offline is None:
            return []
        lines = []
        for run in self.offline.runs:
            if run.threshold != 0.0:
                continue
            baselines = {
                b.name: b.tau.mean
                for b in self.offline.baselines
                if (b.dataset, b.temperature) == (run.dataset, run.temperature) and b.tau.mean is not None
            }
            calibration = run.calibration
            lines.append(
                TauLine(
                    run.dataset,
                    run.temperature,
                    run.tau.mean,
                    run.tau.ci95,
                    baselines,
                    calibration.verdict if calibration else None,
                    calibration.overall.ece if calibration else None,
                )
            )
        return lines


def read_bench_report(path: str | os.PathLike[str]) -> BenchSummary:
    """The bench report in the file `path`; one-line UsageError when there is none, DataError when it
    is unreadable or not a dspark bench report."""
    from dspark_cli.recipe.bounded import read_json  # here: importing the recipe package costs `dspark --help` 0.1 s

    path = Path(path)
    if not path.is_file():
        raise UsageError(f"no bench report at {path}", "run `dspark bench` first (it writes bench.json)")
    try:
        data = read_json(path)
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}: invalid JSON ({exc.msg})", "run `dspark bench` again") from None
    if not isinstance(data, dict) or data.get("kind") != KIND:
        kind = data.get("kind") if isinstance(data, dict) else None
        raise DataError(f"{path} is not a dspark bench report (kind {kind!r})", "run `dspark bench` again")
    report = BenchSummary.from_dict(data)
    report.report_dir = path.parent
    return report
