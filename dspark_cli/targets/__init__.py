"""Targets: the model a draft is trained for, asked in one place by every stage.

    from dspark_cli.targets import Target, resolve_target, ChatFormat
    target = Target.of(recipe)         # location, config, geometry, tokenizer, stop ids, embeddings, model
    resolve_target("tiny-gqa")         # bundled name / local dir -> Path, hub id -> None

- registry.py  bundled tiny targets by name, local paths, hub ids (`resolve_target`);
- files.py     a local target's config.json and safetensors headers, read with one-line errors;
- target.py    `Target`, a recipe's target: location, directory, config, geometry, draft arch, tokenizer,
               mask token, stop ids, embeddings and the transformers model;
- weights.py   its frozen embed_tokens / lm_head, read from the safetensors without loading the model;
- chat.py      `ChatFormat`: the target's chat template as serving applies it (each render bounded in
               time and output), loss masks;
- deadline.py  `within(seconds, call)`: a call stopped with `Overtime` after N seconds;
- tiny/        the shipped tiny targets (weights, tokenizer, card); tools/tiny_targets/ builds them.

Import-light: nothing here imports torch, transformers or vllm at import time.
"""

from dspark_cli.targets.chat import ChatFormat
from dspark_cli.targets.registry import BUNDLED_TARGETS, TINY_DIR, is_hub_id, resolve_target
from dspark_cli.targets.target import Target, TargetGeometry

__all__ = ["BUNDLED_TARGETS", "TINY_DIR", "ChatFormat", "Target", "TargetGeometry", "is_hub_id", "resolve_target"]
