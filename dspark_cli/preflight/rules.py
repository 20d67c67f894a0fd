"""Recipe rules: what a stage refuses from the recipe alone, whatever machine it runs on.

Each rule is `rule(recipe, context) -> [problem lines]`; RULES lists them per stage. The rules every
stage shares live in `shared.py` and run first (`preflight`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from dspark_cli.preflight.redacted import STAGE_READS, no_recorded_secret
from dspark_cli.preflight.stream import stream_bounds_hold
from dspark_cli.targets import Target

if TYPE_CHECKING:
    from dspark_cli.preflight import Context
    from dspark_cli.recipe.schema import Recipe


def online_device_split(recipe: Recipe, context: Context) -> list[str]:
    """Producers and trainers on one node need disjoint devices that fit (machine/devices.py): the lists
    given, or with neither set on a machine with GPUs, the default split (producers first, then ranks)."""
    from dspark_cli.machine.devices import device_split_problems

    if recipe.capture.mode != "online" or recipe.capture.external_producers:
        return []
    available = context.machine.gpus if context.machine is not None and context.machine.gpus else None
    return [
        f"capture.devices / train.devices: {p}; give producers and trainers disjoint lists that fit, or "
        "lower capture.workers / train.nproc_per_node (docs/online.md)"
        for p in device_split_problems(recipe, available)
    ]


def k3_stream_needs_vllm(recipe: Recipe, context: Context) -> list[str]:
    """Only vLLM captures Kimi-K3's attention-residual stream (capture/plan.py)."""
    capture, machine = recipe.capture, context.machine
    backend = capture.backend_here(machine.has("vllm")) if machine is not None else capture.backend
    if capture.aux_attn_res_stream and backend == "hf" and Target.of(recipe).geometry(strict=False).is_kimi_k3:
        return [
            "capture.aux_attn_res_stream: only the vllm backend captures Kimi-K3's attention-residual stream; "
            "set capture.backend=vllm, or aux_attn_res_stream=false (and serve with the same)"
        ]
    return []


def capture_prompt_fits_vllm(recipe: Recipe, context: Context) -> list[str]:
    """vLLM refuses a prompt exactly `max_model_len` tokens long, even with one token to generate, and the
    vLLM backend runs every captured sequence as such a prompt (`auto` is vLLM wherever it is installed)."""
    capture, limit = recipe.capture, recipe.target.max_model_len
    machine = context.machine
    backend = capture.backend_here(machine.has("vllm")) if machine is not None else capture.backend
    if backend == "hf" or capture.max_seq_len < limit:
        return []
    return [
        (
            f"capture.max_seq_len: {capture.max_seq_len} is not below target.max_model_len {limit}, and the vLLM "
            f"capture engine refuses a prompt of max_model_len tokens; set capture.max_seq_len<={limit - 1}, raise "
            "target.max_model_len, or set capture.backend=hf"
        )
    ]


def capture_workers_fit_the_plan(recipe: Recipe, context: Context) -> list[str]:
    """No more capture workers than the plan has shards (a worker captures whole shards): judged once the
    datagen output is finished, from the plan every capture worker computes (capture/plan.py)."""
    if recipe.capture.workers == 1:
        return []
    from dspark_cli.artifacts.datagen import datagen_manifest
    from dspark_cli.capture import build_plan, workers_beyond_shards
    from dspark_cli.errors import DsparkError
    from dspark_cli.preflight.stream import quiet

    try:
        if datagen_manifest(recipe) is None:
            return []  # the shards are known once datagen has run; capture starts at most one worker per shard
        with quiet("dspark_cli.capture.plan"):  # its warnings are the stage's to print, when it runs
            plan = build_plan(recipe)
    except DsparkError:
        return []  # the data or the target is another rule's problem, or the stage's own
    beyond = workers_beyond_shards(recipe.capture.workers, plan)
    return [] if beyond is None else [beyond]


def datagen_has_sources(recipe: Recipe, context: Context) -> list[str]:
    if not recipe.datagen.sources:
        return ["datagen.sources: empty; add a prompt file or dataset, e.g. sources: [{path: prompts.jsonl}]"]
    return []


def early_stop_needs_a_split(recipe: Recipe, context: Context) -> list[str]:
    """Early stopping counts validations, and without a validation split there are none (training/validation.py)."""
    if recipe.train.early_stop_patience is not None and recipe.datagen.validation_fraction == 0:
        return [
            "train.early_stop_patience: set, but datagen.validation_fraction is 0, so there is no validation "
            "split to stop on; set datagen.validation_fraction (e.g. 0.05) or unset train.early_stop_patience"
        ]
    return []


def export_format_fits_the_draft(recipe: Recipe, context: Context) -> list[str]:
    """vLLM reads speculators-format DSpark drafts as Qwen3DSparkModel only (export/writer.py)."""
    if recipe.export.format != "speculators":
        return []
    arch = recipe.draft.arch
    if arch == "auto":  # as draft/build.py picks it: MLA when the target has kv_lora_rank
        config = Target.of(recipe).config()
        arch = "mla" if (config or {}).get("kv_lora_rank") else "gqa" if config else "auto"
    if arch == "mla":
        return [
            (
                "export.format: speculators has no MLA form (vLLM maps speculators-format dspark to "
                "Qwen3DSparkModel only); MLA drafts stay native: set export.format=vllm"
            )
        ]
    return []


def export_embeddings_need_a_local_target(recipe: Recipe, context: Context) -> list[str]:
    """--include-embeddings reads the target's own safetensors files (export/writer.py)."""
    if recipe.export.include_embeddings and _hub_id(recipe):
        return [
            f"export.include_embeddings: reads the target's weights from disk, and target.model "
            f"{recipe.target.model} is a hub id; download it and set target.model to its directory"
        ]
    return []


def export_config_loads_in_vllm(recipe: Recipe, context: Context) -> list[str]:
    """The draft's config.json as export will write it, against vLLM's loader rules, before training."""
    from dspark_cli.export import planned_config_problems

    return planned_config_problems(recipe)


def bench_has_datasets(recipe: Recipe, context: Context) -> list[str]:
    if not recipe.bench.datasets:
        return ["bench.datasets: empty; add mt_bench, speed_bench, or a prompt file"]
    return []


def bench_thresholds_need_confidence(recipe: Recipe, context: Context) -> list[str]:
    """Confidence-scheduled verification reads the confidence head (bench/engine.py): the recipe's draft says
    whether it has one, or for a published draft (no recipe of its own) its config.json."""
    if not any(t > 0 for t in recipe.bench.confidence_thresholds):
        return []
    published = _published_head(context.options.inputs.get("bench"))
    if published is False:
        return [
            "bench.confidence_thresholds: thresholds above 0 need a confidence head, and this published draft "
            "has none (its config.json); set bench.confidence_thresholds=[0.0]"
        ]
    if published is None and not recipe.draft.confidence_head:
        return [
            "bench.confidence_thresholds: thresholds above 0 need draft.confidence_head: true; "
            "set bench.confidence_thresholds=[0.0] for a draft without one"
        ]
    return []


def _published_head(draft: str | None) -> bool | None:
    """Whether the published draft in `draft` has a confidence head (its config.json, as vLLM reads it);
    None when `draft` is not a published draft or its config cannot be read (the bench's checks say why)."""
    if not draft:
        return None
    from dspark_cli.errors import DsparkError
    from dspark_cli.export import contract_of, is_published
    from dspark_cli.recipe.bounded import read_json

    if not is_published(draft):
        return None
    try:
        config = read_json(Path(draft) / "config.json")
        return bool(contract_of(config)["confidence_head"]) if isinstance(config, dict) else None
    except (OSError, ValueError, KeyError, TypeError, DsparkError):
        return None


def publish_destination(recipe: Recipe, context: Context) -> list[str]:
    """A repo and at least one hub (publish/run.py); the repo id's spelling is checked with the recipe."""
    problems = []
    if not recipe.publish.repo_id:
        problems.append(
            "publish.repo_id: publish needs a destination repo; pass --repo-id OWNER/NAME or set publish.repo_id"
        )
    if not recipe.publish.hubs:
        problems.append("publish.hubs: empty; set publish.hubs=[huggingface]")
    return problems


def _hub_id(recipe: Recipe) -> bool:
    try:
        return Target.of(recipe).local is None
    except Exception:  # noqa: BLE001 - a broken target is a shared rule's problem (shared.py)
        return False


RULES = {
    "datagen": [datagen_has_sources],
    "capture": [k3_stream_needs_vllm, capture_prompt_fits_vllm, capture_workers_fit_the_plan],
    "train": [online_device_split, stream_bounds_hold, early_stop_needs_a_split],
    "export": [export_format_fits_the_draft, export_embeddings_need_a_local_target, export_config_loads_in_vllm],
    "bench": [bench_has_datasets, bench_thresholds_need_confidence],
    "publish": [publish_destination],
}


for _stage in STAGE_READS:  # before a stage's own rules: a recipe copied from a run's recipe.yaml
    RULES.setdefault(_stage, []).insert(0, no_recorded_secret)
