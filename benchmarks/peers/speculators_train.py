"""Train a DSpark draft with speculators 0.9.0 on CPU from offline features; run inside its own venv.

    benchmarks/peers/.venv-speculators/bin/python benchmarks/peers/speculators_train.py \
        --data DIR --target TARGET_DIR --out OUT --steps 160 --total-seq-len 2048 --max-anchors 1184 ...

`run.py` calls this; it is not meant to be run by hand. speculators' own entry point
(`speculators.train.cli.main(TrainConfig.resolve(argv))`, what `speculators train` runs) with:
- config only: `--draft-attn-impl sdpa` (flex attention is for GPUs), `--hidden-states-dtype float32`,
  `--num-workers 0`, `--loss-implementation eager` (its fused losses need Triton: "RuntimeError: Fused
  losses require Triton"), `--optimizer adamw` (its default is Muon), `--scheduler-type cosine` (with `--cosine-cycles`
  as its `--scheduler-num-cosine-cycles`: run.py's choice ends the cosine at dspark's floor),
  `--on-missing raise` (never ask a vLLM server for missing features).
- a runtime patch of two names, no file edited (`--no-cpu-patch` shows the error without it): its Trainer
  moves the model and every batch to `get_local_rank()` (the integer 0, an accelerator index), so on a
  machine without one `self.model.to(self.local_rank)` raises "RuntimeError: Cannot access accelerator
  device when none is available." (trainer.py, setup_model), and its per-step timer calls
  `torch.accelerator.synchronize()`, which raises the same. The patch makes the trainer module's
  `get_local_rank` return "cpu" and `torch.accelerator.synchronize` a no-op (nothing to wait for on a
  CPU). The smallest source patch: in speculators/train/trainer.py, `"cpu"` for the device when
  `torch.accelerator.is_available()` is false, and the timer's synchronize under the same test.
Its `--max-steps` ends an epoch early but not the run (each later epoch trains one more step, for
`--epochs` epochs); the wrapper stops the run after the epoch in which `--max-steps` is reached.
Instrumentation only: every optimizer step appends {step, time, tokens, loss} to OUT/log.jsonl (tokens:
the packed batch's real tokens), and at the end the trained float32 weights go to
OUT/draft.safetensors (its checkpoints are saved in bfloat16) with its config in OUT/config.json.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("data", "target", "out"):
        parser.add_argument(f"--{name}", required=True)
    parser.add_argument("--layer-ids", required=True, help="comma-separated, speculators' convention")
    for name, kind, default in (
        ("steps", int, 160),
        ("total-seq-len", int, 2048),
        ("max-anchors", int, 1024),
        ("lr", float, 3e-3),
        ("warmup-steps", int, 8),
        ("block-size", int, 7),
        ("markov-rank", int, 64),
        ("num-layers", int, 2),
        ("gamma", float, 4.0),
        ("ce", float, 0.5),
        ("tv", float, 1.0),
        ("confidence", float, 1.0),
        ("seed", int, 0),
        ("mask-token-id", int, 0),
        ("train-ratio", float, 0.99),
        ("weight-decay", float, 0.0),
        ("cosine-cycles", float, 0.5),
    ):
        parser.add_argument(f"--{name}", type=kind, default=default)
    parser.add_argument("--no-cpu-patch", action="store_true")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    import speculators.train.trainer as trainer_mod
    import torch
    from safetensors.torch import save_file
    from speculators.train import data as data_mod
    from speculators.train.cli import main as speculators_main
    from speculators.train.config import TrainConfig

    if not args.no_cpu_patch and not torch.accelerator.is_available():
        trainer_mod.get_local_rank = lambda: "cpu"
        torch.accelerator.synchronize = lambda *a, **k: None  # its step timer syncs the accelerator
    log = (out / "log.jsonl").open("w")
    last_tokens = [0]
    collate = data_mod.CollateFn.__call__

    def counting_collate(self, batch):
        result = collate(self, batch)
        last_tokens[0] = int((result["document_ids"] >= 0).sum())
        return result

    data_mod.CollateFn.__call__ = counting_collate
    state: dict = {}

    class StepLog(logging.Handler):
        """speculators logs one metrics dict per step (log_freq 1) to "speculators.metrics"."""

        def emit(self, record: logging.LogRecord) -> None:
            if isinstance(record.msg, dict) and "train" in record.msg:
                log.write(
                    json.dumps(
                        {
                            "step": record.msg["global_step"] + 1,
                            "time": time.time(),
                            "tokens": last_tokens[0],
                            "loss": record.msg["train"].get("loss"),
                        }
                    )
                    + "\n"
                )
                log.flush()

    run_training, train_epoch = trainer_mod.Trainer.run_training, trainer_mod.Trainer.train_epoch

    class Done(Exception):
        pass

    def keep_trainer(self):
        state["trainer"] = self
        logging.getLogger("speculators.metrics").addHandler(StepLog())  # after its own logger setup
        try:
            return run_training(self)
        except Done:
            return None

    def stop_at_max_steps(self, epoch, **kwargs):
        # its --max-steps ends the epoch but not the run: the next epoch trains one more step, and so
        # on for --epochs epochs; this ends the run where --max-steps says
        train_epoch(self, epoch, **kwargs)
        if self.config.max_steps is not None and self.global_step >= self.config.max_steps:
            self.maybe_save_checkpoint(epoch)
            raise Done

    trainer_mod.Trainer.run_training = keep_trainer
    trainer_mod.Trainer.train_epoch = stop_at_max_steps
    argv = [
        "--speculator-type",
        "dspark",
        "--verifier-name-or-path",
        args.target,
        "--data-path",
        args.data,
        "--save-path",
        str(out / "checkpoints"),
        "--log-dir",
        str(out / "logs"),
        "--num-layers",
        str(args.num_layers),
        "--draft-arch",
        "qwen3",
        "--target-layer-ids",
        *args.layer_ids.split(","),
        "--mask-token-id",
        str(args.mask_token_id),
        "--block-size",
        str(args.block_size),
        "--markov-rank",
        str(args.markov_rank),
        "--max-anchors",
        str(args.max_anchors),
        "--total-seq-len",
        str(args.total_seq_len),
        "--train-data-ratio",
        str(args.train_ratio),
        "--hidden-states-dtype",
        "float32",
        "--draft-attn-impl",
        "sdpa",
        "--num-workers",
        "0",
        "--on-missing",
        "raise",
        "--loss-implementation",
        "eager",
        "--optimizer",
        "adamw",
        "--lr",
        str(args.lr),
        "--weight-decay",
        str(args.weight_decay),
        "--scheduler-type",
        "cosine",
        "--scheduler-warmup-steps",
        str(args.warmup_steps),
        "--scheduler-total-steps",
        str(args.steps),
        "--scheduler-num-cosine-cycles",
        str(args.cosine_cycles),
        "--max-steps",
        str(args.steps),
        "--epochs",
        "100000",
        "--loss-fn",
        json.dumps({"ce": args.ce, "tv": args.tv}),
        "--confidence-head-alpha",
        str(args.confidence),
        "--dflash-decay-gamma",
        str(args.gamma),
        "--per-position-loss-weight",
        "fixed-exp-decay",
        "--seed",
        str(args.seed),
        "--no-resume-from-checkpoint",
        "--log-freq",
        "1",
    ]
    (out / "argv.json").write_text(json.dumps(argv))
    started = time.time()
    speculators_main(TrainConfig.resolve(argv))
    wall = time.time() - started
    model = state["trainer"].model
    model = getattr(model, "module", model)
    skip = set(getattr(model, "_keys_to_ignore_on_save", [])) | {"t2d", "d2t"}
    tensors = {k: v.detach().float().contiguous() for k, v in model.state_dict().items() if k not in skip}
    save_file(tensors, str(out / "draft.safetensors"))
    (out / "config.json").write_text(model.config.to_json_string())
    (out / "summary.json").write_text(
        json.dumps(
            {
                "wall_s": wall,
                "global_step": state["trainer"].global_step,
                "speculators": __import__("importlib.metadata").metadata.version("speculators"),
                "torch": torch.__version__,
                "threads": torch.get_num_threads(),
                "pid": os.getpid(),
            },
            indent=2,
        )
    )
    log.close()
    sys.exit(0)


if __name__ == "__main__":
    main()
