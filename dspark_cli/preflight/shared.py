"""Shared rules: what every stage refuses, from the whole recipe and its target (run first by `preflight`).

    shared_problems(recipe)     # [] or one line per problem: "key: what is wrong; the fix"

Field-level problems (types, ranges, unknown keys) are caught while loading (`recipe/`); these are the
problems only visible with the whole recipe in view, e.g. layer ids beyond the target's depth, two
fields that contradict each other, an output directory that cannot be made.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dspark_cli.draft.names import top_modules
from dspark_cli.errors import DsparkError
from dspark_cli.preflight.paths import output_dirs_creatable
from dspark_cli.preflight.stream import stream_location_problems
from dspark_cli.targets import Target

if TYPE_CHECKING:
    from dspark_cli.recipe.schema import Recipe

_MLA_ONLY = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
_GQA_ONLY = ("num_key_value_heads", "head_dim")


def shared_problems(recipe: Recipe) -> list[str]:
    """Every problem of `recipe` that every stage refuses, one line each (empty when the recipe is sound)."""
    problems: list[str] = []
    problems += _check_target(recipe)
    problems += _check_draft(recipe)
    problems += _check_stages(recipe)
    problems += stream_location_problems(recipe)
    return problems + output_dirs_creatable(recipe)


def _check_target(recipe: Recipe) -> list[str]:
    try:
        Target.of(recipe).local
    except DsparkError as exc:  # unknown, no config.json, a corrupt config or truncated weights
        return [f"target.model: {exc.message}" + (f" ({exc.hint})" if exc.hint else "")]
    problems = []
    config = Target.of(recipe).config()
    if config is not None:
        for key in ("hidden_size", "vocab_size", "num_hidden_layers"):
            declared = getattr(recipe.target, key)
            if declared is not None and config.get(key) not in (None, declared):
                problems.append(
                    f"target.{key}: declared {declared} but the target's config.json says {config[key]}; "
                    "remove the declaration or fix it"
                )
    return problems


def _check_draft(recipe: Recipe) -> list[str]:
    draft = recipe.draft
    problems = []
    arch = Target.of(recipe).draft_arch(recipe.draft.arch)
    wrong_family = _GQA_ONLY if arch == "mla" else _MLA_ONLY if arch == "gqa" else ()
    for key in wrong_family:
        if getattr(draft, key) is not None:
            problems.append(
                f"draft.{key}: only for {'gqa' if arch == 'mla' else 'mla'} drafts, this one is {arch}; remove it"
            )
    ids = draft.target_layer_ids
    if ids is not None:
        if not ids:
            problems.append(
                "draft.target_layer_ids: empty; list the target layers to read, or remove it for the default"
            )
        elif any(i < 0 for i in ids):
            problems.append("draft.target_layer_ids: layer ids are 0-based and non-negative")
        elif sorted(set(ids)) != ids:
            problems.append(f"draft.target_layer_ids: must be unique and increasing, got {ids}")
        depth = Target.of(recipe).geometry(strict=False).num_hidden_layers
        if ids and depth is not None and max(ids) >= depth:
            problems.append(
                f"draft.target_layer_ids: layer {max(ids)} is beyond the target's {depth} layers "
                f"(0-based: 0..{depth - 1}); output of layer k is transformers hidden_states[k+1]"
            )
    vocab = Target.of(recipe).geometry(strict=False).vocab_size
    if draft.mask_token_id is not None and vocab is not None and draft.mask_token_id >= vocab:
        problems.append(f"draft.mask_token_id: {draft.mask_token_id} is outside the target vocabulary ({vocab})")
    return problems


def _check_lr_scale(recipe: Recipe) -> list[str]:
    """`train.lr_scale` names under the draft's top-level modules (the full names are checked on the model)."""
    if not recipe.train.lr_scale:
        return []
    arch = Target.of(recipe).draft_arch(recipe.draft.arch)  # None: the target's type is not known here
    top = list(
        dict.fromkeys(
            name for a in ([arch] if arch else ["gqa", "mla"]) for name in top_modules(a, recipe.draft.confidence_head)
        )
    )
    unknown = [k for k in recipe.train.lr_scale if k.split(".")[0] not in top]
    if not unknown:
        return []
    return [
        f"train.lr_scale: {', '.join(unknown)} is not a module of this {arch or 'gqa or mla'} draft; "
        f"name one of {', '.join(top)} (or one under it, dotted, e.g. layers.0.mlp)"
    ]


def _check_stages(recipe: Recipe) -> list[str]:
    problems = []
    datagen, serve, train = recipe.datagen, recipe.serve, recipe.train
    if datagen.endpoint and datagen.engine == "hf":
        problems.append(
            "datagen.endpoint: only used with datagen.engine: vllm (or auto); set the engine or remove the endpoint"
        )
    if datagen.min_prompt_tokens > datagen.max_prompt_tokens:
        problems.append("datagen.min_prompt_tokens: larger than datagen.max_prompt_tokens")
    if serve.num_speculative_tokens is not None and serve.num_speculative_tokens != recipe.draft.block_size:
        problems.append(
            f"serve.num_speculative_tokens: {serve.num_speculative_tokens} differs from draft.block_size "
            f"{recipe.draft.block_size}, the block the draft is trained on; remove it or make them equal"
        )
    if serve.enable_adaptive_verification and not recipe.draft.confidence_head:
        problems.append("serve.enable_adaptive_verification: needs draft.confidence_head: true")
    if train.loss.slot_weighting == "expected_length" and not recipe.draft.confidence_head:
        problems.append(
            "train.loss.slot_weighting: expected_length reads the confidence head's estimates; "
            "set draft.confidence_head: true or use slot_weighting: decay"
        )
    problems += _check_lr_scale(recipe)
    if (
        serve.attention_backend
        and "MLA" in serve.attention_backend.upper()
        and Target.of(recipe).draft_arch(recipe.draft.arch) == "gqa"
    ):
        problems.append(f"serve.attention_backend: {serve.attention_backend} is for MLA drafts, this draft is gqa")
    if train.nnodes > 1 and not train.rdzv_endpoint:
        problems.append("train.rdzv_endpoint: required when train.nnodes > 1 (host:port of the rendezvous)")
    if "wandb" in train.metrics and not train.wandb_project:
        problems.append("train.wandb_project: required when train.metrics includes wandb")
    if recipe.capture.max_seq_len > recipe.target.max_model_len:
        problems.append(
            f"capture.max_seq_len: {recipe.capture.max_seq_len} exceeds target.max_model_len "
            f"{recipe.target.max_model_len}, the longest sequence the target runs; lower it or raise max_model_len"
        )
    if train.max_seq_len > recipe.target.max_model_len:
        problems.append(
            f"train.max_seq_len: {train.max_seq_len} exceeds target.max_model_len {recipe.target.max_model_len}"
        )
    if recipe.publish.repo_id is not None:
        from dspark_cli.hubrules import repo_id_problem

        problem = repo_id_problem(recipe.publish.repo_id)
        if problem:
            problems.append(f"publish.repo_id: {problem}")
    if any(t < 0 for t in recipe.bench.temperatures):
        problems.append("bench.temperatures: temperatures are >= 0")
    return problems
