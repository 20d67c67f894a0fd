"""The training loop: AdamW with warmup + cosine, clipping, autocast, metrics and checkpoints.

    record = train_loop(env=env, module=step_module, optimizer=opt, steps=stream_iter, start_step=0,
                        cfg=LoopConfig(...), log=write_record, checkpoint=save)

One optimiser step per packed `Step` (all ranks' sequences); this rank trains on its share.
Metric sums are accumulated locally and all-reduced only at log steps (one small collective), so
logging costs no per-step synchronisation beyond the slot-weight all-reduce the loss needs.

Non-finite guard: every step records on the device (no sync) the first step whose loss stats or
gradient norm are not finite; the loop reads that at each log step and before every checkpoint
(where it synchronises anyway) and stops with one line naming the step. So a diverged run stops
within `log_every` steps and no checkpoint (nor final/) is ever written from a non-finite state.
"""

from __future__ import annotations

import math
import resource
import time
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from dspark_cli.errors import DsparkError
from dspark_cli.training.data import Step, collate, micro_batches, split_to
from dspark_cli.training.distributed import DistEnv, all_reduce_max, all_reduce_min, all_reduce_sum, clip_grad_norm
from dspark_cli.training.flops import attention_flops, count_flops
from dspark_cli.training.metrics import stats_size, summarize
from dspark_cli.training.shapes import CompileCounter, ShapePlan
from dspark_cli.training.step import LossConfig, local_weight, trainable_slots


@dataclass(frozen=True)
class LoopConfig:
    num_steps: int
    lr: float
    min_lr_ratio: float
    warmup_steps: int
    grad_clip: float
    log_every: int
    checkpoint_every: int
    block_size: int
    loss: LossConfig
    data_dtype: torch.dtype  # hidden states are cast to this (fp32 on CPU, bf16 with autocast)
    autocast_dtype: torch.dtype | None  # None: no autocast
    peak_flops: float | None = None
    shapes: ShapePlan | None = None  # fixed micro-batch shapes (training/shapes.py); None: pad to fit
    validate_every: int | None = None  # steps between validations (with a `validate` callback)


def lr_at(step: int, cfg: LoopConfig) -> float:
    """Linear warmup over `warmup_steps`, then cosine from `lr` down to `lr * min_lr_ratio`."""
    if cfg.warmup_steps and step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    span = max(cfg.num_steps - cfg.warmup_steps, 1)
    progress = min(max(step - cfg.warmup_steps, 0) / span, 1.0)
    floor = cfg.lr * cfg.min_lr_ratio
    return floor + (cfg.lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def draft_config(module: torch.nn.Module):
    return module.draft.config


def memory_gib(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def _scalar(value: torch.Tensor) -> float:
    full = value.full_tensor() if hasattr(value, "full_tensor") else value
    return float(full)


NEVER = 2**62  # "no non-finite step yet"


def mark_nonfinite(first_bad: torch.Tensor, step: int, stats: torch.Tensor, grad_norm: torch.Tensor) -> torch.Tensor:
    """`first_bad`, lowered to `step` when this step's stats or grad norm are not finite (device ops only)."""
    norm = grad_norm.to_local() if hasattr(grad_norm, "to_local") else grad_norm
    ok = torch.isfinite(stats).all() & torch.isfinite(norm.to(stats.device))
    return torch.where(ok, first_bad, torch.minimum(first_bad, torch.full_like(first_bad, step)))


def check_finite(first_bad: torch.Tensor, env: DistEnv, last_saved: int) -> None:
    """One-line error when some rank saw a non-finite step (read at log and checkpoint steps only)."""
    bad = all_reduce_min(first_bad, env)
    if bad < NEVER:
        saved = (
            f"the last checkpoint (step {last_saved}) is from before it" if last_saved else "no checkpoint was written"
        )
        raise DsparkError(
            f"training diverged: non-finite loss or gradient norm at step {bad + 1}; stopped without saving, {saved}",
            "lower train.lr or train.grad_clip, or check the captured data, and "
            "train again into a new directory (-o DIR)",
        )


@dataclass
class StepResult:
    tokens: int  # this rank's sequence tokens
    sequences: int
    stats: torch.Tensor  # summed metric stats (metrics.STATS layout)
    grad_norm: torch.Tensor
    flops: int | None  # counted when asked
    signatures: set[tuple[int, int, int]]  # the micro-batches' (rows, tokens, anchors)


def train_step(
    env: DistEnv,
    module: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    data: Step,
    cfg: LoopConfig,
    lr: float,
    *,
    count: bool = False,
) -> StepResult:
    """One optimiser step on this rank's share of `data`, in micro-batches whose gradients add up to
    the whole step's: of alike sequences (`data.micro_batches`: less padding), or with `cfg.shapes`
    of one length bucket each, padded to its fixed shape."""
    mine = data.for_rank(env.rank, env.world_size)
    plan = cfg.shapes
    if plan is None:
        groups = micro_batches(mine)
        shapes: list[tuple[int, int, int] | None] = [None] * len(groups)
    else:
        planned = plan.micro_batches(mine)
        groups, shapes = [g for _, g in planned], [plan.shape(length) for length, _ in planned]
    if env.distributed:  # every rank runs as many forward/backward passes (FSDP2 collectives pair up)
        count = all_reduce_max(len(groups), env)
        if plan is None:
            groups = split_to(groups, count)
            shapes = [None] * len(groups)
        else:  # empty ones of a shape this rank has (splitting would make new shapes)
            shapes += [shapes[-1]] * (count - len(groups))
            groups += [[] for _ in range(count - len(groups))]
    batches = [collate(g, cfg.data_dtype, like=mine[0], shape=shape).to(env.device) for g, shape in zip(groups, shapes)]
    oks = [trainable_slots(b, cfg.block_size) for b in batches]
    weight = all_reduce_sum(sum(local_weight(ok, cfg.loss.gamma) for ok in oks), env)
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)  # train.lr_scale (session.lr_groups)
    autocast = torch.autocast(env.device.type, dtype=cfg.autocast_dtype) if cfg.autocast_dtype else nullcontext()

    def forward_backward():
        total = None
        for i, (batch, ok) in enumerate(zip(batches, oks)):
            if hasattr(module, "set_requires_gradient_sync"):  # FSDP2: reduce-scatter once, after the last
                module.set_requires_gradient_sync(i == len(batches) - 1)
            with autocast:
                loss, stats = module(batch, ok, weight, float(env.world_size))
            loss.backward()
            total = stats.detach() if total is None else total + stats.detach()
        return total

    optimizer.zero_grad(set_to_none=True)
    flops = None
    if count:  # on a pass of its own whose gradients are dropped: some kernels round differently under
        # FlopCounterMode (a dispatch mode), and the counted step is a run's first, so a resumed run's first
        # step would differ (by ~1 ulp) from the same step of an uninterrupted run
        flops = count_flops(forward_backward)
        flops += sum(attention_flops(b.anchors, b.anchor_mask, draft_config(module)) for b in batches)
        optimizer.zero_grad(set_to_none=True)
    stats = forward_backward()
    grad_norm = clip_grad_norm([p for p in module.parameters() if p.requires_grad], cfg.grad_clip, env)
    optimizer.step()
    real = [g for g in groups if g]
    return StepResult(
        sum(e.num_tokens for g in real for e in g),
        sum(len(g) for g in real),
        stats,
        grad_norm,
        flops,
        {b.signature for b in batches},
    )


def train_loop(
    *,
    env: DistEnv,
    module: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    steps: Iterator[Step],
    start_step: int,
    cfg: LoopConfig,
    log: Callable[[dict[str, Any]], None],
    checkpoint: Callable[[int, dict[str, int], dict[str, Any] | None, int], None],
    tokens_done: int = 0,
    validate: Callable[[int], bool] | None = None,
) -> dict[str, Any]:
    """Run steps start_step .. num_steps - 1 (fewer if the data ends first, or `validate` stops the run; the
    last one is checkpointed).

    `validate(step) -> stop` (training/validation.py) is called every `validate_every` steps and after the
    last step, after that step's log line and before its checkpoint (which then holds the validation's
    state); True ends the run there (early stopping). `checkpoint(step, data_position, last_record,
    tokens_done)` is called every `checkpoint_every` steps and at the end. Returns {"record": last logged
    record, "step": steps done, "tokens": tokens done, "shapes": `shape_summary`}.
    """
    n = cfg.block_size
    acc = torch.zeros(stats_size(n), device=env.device)
    acc_tokens = acc_seqs = 0
    flops_per_token: float | None = None
    interval_start = time.perf_counter()
    record: dict[str, Any] | None = None
    done, saved, position = start_step, start_step, None
    validated = start_step
    first_bad = torch.full((), NEVER, dtype=torch.int64, device=env.device)
    signatures: set[tuple[int, int, int]] = set()
    compiles = CompileCounter()
    for step in range(start_step, cfg.num_steps):
        data = next(steps, None)
        if data is None:  # the data ran out early (online stream finished): stop cleanly
            break
        lr = lr_at(step, cfg)
        result = train_step(env, module, optimizer, data, cfg, lr, count=flops_per_token is None)
        stats, grad_norm = result.stats, result.grad_norm
        first_bad = mark_nonfinite(first_bad, step, stats, grad_norm)
        if result.flops is not None:
            flops_per_token = result.flops / max(result.tokens, 1)
        signatures |= result.signatures
        acc += stats.detach()
        acc_tokens += result.tokens
        acc_seqs += result.sequences
        tokens_done += data.num_tokens
        done, position = step + 1, data.position
        last = step + 1 == cfg.num_steps
        if (step + 1) % cfg.log_every == 0 or last:
            check_finite(first_bad, env, saved)
            totals = all_reduce_sum(
                torch.cat([acc, torch.tensor([acc_tokens, acc_seqs], dtype=acc.dtype, device=acc.device)]), env
            ).tolist()
            elapsed = max(time.perf_counter() - interval_start, 1e-9)
            tokens_per_s = totals[-2] / elapsed
            record = {
                "step": step + 1,
                "num_steps": cfg.num_steps,
                **summarize(totals[:-2], n, cfg.loss),
                "grad_norm": _scalar(grad_norm),
                "lr": lr,
                "tokens": int(totals[-2]),
                "sequences": int(totals[-1]),
                "tokens_per_s": tokens_per_s,
                "tflops": flops_per_token * tokens_per_s / 1e12,
                "mfu": (flops_per_token * tokens_per_s / env.world_size / cfg.peak_flops if cfg.peak_flops else None),
                "memory_gib": memory_gib(env.device),
                "time": time.time(),
            }
            log(record)
            acc.zero_()
            acc_tokens = acc_seqs = 0
            interval_start = time.perf_counter()
        stop = False
        if validate is not None and ((step + 1) % (cfg.validate_every or cfg.checkpoint_every) == 0 or last):
            check_finite(first_bad, env, saved)  # no best draft from a non-finite state
            stop, validated = validate(step + 1), step + 1
            interval_start = time.perf_counter()  # validation time is not training time
        if (step + 1) % cfg.checkpoint_every == 0 or last:
            check_finite(first_bad, env, saved)
            checkpoint(step + 1, data.position, record, tokens_done)
            saved = step + 1
            interval_start = time.perf_counter()  # checkpoint time is not training time
        if stop:
            break
    if validate is not None and done > validated:  # the data ended before the planned last step
        check_finite(first_bad, env, saved)
        validate(done)
    if done > saved and position is not None:
        check_finite(first_bad, env, saved)
        checkpoint(done, position, record, tokens_done)
    return {
        "record": record,
        "step": done,
        "tokens": tokens_done,
        "shapes": shape_summary(signatures, compiles, cfg.shapes, env),
    }


def shape_summary(
    signatures: set[tuple[int, int, int]], compiles: CompileCounter, plan: ShapePlan | None, env: DistEnv
) -> dict[str, Any]:
    """What a run compiled: distinct micro-batch shapes (rows, tokens, anchors) and dynamo's compiles
    (frames compiled, first compiles included, and graphs), each the most of any rank; the buckets."""
    counts = compiles.read()
    return {
        "signatures": all_reduce_max(len(signatures), env),
        "compiles": all_reduce_max(counts["compiles"], env),
        "graphs": all_reduce_max(counts["graphs"], env),
        "length_buckets": list(plan.lengths) if plan else None,
    }
