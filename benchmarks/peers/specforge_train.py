"""Train a DSpark draft with SpecForge 0.2.0 on CPU from offline features; run inside its own venv.

    benchmarks/peers/.venv-specforge/bin/python benchmarks/peers/specforge_train.py \
        --features DIR --target TARGET_DIR --draft-config draft.json --out OUT --steps 300 --batch-size 51 ...

`run.py` calls this; it is not meant to be run by hand. SpecForge's own entry point
(`specforge.cli.main(["train", "-c", run.yaml])`) runs with config changes only:
`training.fsdp_sharding: NO_SHARD`, `training.attention_backend: sdpa`, `model.torch_dtype: float32`
(the features are float32 too: SpecForge wants them in the model dtype). No SpecForge file is edited.
Writes OUT/run.yaml, OUT/log.jsonl (one record per step: SpecForge's metrics + wall time) and
OUT/draft.safetensors (the draft's trained tensors under SpecForge's names).
"""

from __future__ import annotations

import argparse
import ast
import io
import json
import os
import re
import sys
import time
from pathlib import Path


def write_config(args: argparse.Namespace, out: Path) -> Path:
    import yaml

    config = {
        "model": {
            "target_model_path": args.target,
            "draft_model_config": args.draft_config,
            "torch_dtype": "float32",
            "mask_token_id": args.mask_token_id,
        },
        "data": {"hidden_states_path": args.features, "max_length": args.max_length, "dataloader_num_workers": 0},
        "training": {
            "strategy": "dspark",
            "max_steps": args.steps,
            "total_steps": args.steps,
            "num_epochs": 100000,
            "batch_size": args.batch_size,
            "fsdp_sharding": "NO_SHARD",
            "attention_backend": "sdpa",
            "learning_rate": args.lr,
            "lr_scheduler": "cosine",
            "warmup_ratio": args.warmup_steps / args.steps,
            "max_grad_norm": args.grad_clip,
            "num_anchors": args.num_anchors,
            "loss_decay_gamma": args.gamma,
            "dspark_ce_loss_alpha": args.ce,
            "dspark_l1_loss_alpha": args.l1,
            "dspark_confidence_head_alpha": args.confidence,
            "log_interval": 1,
            "save_interval": 0,
            "seed": args.seed,
        },
        "output_dir": str(out / "checkpoints"),
    }
    path = out / "run.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


class StepLog(io.TextIOBase):
    """SpecForge prints `step N: {metrics}` once per step (log_interval 1) to stdout; this tee keeps
    them, with a wall clock, in log.jsonl and passes everything through."""

    pattern = re.compile(r"^step (\d+): (\{.*\})$")

    def __init__(self, path: Path, stream) -> None:
        self.file, self.stream, self.pending = path.open("w"), stream, ""

    def write(self, text: str) -> int:
        self.stream.write(text)
        self.pending += text
        *lines, self.pending = self.pending.split("\n")
        for line in lines:
            match = self.pattern.match(line)
            if match:
                metrics = ast.literal_eval(match.group(2))
                self.file.write(json.dumps({"step": int(match.group(1)), "time": time.time(), **metrics}) + "\n")
                self.file.flush()
        return len(text)

    def flush(self) -> None:
        self.stream.flush()


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("features", "target", "draft-config", "out"):
        parser.add_argument(f"--{name}", required=True)
    for name, kind, default in (
        ("steps", int, 300),
        ("batch-size", int, 1),
        ("lr", float, 1e-3),
        ("warmup-steps", int, 20),
        ("grad-clip", float, 1.0),
        ("num-anchors", int, 32),
        ("gamma", float, 4.0),
        ("ce", float, 0.1),
        ("l1", float, 0.9),
        ("confidence", float, 1.0),
        ("seed", int, 0),
        ("max-length", int, 512),
        ("mask-token-id", int, 0),
        ("threads", int, 0),
    ):
        parser.add_argument(f"--{name}", type=kind, default=default)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    config = write_config(args, out)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    sys.stdout = StepLog(out / "log.jsonl", sys.stdout)
    from specforge.cli import main as specforge_main

    started = time.time()
    rc = specforge_main(["train", "-c", str(config)])
    wall = time.time() - started
    if rc:
        raise SystemExit(f"specforge train exited {rc}")
    checkpoints = sorted((out / "checkpoints").glob("*-step*"), key=lambda p: int(p.name.rsplit("step", 1)[1]))
    state = torch.load(checkpoints[-1] / "training_state.pt", map_location="cpu", weights_only=False)
    from safetensors.torch import save_file

    tensors = {k: v.detach().float().contiguous() for k, v in state["draft_state_dict"].items()}
    save_file(tensors, str(out / "draft.safetensors"))
    (out / "summary.json").write_text(
        json.dumps(
            {
                "wall_s": wall,
                "global_step": state["global_step"],
                "checkpoint": str(checkpoints[-1]),
                "batch_size": state["batch_size"],
                "dataset_size": state["dataset_size"],
                "specforge": __import__("importlib.metadata").metadata.version("specforge"),
                "torch": torch.__version__,
                "threads": torch.get_num_threads(),
                "pid": os.getpid(),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
