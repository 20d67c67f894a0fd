"""Training metrics: per-slot accuracy, expected acceptance length, and where they are written.

    vec = stats_vector(...)                      # one rank's sums for one step (see STATS)
    record = summarize(total_vec, block_size, weights)   # after summing over steps and ranks
    sinks = open_sinks(["jsonl", "tensorboard"], out_dir, ...); sinks.write(record); sinks.close()

Acceptance, per slot k of a teacher-forced block (the Markov head sees the true previous token):
- greedy: the draft's top-1 equals the target's top-1 (greedy verification accepts exactly then);
- T=1: sum_v min(p_v, q_v) = 1 - L1/2, the probability standard rejection sampling accepts it.
Expected acceptance length, bonus token included: per anchor, L = 1 + sum_k prod_{j<=k} accept_j
(greedy: 1 + the accepted prefix), the chain stopping at the end of the response as decoding does
(a block cut by the end counts only its slots inside); tau = mean of L over the sampled anchors.
Real decoding visits only the positions where the previous step ended, so when acceptance varies
smoothly along a text (long easy and hard stretches) tokens per step approach the *harmonic* mean
of L instead; on natural text (the tiny targets) the mean was within 3% of real decoding, on the
cyclic test target 17% above it. `evaluate.evaluate_draft` also walks every position exactly as
decoding does (`tau_*_decode`), which matched the reference engine within 2-7% on both.
These are teacher-forced estimates: they match real speculative decoding when the data are the
target's own outputs (datagen regenerates them) at the same temperature.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dspark_cli.errors import UsageError

if TYPE_CHECKING:
    from dspark_cli.artifacts.results import TrainSummary

# tau_greedy / tau_t1 hold sums of L over anchors (see the module docstring)
SCALARS = ("weight", "ce", "l1", "bce", "conf_err", "slots", "anchors", "tau_greedy", "tau_t1")
PER_SLOT = ("count", "correct", "greedy", "t1")


def stats_size(block_size: int) -> int:
    return len(SCALARS) + len(PER_SLOT) * block_size


def stats_vector(ok, flat, w_slot, per_slot, accept_t1, bce, conf):
    """Sums for one rank and step as a 1-D fp32 tensor laid out as SCALARS + PER_SLOT x N."""
    import torch

    n = ok.shape[-1]
    zero = torch.zeros((), device=ok.device)
    k = flat % n
    anchors = ok[..., 0]  # real anchors (their first slot is always trainable)

    def lengths(values):  # sum over anchors of L = 1 + sum_k prod_{j<=k} accept_j
        grid = torch.zeros(ok.numel(), device=ok.device)  # untrainable slots accept nothing: the chain ends
        grid[flat] = values
        return (1.0 + grid.view(ok.shape).cumprod(dim=-1).sum(dim=-1)[anchors]).sum()

    scalars = [
        w_slot.sum(),
        (w_slot * per_slot[:, 0]).sum(),
        (w_slot * per_slot[:, 1]).sum(),
        (w_slot * bce.detach()).sum() if bce is not None else zero,
        (w_slot * (conf - accept_t1).abs()).sum() if conf is not None else zero,
        torch.tensor(float(flat.numel()), device=ok.device),
        anchors.sum().float(),
        lengths(per_slot[:, 3]),
        lengths(accept_t1),
    ]
    slots = [
        torch.bincount(k, weights=v, minlength=n).float()
        for v in (torch.ones_like(accept_t1), per_slot[:, 2], per_slot[:, 3], accept_t1)
    ]
    return torch.cat([torch.stack(scalars).float(), *slots])


def summarize(vec: list[float], block_size: int, weights: Any) -> dict[str, Any]:
    """Summed stats -> the logged metrics (losses are slot-weighted means)."""
    s = dict(zip(SCALARS, vec[: len(SCALARS)]))
    per = {
        name: vec[len(SCALARS) + i * block_size : len(SCALARS) + (i + 1) * block_size]
        for i, name in enumerate(PER_SLOT)
    }
    w = max(s["weight"], 1e-12)
    ce, l1, bce = s["ce"] / w, s["l1"] / w, s["bce"] / w
    full = max(s["anchors"], 1.0)
    counts = [max(c, 1.0) for c in per["count"]]
    return {
        "loss": weights.ce * ce + weights.l1 * l1 + weights.confidence * bce,
        "loss_ce": ce,
        "loss_l1": l1,
        "loss_bce": bce,
        "conf_abs_err": s["conf_err"] / w,
        "acc": sum(per["correct"]) / max(sum(per["count"]), 1.0),
        "acc_slot": [c / n for c, n in zip(per["correct"], counts)],
        "accept_greedy_slot": [c / n for c, n in zip(per["greedy"], counts)],
        "accept_t1_slot": [c / n for c, n in zip(per["t1"], counts)],
        "tau_greedy": s["tau_greedy"] / full,
        "tau_t1": s["tau_t1"] / full,
        "slots": int(s["slots"]),
        "anchors": int(s["anchors"]),
    }


def format_line(record: dict[str, Any]) -> str:
    """One plain log line (what a non-TTY sees, and what the CLI progress line shows): a training step's,
    or a validation's (training/validation.py)."""
    if record.get("kind") == "validation":
        return format_validation(record)
    return (
        f"step {record['step']}/{record['num_steps']} loss {record['loss']:.4f} "
        f"(ce {record['loss_ce']:.3f} l1 {record['loss_l1']:.3f} bce {record['loss_bce']:.3f}) "
        f"acc {record['acc']:.3f} tau {record['tau_greedy']:.2f}/{record['tau_t1']:.2f} (greedy/T=1) "
        f"gnorm {record['grad_norm']:.3f} lr {record['lr']:.2e} {record['tokens_per_s']:.0f} tok/s "
        f"mem {record['memory_gib']:.2f} GiB"
    )


def format_validation(record: dict[str, Any]) -> str:
    """The console line of a validation record (beside the training lines)."""
    best = record.get("best") or {}
    mark = (
        " (best)"
        if best.get("step") == record["step"]
        else f"; best {best['value']:.3f} at step {best['step']}"
        if best
        else ""
    )
    return (
        f"validation step {record['step']}/{record['num_steps']}: tau {record['tau_greedy']:.2f}/"
        f"{record['tau_t1']:.2f} (greedy/T=1, decoded) on {record['sequences']} held-out sequences "
        f"({record['tokens']} tokens){mark}"
    )


def format_summary(summary: TrainSummary) -> str:
    """The run's last line (rank 0, or the one process): steps, tokens, final loss and tau, shapes, where to."""
    from dspark_cli.training.shapes import describe

    final = summary.final_metrics or {}
    best = summary.best
    chosen = f"; best {best['metric']} {best['value']:.3f} at step {best['step']} -> best/" if best else ""
    stopped = f" (stopped early at step {summary.stopped['step']})" if summary.stopped else ""
    return (
        f"train: {summary.steps} steps{stopped}, {summary.tokens} tokens, loss {final.get('loss', float('nan')):.4f}, "
        f"tau {final.get('tau_greedy', float('nan')):.2f} greedy / {final.get('tau_t1', float('nan')):.2f} T=1, "
        f"{describe(summary.shapes)} -> {summary.final}{chosen}; next: dspark export {summary.output_dir}"
    )


class JsonlSink:
    """metrics.jsonl, one record per log step. On resume, records past the resumed step are dropped, and so
    is what a crash left at the file's end (NUL bytes, a torn last line: `artifacts.jsonl.read_log`); the
    file is rewritten from the records kept before anything is appended."""

    def __init__(self, path: Path, resume_step: int) -> None:
        self.path = path
        if path.exists():
            kept = [r for r in read_metrics(path) if _step(r) <= resume_step] if resume_step > 0 else []
            tmp = path.with_name(f".{path.name}.tmp")
            with tmp.open("w", encoding="utf-8") as handle:
                handle.writelines(json.dumps(record) + "\n" for record in kept)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, path)
        self.handle = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()

    def write(self, record: dict[str, Any]) -> None:
        self.handle.write(json.dumps(record) + "\n")
        self.handle.flush()

    def close(self) -> None:
        self.handle.close()


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The records of a training run's metrics.jsonl, a crash's torn end dropped with a warning; damage in
    the middle of the file is one DataError naming the file and the line."""
    from dspark_cli.artifacts.jsonl import read_log

    return read_log(path, hint="the metrics log is not the run's state: delete that line (or the file) and run again")


def _step(record: dict[str, Any]) -> int:
    step = record.get("step", 0)
    return step if isinstance(step, int) and not isinstance(step, bool) else 0


class TensorBoardSink:
    def __init__(self, directory: Path) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise UsageError(
                "train.metrics has tensorboard but the tensorboard package is not installed",
                "pip install tensorboard, or drop tensorboard from train.metrics",
            ) from None
        self.writer = SummaryWriter(str(directory))

    def write(self, record: dict[str, Any]) -> None:
        for key, value in _flat_numbers(record):
            self.writer.add_scalar(f"{_section(record)}/{key}", value, record["step"])
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbSink:
    def __init__(self, directory: Path, project: str | None, name: str, config: dict[str, Any]) -> None:
        try:
            import wandb
        except ImportError:
            raise UsageError(
                "train.metrics has wandb but the wandb package is not installed",
                "pip install wandb, or drop wandb from train.metrics",
            ) from None
        self.run = wandb.init(
            project=project or "dspark",
            name=name,
            id=f"dspark-{name}",
            resume="allow",
            dir=str(directory),
            config=config,
        )

    def write(self, record: dict[str, Any]) -> None:
        section = _section(record)
        self.run.log(
            {f"{section}/{k}" if section != "train" else k: v for k, v in _flat_numbers(record)}, step=record["step"]
        )

    def close(self) -> None:
        self.run.finish()


class Sinks:
    def __init__(self, sinks: list[Any]) -> None:
        self.sinks = sinks

    def write(self, record: dict[str, Any]) -> None:
        for sink in self.sinks:
            sink.write(record)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()


def open_sinks(
    kinds: list[str], out_dir: Path, *, resume_step: int, run_name: str, project: str | None, config: dict[str, Any]
) -> Sinks:
    sinks: list[Any] = []
    for kind in kinds:
        if kind == "jsonl":
            sinks.append(JsonlSink(out_dir / "metrics.jsonl", resume_step))
        elif kind == "tensorboard":
            sinks.append(TensorBoardSink(out_dir / "tensorboard"))
        elif kind == "wandb":
            sinks.append(WandbSink(out_dir, project, run_name, config))
    return Sinks(sinks)


def _section(record: dict[str, Any]) -> str:
    """`train` for a training step's record, `validation` for a validation's."""
    return "validation" if record.get("kind") == "validation" else "train"


def _flat_numbers(record: dict[str, Any]):
    for key, value in record.items():
        if isinstance(value, bool):
            continue
        if isinstance(value, (int, float)):
            yield key, value
        elif isinstance(value, list):
            for i, item in enumerate(value):
                if isinstance(item, (int, float)):
                    yield f"{key}/{i}", item
