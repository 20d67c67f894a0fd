"""`dspark train`: DSpark draft training with FSDP2, crash-safe resume and live acceptance metrics.

Importing this package is free (no torch); the pieces import it themselves.

    .venv/bin/dspark train templates/recipes/tiny.yaml                 # one process
    .venv/bin/dspark train templates/recipes/tiny.yaml --nproc 2       # torchrun, FSDP2 on gloo
    .venv/bin/dspark train templates/recipes/tiny.yaml --dry-run       # the plan, nothing written

- plan.py        steps, tokens and sequences per step from the data's lengths (no torch)
- data.py        captured sequences -> prepared examples, seeded anchors, packed steps, rank split
- loss.py        the DSpark objective with a fused, chunked vocabulary pass (CE + L1 + their gradients)
- metrics.py     per-slot accuracy, expected acceptance length (tau, greedy and T=1), sinks
- flops.py       model FLOPs per step (for MFU)
- shapes.py      static batch shapes (length buckets) for compiled kernels; shape and compile counts
- step.py        `TrainStep`: the draft plus its loss as one module (what FSDP2 wraps); anchor rows
- distributed.py process groups, FSDP2 `fully_shard`, the torchrun command line
- checkpoint.py  DCP checkpoints written atomically, `latest` pointer, contract check on resume
- loop.py        `train_step` and the training loop (schedule, clipping, logging, checkpoints)
- session.py     one process's session: build, resume, loop, final draft and manifest
- run.py         `run_train(recipe, resume=...)` (the CLI calls this) and `plan_train` (--dry-run)
- launch.py      train here or start torchrun (`--nproc N`), thread binding first (no torch)
- __main__.py    one torchrun rank: `python -m dspark_cli.training RECIPE ...` (what torchrun's children run)
- cpu.py         host settings for CPU training: allocator, OpenMP thread binding
- evaluate.py    `evaluate_draft`: the same metrics for any draft on captured sequences, no training

Output layout under `recipe.stage_dir("train")`:
`checkpoints/step-NNNNNN/` (DCP + meta.json) and `checkpoints/latest`, `metrics.jsonl`,
`recipe.yaml`, `manifest.json`, and `final/model.safetensors` + `final/config.json` (a plain
consolidated draft in vLLM's names, loadable without torch.distributed). It is read back (manifest,
`latest`, meta.json, checksums.json) by `dspark_cli.artifacts.train`.
"""
