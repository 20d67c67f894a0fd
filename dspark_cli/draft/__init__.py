"""The DSpark draft model (MLA and GQA backbones), drafting exactly as vLLM 0.33 does.

Importing this package is free: torch and transformers load only with the submodules.

- config.py    `DSparkDraftConfig` (validated at construction), `vllm_config_dict` (the
               config.json vLLM loads)
- build.py     `draft_config_from_recipe`, `draft_config_from_target`, `draft_config_from_values`
- model.py     `DSparkDraftModel`: vLLM checkpoint names, many-anchor training forward
- drafting.py  `ContextCache` + `draft_block`: one block per request from cached context K/V
- names.py     the module names per arch, torch-free (preflight checks `train.lr_scale` with them)
- mla.py, gqa.py, heads.py, layers.py, attention.py: the pieces

Numerics are checked against tests/reference/dspark_reference.py, a slow explicit
re-implementation of vLLM's drafting step; the exported tensor roster (`export/roster.py`)
against tests/reference/vllm_rosters.py.
"""
