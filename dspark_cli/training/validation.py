"""Validation during training: acceptance on the held-out split, the best draft, early stopping.

    examples = validation_share(sequences, env, max_seq_len=4096)   # this rank's share, every position an anchor
    record = validate(module, examples, env=env, step=100, ...)       # the `validation` metrics record
    state = ValidationState(); state.update(100, record["tau_t1"], min_delta=0.0)   # True: a new best

Every `train.validate_every` steps (and at the last step) each rank scores its share of the validation
sequences with the training module itself (FSDP2: every rank runs as many forwards, a rank without a share
runs empty ones) and the sums are all-reduced, so 1 and N ranks log the same numbers. The numbers are
`evaluate.evaluate_draft`'s with every position an anchor: `tau_greedy` / `tau_t1` are the decoding replay
(`tau_*_decode` there: the teacher-forced estimate of the tau speculative decoding measures), the mean over
anchors is `tau_*_anchors` (what the training line shows for its batches), per-slot acceptance
`accept_*_slot`. `ValidationState` (best step and value, validations since, the early stop) travels in
every checkpoint's meta.json, so a resumed run picks the best an uninterrupted one picks.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from dspark_cli.artifacts.train import BEST_DIR, BEST_RECORD
from dspark_cli.training.distributed import DistEnv, all_reduce_max, all_reduce_sum
from dspark_cli.training.evaluate import decode_taus, every_position, score_batch
from dspark_cli.training.metrics import stats_size, summarize

log = logging.getLogger(__name__)

KIND = "validation"  # the `kind` of a validation record in metrics.jsonl (training steps have none)


@dataclass
class ValidationState:
    """The validation curve's running best, in every checkpoint (meta.json `validation`)."""

    best_step: int | None = None
    best_value: float | None = None
    since_best: int = 0  # validations since the best that did not improve on it
    stopped_at: int | None = None  # the step early stopping ended the run at

    def update(self, step: int, value: float, *, min_delta: float) -> bool:
        """Count one validation; True when `value` beats the best by more than `min_delta` (the first
        validation always does), so the best is the first maximum of the curve."""
        if self.best_value is None or value > self.best_value + min_delta:
            self.best_step, self.best_value, self.since_best = step, value, 0
            return True
        self.since_best += 1
        return False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> ValidationState:
        """From a checkpoint's meta.json; a checkpoint without validation starts afresh."""
        if not isinstance(data, dict):
            return cls()
        return cls(
            **{k: data.get(k) for k in ("best_step", "best_value", "stopped_at")},
            since_best=int(data.get("since_best") or 0),
        )


def validation_share(sequences: Sequence[Any], env: DistEnv, *, max_seq_len: int) -> tuple[list[Any], Any]:
    """(this rank's examples: every `world_size`-th sequence from its rank, every position an anchor; an
    example of the split to size an empty batch by). Sequences with nothing to score are left out."""
    mine = every_position(sequences[env.rank :: env.world_size], max_seq_len=max_seq_len)
    if mine:
        return mine, mine[0]
    for sequence in sequences:  # fewer sequences than ranks: any one gives the feature sizes
        if found := every_position([sequence], max_seq_len=max_seq_len):
            return mine, found[0]
    return mine, None


def micro_batches(examples: list[Any], max_tokens: int) -> list[list[Any]]:
    """Consecutive examples, at most `max_tokens` tokens a forward (at least one example)."""
    out: list[list[Any]] = []
    for example in examples:
        if out and sum(e.num_tokens for e in out[-1]) + example.num_tokens <= max_tokens:
            out[-1].append(example)
        else:
            out.append([example])
    return out


@torch.no_grad()
def validate(
    module: Any,  # the run's TrainStep, FSDP2-sharded or not
    examples: list[Any],
    like: Any,
    *,
    env: DistEnv,
    step: int,
    num_steps: int,
    data_dtype: torch.dtype,
    autocast_dtype: torch.dtype | None,
    max_tokens: int,
) -> dict[str, Any]:
    """The validation record at `step` (collective: every rank calls it with its share)."""
    started = time.perf_counter()
    n = module.draft.config.block_size
    batches = micro_batches(examples, max_tokens)
    count = all_reduce_max(len(batches), env)  # FSDP2's gathers pair up: as many forwards on every rank
    batches += [[] for _ in range(count - len(batches))]
    totals = torch.zeros(stats_size(n), dtype=torch.float64)
    replayed = torch.zeros(3, dtype=torch.float64)
    autocast = torch.autocast(env.device.type, dtype=autocast_dtype) if autocast_dtype else nullcontext()
    was_training = module.training
    module.eval()
    try:
        with autocast:
            for batch in batches:
                stats, row = score_batch(module, batch, data_dtype, like=like, eager=True)
                totals += stats.double()
                replayed += torch.tensor(row, dtype=torch.float64)
    finally:
        module.train(was_training)
    sizes = torch.tensor([len(examples), sum(e.num_tokens for e in examples)], dtype=torch.float64)
    summed = all_reduce_sum(torch.cat([totals, replayed, sizes]).to(env.device), env).cpu().tolist()
    k = stats_size(n)
    metrics = summarize(summed[:k], n, module.loss_config)
    taus = decode_taus(*summed[k : k + 3])
    return {
        "kind": KIND,
        "step": step,
        "num_steps": num_steps,
        "tau_greedy": taus["tau_greedy_decode"],
        "tau_t1": taus["tau_t1_decode"],
        "tau_greedy_anchors": metrics["tau_greedy"],
        "tau_t1_anchors": metrics["tau_t1"],
        "accept_greedy_slot": metrics["accept_greedy_slot"],
        "accept_t1_slot": metrics["accept_t1_slot"],
        "acc_slot": metrics["acc_slot"],
        "loss": metrics["loss"],
        "sequences": int(summed[k + 3]),
        "tokens": int(summed[k + 4]),
        "anchors": metrics["anchors"],
        "seconds": time.perf_counter() - started,
        "time": time.time(),
    }


@dataclass
class Validator:
    """The loop's `validate(step) -> stop` for one session: measure, count the best, write `best/` when it
    improves (`write_best(step, record)`, a collective), log the record, say whether to stop early."""

    train: Any  # the recipe's TrainSection
    examples: list[Any]  # this rank's share
    like: Any
    env: DistEnv
    state: ValidationState
    num_steps: int
    data_dtype: torch.dtype
    autocast_dtype: torch.dtype | None
    write_best: Any  # Callable[[int, dict], None]
    log: Any  # Callable[[dict], None]: rank 0 writes and shows it

    def __call__(self, module: Any, step: int) -> bool:
        train = self.train
        record = validate(
            module,
            self.examples,
            self.like,
            env=self.env,
            step=step,
            num_steps=self.num_steps,
            data_dtype=self.data_dtype,
            autocast_dtype=self.autocast_dtype,
            max_tokens=train.max_seq_len,
        )
        value = record[train.validation_metric]
        improved = self.state.update(step, value, min_delta=train.validation_min_delta)
        if improved and train.keep_best:
            self.write_best(step, {"step": step, "metric": train.validation_metric, "value": value})
        record["best"] = {
            "step": self.state.best_step,
            "metric": train.validation_metric,
            "value": self.state.best_value,
        }
        stop = train.early_stop_patience is not None and self.state.since_best >= train.early_stop_patience
        if stop:
            self.state.stopped_at = step
            record["stopped"] = "early"
        self.log(record)
        return stop


def load_validation(sequences: Any, env: DistEnv, max_seq_len: int) -> tuple[list[Any], Any] | None:
    """(this rank's share, an example to size empty batches by) of the split `sequences()` gives; None, logged
    once, when there is none (`sequences` None, or nothing in it to score)."""
    found = list(sequences()) if sequences is not None else []
    examples, like = validation_share(found, env, max_seq_len=max_seq_len)
    total = int(all_reduce_sum(torch.tensor([len(examples)], device=env.device), env).item())
    if total == 0:
        if env.is_main:
            log.info("no validation split: training without validation (train.keep_best and early stop do nothing)")
        return None
    if env.is_main:
        log.info("validation: %d held-out sequences", total)
    return examples, like


def kept_best(out_dir: Path, state: ValidationState, train: Any, env: DistEnv) -> dict[str, Any] | None:
    """The `best` record of the run ({step, metric, value}) when `best/` holds the state's best; a `best/`
    from another step (a resumed run that did not retrace the interrupted one's curve) is removed with a
    warning rather than exported as the best."""
    if not train.keep_best or state.best_step is None:
        return None
    chosen = {"step": state.best_step, "metric": train.validation_metric, "value": state.best_value}
    if env.is_main:
        directory = Path(out_dir) / BEST_DIR
        try:
            found = json.loads((directory / BEST_RECORD).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            found = None
        if not isinstance(found, dict) or found.get("step") != state.best_step:
            log.warning("%s is not the best validation's draft (step %s): removed", directory, state.best_step)
            shutil.rmtree(directory, ignore_errors=True)
            return None
    return chosen
