"""Targets: the model a draft is trained for, asked in one place by every stage.

    from dspark_cli.targets import resolve_target, target_location, target_geometry, load_tokenizer, ChatFormat
    resolve_target("tiny-gqa")        # bundled name / local dir -> Path, hub id -> None

- registry.py  bundled tiny targets by name, local paths, hub ids (`resolve_target`);
- files.py     a local target's config.json and safetensors headers, read with one-line errors;
- target.py    a recipe's target: location, directory, config, geometry, tokenizer, mask token, and
               the transformers model (`load_causal_lm`);
- chat.py      `ChatFormat`: the target's chat template as serving applies it, loss masks;
- tiny/        the shipped tiny targets (weights, tokenizer, card); tools/tiny_targets/ builds them.

Import-light: nothing here imports torch, transformers or vllm at import time.
"""

from dspark_cli.targets.chat import ChatFormat
from dspark_cli.targets.registry import BUNDLED_TARGETS, TINY_DIR, is_hub_id, resolve_target
from dspark_cli.targets.target import (TargetGeometry, draft_arch, load_causal_lm, load_tokenizer, local_config,
                                       mask_token_id, stop_ids, target_config, target_directory, target_geometry,
                                       target_location)

__all__ = ["BUNDLED_TARGETS", "TINY_DIR", "ChatFormat", "TargetGeometry", "draft_arch", "is_hub_id",
           "load_causal_lm", "load_tokenizer", "local_config", "mask_token_id", "resolve_target", "stop_ids",
           "target_config", "target_directory", "target_geometry", "target_location"]
