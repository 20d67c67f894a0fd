"""`dspark train`: DSpark draft training with FSDP2, crash-safe resume and live acceptance metrics.

Importing this package is free (no torch); its names import their modules on first use.

    .venv/bin/dspark train templates/recipes/tiny.yaml                 # one process
    .venv/bin/dspark train templates/recipes/tiny.yaml --nproc 2       # torchrun, FSDP2 on gloo
    .venv/bin/dspark train templates/recipes/tiny.yaml --dry-run       # the plan, nothing written

    from dspark_cli.training import train
    summary = train(recipe, resume="auto", on_log=print)   # what `dspark train` and `dspark run` call

- plan.py          steps, tokens and sequences per step from the data's lengths (no torch)
- data.py          captured sequences -> prepared examples, seeded anchors, packed steps, rank split
- loss.py          the DSpark objective with a fused, chunked vocabulary pass (CE + L1 + their gradients)
- metrics.py       per-slot accuracy, expected acceptance length (tau, greedy and T=1), sinks
- flops.py         model FLOPs per step (for MFU)
- shapes.py        static batch shapes (length buckets) for compiled kernels; shape and compile counts
- step.py          `TrainStep`: the draft plus its loss as one module (what FSDP2 wraps); anchor rows
- distributed.py   process groups, FSDP2 `fully_shard`, the torchrun command line
- checkpoint.py    DCP checkpoints written atomically, `latest` pointer, contract check on resume
- integrity.py     checkpoint checksums, loading that runs no code
- settings.py      which settings make a training result (a checkpoint of other settings is refused)
- loop.py          `train_step` and the training loop (schedule, clipping, logging, checkpoints)
- session.py       `TrainRun` (what makes one session) and `train_session`: build, resume, loop, final draft, manifest
- stream_plan.py   the online stream's step plan and its bounds (no torch; preflight checks them)
- stream_source.py the online stream's rank side: this rank's share of each step
- run.py           `run_train(recipe, resume=...)`: training on this process (one process or one rank);
                   `plan_train` (--dry-run)
- launch.py        `train`, the one entry: capture first, then train here or start torchrun (no torch)
- slurm.py         the online run's Slurm job script (`dspark init --slurm`)
- __main__.py      one torchrun rank: `python -m dspark_cli.training RECIPE ...` (what torchrun's children run)
- evaluate.py      `evaluate_draft`: the same metrics for any draft on captured sequences, no training
- validation.py    validation during training: the held-out split's acceptance, `best/`, early stopping
- warm_start.py    `train.init: pretrained`: another draft's weights as the start, its geometry checked

Output layout under `recipe.stage_dir("train")`:
`checkpoints/step-NNNNNN/` (DCP + meta.json) and `checkpoints/latest`, `metrics.jsonl`,
`recipe.yaml`, `manifest.json`, and `final/model.safetensors` + `final/config.json` (a plain
consolidated draft in vLLM's names, loadable without torch.distributed), with a validation split
`best/` (the same at the best validation, validation.py). It is read back (manifest,
`latest`, meta.json, checksums.json) by `dspark_cli.artifacts.train`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dspark_cli.lazy import lazy_exports

_EXPORTS = {
    "train": "dspark_cli.training.launch",
    "is_main_process": "dspark_cli.training.launch",
    "plan_train": "dspark_cli.training.run",
    "plan_for_recipe": "dspark_cli.training.stream_plan",
    "bound_problem": "dspark_cli.training.stream_plan",
    "warm_start_mismatch": "dspark_cli.training.run",
}

if TYPE_CHECKING:  # what editors and type checkers follow; at run time lazy_exports imports on first use
    from dspark_cli.training.launch import is_main_process, train
    from dspark_cli.training.run import plan_train, warm_start_mismatch
    from dspark_cli.training.stream_plan import bound_problem, plan_for_recipe

__all__ = sorted(_EXPORTS)

if not TYPE_CHECKING:  # hidden from type checkers, which would read any name missing above as Any
    __getattr__ = lazy_exports(__name__, _EXPORTS)
