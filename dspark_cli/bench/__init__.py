"""`dspark bench`: a reference speculative-decoding engine, online serving benchmarks, and the report.

Importing this package is free: torch and matplotlib load only with the submodules that need them.

    dspark bench runs/tiny/draft --offline                      # reference engine: tau, acceptance, sweep
    dspark bench --endpoint http://127.0.0.1:8000 bench.baseline_endpoint=http://127.0.0.1:8001

- verify.py    vLLM 0.33's verification: greedy, standard rejection sampling, block verification
               (Sun et al. 2024), top-p, confidence-scheduled prefixes
- engine.py    `SpeculativeEngine` over an `HFTarget` (transformers + KV cache + aux states) and a
               `DSparkDrafter` (draft/drafting.py): lossless speculative generation, one request at a time
- datasets.py  MT-Bench, SPEED-Bench, bundled sets, any prompt file or dataset (prompts/sources.py)
- offline.py   the engine over datasets x temperatures x confidence thresholds, baselines, context sweep
- baselines.py vLLM's n-gram (prompt lookup) proposer and the untrained draft, in the same engine
- calibration.py  the confidence head: reliability bins, ECE, Brier, AUC per draft position (no torch)
- adaptive.py  vLLM 0.33's adaptive verification (cost model, budget, survival top-k) across concurrency
- context.py   tau and acceptance binned by context length; the sweep's prompts for long conversations
- endpoint.py  streaming OpenAI client, concurrency sweep, vLLM /metrics counters, baseline speedups
- stats.py     tau and per-position acceptance with cluster-robust 95% intervals (no torch)
- report.py    bench.json, bench.md, terminal tables; plots.py the PNGs (matplotlib)
- run.py       `run_bench(recipe, draft_dir=..., offline=..., endpoint=...)`, what the CLI calls
"""
