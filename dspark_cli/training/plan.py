"""How sequences become optimiser steps: seeded epoch order, packing, and the plan of a run (no torch).

    from dspark_cli.training.plan import plan_run
    plan = plan_run(lengths=[812, 95, 2048], tokens_per_step=4096, epochs=2.0, max_steps=None,
                    world_size=1, seed=0)
    plan.num_steps, plan.tokens_per_step, plan.sequences_per_step

The training loop and the plan share these functions, so `dspark train --dry-run` prints exactly
the steps the run will take. Rules:
- epoch order: a seeded shuffle buffer over the source order (`SHUFFLE_BUFFER_TOKENS` tokens; a
  full shuffle for data smaller than that). The source order itself is the capture's.
- packing: a step takes sequences in order while their tokens fit `tokens_per_step` (all ranks
  together), and at least one sequence per rank; the next sequence opens the next step. Epochs
  are concatenated; a fractional last epoch stops part-way; a final step with fewer sequences than
  ranks is dropped (every rank must hold data).
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TypeVar

# Tokens of sequences the shuffle buffer holds (with their hidden states, in host memory):
# 64k tokens is 8 MiB per 64 features in bf16, i.e. ~4.7 GB for K3's 5 x 7168 features.
SHUFFLE_BUFFER_TOKENS = 1 << 16

T = TypeVar("T")


def epoch_rng(seed: int, epoch: int) -> random.Random:
    return random.Random((seed * 1_000_003 + epoch) & 0xFFFFFFFFFFFF)


def shuffle_stream(
    items: Iterable[tuple[T, int]], seed: int, epoch: int, buffer_tokens: int = SHUFFLE_BUFFER_TOKENS
) -> Iterator[tuple[T, int]]:
    """(item, num_tokens) pairs in a seeded shuffle-buffer order; deterministic for a given input order."""
    rng = epoch_rng(seed, epoch)
    buffer: list[tuple[T, int]] = []
    held = 0
    for pair in items:
        buffer.append(pair)
        held += pair[1]
        while held >= buffer_tokens and buffer:
            j = rng.randrange(len(buffer))
            buffer[j], buffer[-1] = buffer[-1], buffer[j]
            out = buffer.pop()
            held -= out[1]
            yield out
    rng.shuffle(buffer)
    yield from buffer


def pack_steps(items: Iterable[tuple[T, int]], tokens_per_step: int, min_items: int) -> Iterator[list[T]]:
    """Group (item, num_tokens) pairs into steps of <= tokens_per_step tokens and >= min_items items."""
    step: list[T] = []
    tokens = 0
    for item, num_tokens in items:
        if len(step) >= min_items and tokens + num_tokens > tokens_per_step:
            yield step
            step, tokens = [], 0
        step.append(item)
        tokens += num_tokens
    if len(step) >= min_items:
        yield step


def epoch_items(num_items_per_epoch: int, epochs: float | None) -> Iterator[tuple[int, int]]:
    """(epoch, count) for each epoch to read: count items of it (None = unbounded epochs)."""
    epoch = 0
    while epochs is None or epoch < epochs:
        remaining = num_items_per_epoch if epochs is None else round(min(1.0, epochs - epoch) * num_items_per_epoch)
        if remaining <= 0:
            return
        yield epoch, remaining
        epoch += 1


@dataclass(frozen=True)
class TrainPlan:
    num_steps: int
    tokens_per_step: int  # budget (all ranks)
    num_sequences: int  # per epoch, after filtering
    num_tokens: int  # per epoch
    epochs: float  # passes the steps cover
    sequences_per_step: float  # mean
    tokens_per_step_mean: float  # mean real tokens per step

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def plan_run(
    *,
    lengths: list[int],
    tokens_per_step: int,
    epochs: float,
    max_steps: int | None,
    world_size: int,
    seed: int,
    buffer_tokens: int = SHUFFLE_BUFFER_TOKENS,
) -> TrainPlan:
    """Simulate the run's packing over `lengths` (prepared sequences, source order)."""
    if not lengths:
        return TrainPlan(0, tokens_per_step, 0, 0, 0.0, 0.0, 0.0)
    stream = _length_stream(lengths, seed, None if max_steps else epochs, buffer_tokens)
    steps = seqs = tokens = 0
    for step in pack_steps(stream, tokens_per_step, world_size):
        steps += 1
        seqs += len(step)
        tokens += sum(step)
        if max_steps is not None and steps >= max_steps:
            break
    return TrainPlan(
        steps,
        tokens_per_step,
        len(lengths),
        sum(lengths),
        seqs / len(lengths),
        seqs / max(steps, 1),
        tokens / max(steps, 1),
    )


def _length_stream(lengths: list[int], seed: int, epochs: float | None, buffer_tokens: int):
    for epoch, count in epoch_items(len(lengths), epochs):
        pairs = ((n, n) for n in lengths)
        for i, pair in enumerate(shuffle_stream(pairs, seed, epoch, buffer_tokens)):
            if i >= count:
                break
            yield pair
