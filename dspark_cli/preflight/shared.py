"""Shared rules: what every stage refuses, from the whole recipe and its target (run first by `preflight`).

    shared_problems(recipe)     # [] or one line per problem: "key: what is wrong; the fix"

Field-level problems (types, ranges, unknown keys) are caught while loading (`recipe/`); these are the
problems only visible with the whole recipe in view, e.g. layer ids beyond the target's depth, two
fields that contradict each other, an output directory that cannot be made.
"""

from __future__ import annotations

import difflib
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
    """Every `train.lr_scale` name resolved against the draft the recipe describes: a top-level module from
    the arch alone (draft/names.py), `layers.N` against `draft.num_layers`, and a name deeper than that
    against the draft itself, built on the meta device (no memory; torch is imported only then). Where the
    draft cannot be built here (a hub target not downloaded, no declared geometry), a deeper name is left
    to training (training/session.py `lr_groups`)."""
    scales = recipe.train.lr_scale
    if not scales:
        return []
    arch = Target.of(recipe).draft_arch(recipe.draft.arch)  # None: the target's type is not known here
    top = list(
        dict.fromkeys(
            name for a in ([arch] if arch else ["gqa", "mla"]) for name in top_modules(a, recipe.draft.confidence_head)
        )
    )
    layers = [f"layers.{i}" for i in range(recipe.draft.num_layers)]
    shallow = set(top) | set(layers)
    deep = [k for k in scales if k not in shallow and k.split(".")[0] in top and _under_a_layer(k, layers)]
    names = _draft_module_names(recipe) if deep else None
    known = names if names is not None else [*top, *layers]
    problems = []
    for key in scales:
        if key in shallow or (names is not None and key in names) or (names is None and key in deep):
            continue
        close = difflib.get_close_matches(key, known, n=3, cutoff=0.6)
        problems.append(
            f"train.lr_scale: {key} is not a module of this {arch or 'gqa or mla'} draft; name one of "
            f"{', '.join(top)} or one under it, dotted (layers.0 to layers.{recipe.draft.num_layers - 1}, e.g. "
            f"layers.0.mlp)" + (f"; did you mean {', '.join(close)}?" if close else "")
        )
    return problems


def _under_a_layer(key: str, layers: list[str]) -> bool:
    """`key` is under a top-level module other than `layers`, or under one of the draft's layers."""
    return not key.startswith("layers.") or any(key.startswith(layer + ".") for layer in layers)


def _draft_module_names(recipe: Recipe) -> list[str] | None:
    """Every module name of the draft `recipe` describes (as `lr_groups` sees them), from a meta-device
    build; None when the draft cannot be built here (no target geometry, or a draft export's rule refuses)."""
    target = Target.of(recipe)
    config = target.config()
    declared = recipe.target.model_dump()
    if config is None and not all(declared.get(k) for k in ("hidden_size", "vocab_size", "num_hidden_layers")):
        return None
    from dspark_cli.draft.build import draft_config_from_recipe
    from dspark_cli.draft.model import meta_model

    draft = recipe.draft.model_dump()
    if draft.get("mask_token_id") is None:
        draft["mask_token_id"] = 0  # a placeholder (training takes the tokenizer's): no module depends on it
    try:
        built = draft_config_from_recipe(draft, declared, config)
    except DsparkError:
        return None  # a draft that cannot be built is export_config_loads_in_vllm's line (rules.py)
    return [name for name, _ in meta_model(built).named_modules() if name]


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
    if train.init == "pretrained" and not train.init_from:
        problems.append("train.init: pretrained starts from a draft's weights; set train.init_from=DRAFT_DIR")
    if train.init_from and train.init != "pretrained":
        problems.append(
            f"train.init_from: only read with train.init: pretrained (this recipe: {train.init}); "
            "set train.init=pretrained, or remove train.init_from"
        )
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
