"""`dspark datagen`: regenerate every assistant turn with the target itself, resumably.

    from dspark_cli.datagen import plan_datagen, run_datagen
    run_datagen(load_recipe("tiny"))      # runs/tiny/data/shard-*.jsonl + manifest.json

- run.py      the stage: plan (read + filter the sources), regenerate turn by turn, write shards
- engines.py  the generators: transformers (`hf`), vLLM in process, an OpenAI-compatible endpoint
- filters.py  dedup, prompt-length bounds, turn limits, evaluation prompts kept out (eval_sets/)

Prompt sources and conversation formats are `dspark_cli.prompts` (bench reads them too); the
output is read back by `dspark_cli.artifacts.datagen`. Importing this package is free (no torch).
"""

from __future__ import annotations

from typing import Any

_EXPORTS = {"plan_datagen": "dspark_cli.datagen.run", "run_datagen": "dspark_cli.datagen.run"}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'dspark_cli.datagen' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_EXPORTS[name]), name)
