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

from typing import TYPE_CHECKING

from dspark_cli.lazy import lazy_exports

_EXPORTS = {
    "plan_datagen": "dspark_cli.datagen.run",
    "run_datagen": "dspark_cli.datagen.run",
    "builtin_eval_sets": "dspark_cli.datagen.filters",
}

if TYPE_CHECKING:  # what editors and type checkers follow; at run time lazy_exports imports on first use
    from dspark_cli.datagen.filters import builtin_eval_sets
    from dspark_cli.datagen.run import plan_datagen, run_datagen

__all__ = sorted(_EXPORTS)

if not TYPE_CHECKING:  # hidden from type checkers, which would read any name missing above as Any
    __getattr__ = lazy_exports(__name__, _EXPORTS)
