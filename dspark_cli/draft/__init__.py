"""The DSpark draft model (MLA and GQA backbones), drafting exactly as vLLM 0.33 does.

Importing this package is free: torch and transformers load only with the submodules.

- config.py    `DSparkDraftConfig`, `draft_config_from_target`, `draft_config_from_values`,
               `vllm_config_dict` (the config.json vLLM loads)
- model.py     `DSparkDraftModel`: vLLM checkpoint names, many-anchor training forward
- drafting.py  `ContextCache` + `draft_block`: one block per request from cached context K/V
- roster.py    `tensor_roster`: name / shape / dtype of every exported tensor (meta device)
- mla.py, gqa.py, heads.py, layers.py, attention.py: the pieces

Numerics are checked against tests/reference/dspark_reference.py, a slow explicit
re-implementation of vLLM's drafting step; rosters against tests/reference/vllm_rosters.py.
"""
