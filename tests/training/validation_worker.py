"""One process (or torchrun rank) of a training run with a validation split, on the train_fixtures target.

    .venv/bin/python tests/training/validation_worker.py WORKDIR train.validate_every=2
    .venv/bin/python -m torch.distributed.run --standalone --nproc-per-node 2 \\
        tests/training/validation_worker.py WORKDIR train.validate_every=2        # FSDP2 on gloo

Trains on 16 fixture sequences (seed 0) and validates on 7 others of mixed lengths (seed 1, `--vary`), so
the two ranks' shares differ in size and one rank runs an empty forward. Rank 0 prints every record (steps
and validations) as one JSON line each, then {"summary": ...}.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str]) -> int:
    import torch
    import train_fixtures

    from dspark_cli.training.run import run_train

    torch.set_num_threads(1)
    workdir = Path(argv[0])
    train_fixtures.make_target(workdir / "target")
    recipe = train_fixtures.tiny_recipe(workdir, [a for a in argv[1:] if "=" in a])
    train = train_fixtures.make_sequences(workdir / "target", num=16, seed=0)
    held_out = train_fixtures.make_sequences(workdir / "target", num=7, seed=1, vary=True)
    summary = run_train(
        recipe,
        resume="auto",
        sequences=lambda: iter(train),
        validation=lambda: held_out,
        on_log=lambda record: print(json.dumps(record), flush=True),
    )
    if int(os.environ.get("RANK", 0)) == 0:
        print(json.dumps({"summary": summary.to_dict()}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
