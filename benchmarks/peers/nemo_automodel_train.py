"""Train a DSpark draft with NeMo AutoModel 0.7.0 on CPU from its offline cache; run inside its own venv.

    benchmarks/peers/.venv-nemo-automodel/bin/python benchmarks/peers/nemo_automodel_train.py \
        --cache DIR --target TARGET_DIR --out OUT --epochs 3 --batch-size 37 ...

`run.py` calls this; it is not meant to be run by hand. NeMo AutoModel's own DSpark recipe
(`nemo_automodel.recipes.llm.train_dspark.main(run.yaml)`, what its `automodel` launcher runs for a
DSpark config) from its offline cache (`recipe_args.cached_target_path`: the target is not loaded),
with config only: `dist_env.backend: gloo` (no NCCL on CPU; it then trains in float32, its CPU
compute dtype, which is why the cache is float32), `num_workers: 0`, `log_every_steps: 1`, and one
runtime setting, no file edited (`--no-cpu-patch` shows the error without it): its recipe only accepts
`attention_backend: flex_attention` for a Qwen3 target ("DSpark training requires
attention_backend='flex_attention'", train_dspark.py setup), and torch's FlexAttention has no backward
on CPU ("NotImplementedError: FlexAttention does not support backward on CPU. Please set the input
requires_grad to False or use another device."). Its Qwen3 draft builds a dense SDPA mask itself
(create_dflash_sdpa_mask) whenever its config's `_attn_implementation` is not flex_attention, so after
setup the wrapper sets the draft config's `_attn_implementation` to "sdpa". The smallest source patch:
accept "sdpa" in that check of recipes/llm/train_dspark.py. It has no step budget (it runs whole
epochs); with `--max-steps` the wrapper gives it one: its own warmup-cosine schedule
(make_warmup_cosine_schedule, warmup by its _resolve_warmup_steps) over max_steps, and the run ends after
max_steps optimizer steps (`--epochs` then just needs to cover them).
Instrumentation only (no NeMo file edited): every optimizer step appends {step, time, loss} to
OUT/log.jsonl (from the per-step metrics it writes to OUT/run/dspark_train_metrics.jsonl), and at the
end the trained float32 draft weights go to OUT/draft.safetensors with its draft config in
OUT/config.json.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path


def write_config(args: argparse.Namespace, out: Path) -> Path:
    import yaml

    config = {
        "recipe_args": {
            "target_model_name_or_path": args.target,
            "cached_target_path": args.cache,
            "seq_length": args.seq_length,
            "micro_batch_size": args.batch_size,
            "num_epochs": args.epochs,
            "output_dir": str(out / "run"),
            "draft_num_hidden_layers": args.num_layers,
            "target_layer_ids": [int(x) for x in args.layer_ids.split(",")],
            "block_size": args.block_size,
            "num_anchors": args.num_anchors,
            "mask_token_id": args.mask_token_id,
            "markov_rank": args.markov_rank,
            "markov_head_type": "vanilla",
            "confidence_head_alpha": args.confidence,
            "confidence_head_with_markov": True,
            "ce_loss_alpha": args.ce,
            "l1_loss_alpha": args.l1,
            "loss_decay_gamma": args.gamma,
            "max_grad_norm": args.grad_clip,
            "log_every_steps": 1,
            "shuffle_seed": args.seed,
            "num_workers": 0,
            "attention_backend": "flex_attention",
        },
        "optimizer": {
            "lr": args.lr,
            "betas": [args.beta1, args.beta2],
            "weight_decay": args.weight_decay,
            "warmup_ratio": args.warmup_ratio,
            "min_lr_ratio": args.min_lr_ratio,
        },
        "dist_env": {"backend": "gloo"},
    }
    path = out / "run.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("cache", "target", "out", "layer-ids"):
        parser.add_argument(f"--{name}", required=True)
    for name, kind, default in (
        ("epochs", int, 1),
        ("batch-size", int, 1),
        ("seq-length", int, 512),
        ("lr", float, 3e-3),
        ("beta1", float, 0.9),
        ("beta2", float, 0.999),
        ("weight-decay", float, 0.0),
        ("warmup-ratio", float, 0.05),
        ("min-lr-ratio", float, 0.1),
        ("grad-clip", float, 1.0),
        ("num-anchors", int, 32),
        ("block-size", int, 7),
        ("markov-rank", int, 64),
        ("num-layers", int, 2),
        ("gamma", float, 4.0),
        ("ce", float, 0.5),
        ("l1", float, 0.5),
        ("confidence", float, 1.0),
        ("seed", int, 0),
        ("mask-token-id", int, 0),
        ("max-steps", int, 0),
    ):
        parser.add_argument(f"--{name}", type=kind, default=default)
    parser.add_argument("--no-cpu-patch", action="store_true")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    config = write_config(args, out)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("LOCAL_RANK", "0")
    import torch
    from nemo_automodel.components.config._arg_parser import parse_args_and_load_config
    from nemo_automodel.recipes.llm.train_dspark import TrainDSparkRecipe
    from safetensors.torch import save_file

    cfg = parse_args_and_load_config(str(config), argv=["--config", str(config)])
    recipe = TrainDSparkRecipe(cfg)
    recipe.setup()
    if not args.no_cpu_patch and not torch.cuda.is_available():
        # its Qwen3 draft builds a dense SDPA mask itself when not on flex attention; see the docstring
        for module in recipe.draft_model.modules():
            config = getattr(module, "config", None)
            if config is not None and getattr(config, "_attn_implementation", None) == "flex_attention":
                config._attn_implementation = "sdpa"
    log = (out / "log.jsonl").open("w")
    step = recipe.optimizer.step

    def logged_step(*a, **k):
        result = step(*a, **k)
        log.write(json.dumps({"step": recipe.runtime.global_step + 1, "time": time.time()}) + "\n")
        log.flush()
        return result

    class Done(Exception):
        pass

    if args.max_steps:
        # a step budget, which it lacks (it runs whole epochs): its own warmup-cosine schedule over
        # max_steps instead of epochs x batches (its warmup rule: _resolve_warmup_steps), and the run ends
        # after max_steps optimizer steps
        from nemo_automodel.recipes.llm._spec_train_utils import make_warmup_cosine_schedule
        from nemo_automodel.recipes.llm.train_dspark import _resolve_warmup_steps

        warmup = _resolve_warmup_steps(args.warmup_ratio, args.max_steps)
        recipe.untrack_state("lr_scheduler")  # its setattr refuses to replace a tracked state object
        recipe.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(
            recipe.optimizer, make_warmup_cosine_schedule(warmup, args.max_steps, args.min_lr_ratio)
        )
        recipe.total_optim_steps = args.max_steps

    def budgeted_step(*a, **k):
        result = logged_step(*a, **k)
        if args.max_steps and recipe.runtime.global_step + 1 >= args.max_steps:
            raise Done
        return result

    recipe.optimizer.step = budgeted_step
    started = time.time()
    try:
        recipe.run_train_validation_loop()
    except Done:
        recipe.runtime.global_step += 1  # the step that raised was taken (its scheduler step was not needed)
    wall = time.time() - started
    log.close()
    metrics = [
        json.loads(line)
        for line in (out / "run" / "dspark_train_metrics.jsonl").read_text().splitlines()
        if line.strip()
    ]
    losses = {int(m["step"]): m.get("loss") for m in metrics if "step" in m}
    records = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines() if line.strip()]
    (out / "log.jsonl").write_text("".join(json.dumps({**r, "loss": losses.get(r["step"])}) + "\n" for r in records))
    draft = recipe.draft_model
    tensors = {k: v.detach().float().contiguous() for k, v in draft.state_dict().items()}
    save_file(tensors, str(out / "draft.safetensors"))
    (out / "config.json").write_text(draft.config.to_json_string())
    (out / "summary.json").write_text(
        json.dumps(
            {
                "wall_s": wall,
                "global_step": recipe.runtime.global_step,
                "nemo_automodel": __import__("importlib.metadata").metadata.version("nemo_automodel"),
                "torch": torch.__version__,
                "threads": torch.get_num_threads(),
                "pid": os.getpid(),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
