"""Targets: the model a draft is trained for. Bundled tiny trained targets and name resolution.

    python -c "from dspark_cli.targets import BUNDLED_TARGETS, resolve_target; print(resolve_target('tiny-gqa'))"

Import-light: nothing here imports torch, transformers or vllm (see registry.py); the builders
(`build_tiny`, `corpus`, `tokenizer`, `train_tiny`, `eval_tiny`) import them inside their functions.
"""

from dspark_cli.targets.registry import BUNDLED_TARGETS, TINY_DIR, is_hub_id, resolve_target

__all__ = ["BUNDLED_TARGETS", "TINY_DIR", "is_hub_id", "resolve_target"]
