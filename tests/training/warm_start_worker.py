"""One rank of the warm-start check: build the training module from `train.init_from` as a session does,
gather its full draft state dict (FSDP2 shards it on 2 ranks) and compare it with the source's weights.

    .venv/bin/python -m torch.distributed.run --standalone --nproc-per-node 2 \\
        tests/training/warm_start_worker.py WORKDIR SOURCE_DIR

Prints one JSON line on rank 0: {"world_size", "tensors", "equal"} (`equal`: every tensor torch.equal to
the source's, cast to the parameter's dtype).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(workdir: Path, source: Path) -> None:
    import torch
    import train_fixtures
    from safetensors.torch import load_file
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    from dspark_cli.training.distributed import init_distributed, shutdown
    from dspark_cli.training.run import recipe_draft_config
    from dspark_cli.training.session import build_step_module
    from dspark_cli.training.warm_start import load_warm_start

    torch.set_num_threads(1)
    env = init_distributed()
    try:
        recipe = train_fixtures.tiny_recipe(workdir, ["train.init=pretrained", f"train.init_from={source}"])
        config = recipe_draft_config(recipe)
        warm = load_warm_start(recipe, config, workdir / "run" / "train")
        module = build_step_module(recipe, config, env, torch.float32, warm=warm)
        full = get_model_state_dict(module.draft, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if env.is_main:
            want = load_file(str(source / "model.safetensors"))
            equal = sorted(full) == sorted(want) and all(torch.equal(full[k], want[k].to(full[k].dtype)) for k in want)
            print(json.dumps({"world_size": env.world_size, "tensors": len(full), "equal": equal}), flush=True)
    finally:
        shutdown(env, failed=False)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
