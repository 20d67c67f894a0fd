"""Static batch shapes: micro-batches padded to a few fixed (rows, length, anchors) shapes.

    plan = shape_plan(recipe.train, block_size=7, device=torch.device("cuda"))   # None: pad to fit
    for length, group in plan.micro_batches(examples):       # groups of one length bucket
        batch = collate(group, torch.bfloat16, shape=plan.shape(length))
    counter = CompileCounter()                                # dynamo's counters from here on
    ...; counter.compiles()                                   # frames compiled since (first + re-)

Why: a compiled kernel with static shapes (flex attention on CUDA is compiled with `dynamic=False`;
`train.compile` in this mode too) compiles once per input shape, and dynamo gives up on a function
after `recompile_limit` shapes and runs it eagerly from then on (for flex: the slow path that
materialises every score). Padding each micro-batch to its own longest sequence makes almost every
step a new shape. Here the shapes come from a fixed set, one per length bucket:

- length: the smallest bucket >= the sequence's length. `pow2` buckets are the powers of two from
  `MIN_BUCKET` (flex's 128-wide tile; shorter sequences are cheap anyway) below `max_seq_len`, then
  `max_seq_len`: for 4096, 128 256 512 1024 2048 4096. The number of buckets bounds the compiles
  (log2 of the length range: 6 for 4096, 8 for 16384); their spacing bounds the padding of the
  context, at most 2x and about 1.4x on average for lengths spread evenly in log scale. A finer set
  (e.g. 1.5x steps) halves the waste for twice the compiles: a list in `train.length_buckets`.
- anchors per row: `min(num_anchors, length)`: a row of a bucket never has more anchor positions
  than tokens, so the anchor count follows from the length and adds no shapes. Padding anchors
  are masked (no slot trains) and see only their own block, so nothing reads them.
- rows per micro-batch: as many rows of the bucket as cost no more than one row of the longest
  bucket (`row_cost`: block slots plus context positions), at least one. Every micro-batch then
  costs at most one longest row, so the peak memory is known before the data is seen and does not
  depend on its length mix; the last micro-batch of a bucket in a step is filled with empty rows.

Padded positions are masked out of the loss and never attended by a real block (a block sees the
context before its anchor only), so the loss and gradients equal the unpadded batch's up to float
rounding (tests/training/test_train_units.py). The CPU default does not pad (`auto` = `fit` on CPU): there
dspark's C attention kernel is not compiled and pays for every padded anchor, and `train.compile`
without static shapes goes dynamic after one recompile.

Counting: `Batch.signature` is a micro-batch's shape; the loop collects the distinct ones over the
run, and `CompileCounter` reads torch._dynamo's counters (`frames.total`: one per frame dynamo
compiles, first compiles and recompiles alike; `stats.unique_graphs`: graphs produced, more than
frames only where a frame has graph breaks). Both go into the training summary (manifest.json).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any

import torch

MIN_BUCKET = 128  # flex attention's tile: a shorter length saves no tile


def pow2_buckets(max_seq_len: int, floor: int = MIN_BUCKET) -> tuple[int, ...]:
    """Powers of two from `floor` below `max_seq_len`, then `max_seq_len` itself."""
    out, length = [], floor
    while length < max_seq_len:
        out.append(length)
        length *= 2
    return (*out, max_seq_len)


def length_buckets(setting: str | list[int], max_seq_len: int, device: torch.device) -> tuple[int, ...] | None:
    """The padded lengths `train.length_buckets` names on `device` (None: each micro-batch padded to
    its own longest row). `auto`: `pow2` on CUDA, where attention is compiled flex, `fit` on CPU."""
    if setting == "fit" or (setting == "auto" and device.type != "cuda"):
        return None
    if setting in ("auto", "pow2"):
        return pow2_buckets(max_seq_len)
    return tuple(sorted({min(int(x), max_seq_len) for x in setting} | {max_seq_len}))


@dataclass(frozen=True)
class ShapePlan:
    """The fixed micro-batch shapes of a run (see the module docstring)."""

    lengths: tuple[int, ...]  # ascending; the last is train.max_seq_len
    num_anchors: int
    block_size: int

    def length(self, num_tokens: int) -> int:
        """The bucket of a sequence of `num_tokens` (<= max_seq_len: `prepare` truncates)."""
        return self.lengths[min(bisect.bisect_left(self.lengths, num_tokens), len(self.lengths) - 1)]

    def anchors(self, length: int) -> int:
        return min(self.num_anchors, length)

    def cost(self, length: int) -> int:
        return self.anchors(length) * self.block_size + length

    def rows(self, length: int) -> int:
        return max(1, self.cost(self.lengths[-1]) // self.cost(length))

    def shape(self, length: int) -> tuple[int, int, int]:
        """(rows, tokens, anchors) of every micro-batch of bucket `length`."""
        return self.rows(length), length, self.anchors(length)

    def micro_batches(self, examples: list[Any]) -> list[tuple[int, list[Any]]]:
        """(bucket, examples) per micro-batch, longest bucket first; deterministic."""
        by_length: dict[int, list[Any]] = {}
        for e in sorted(examples, key=lambda e: (-e.num_tokens, e.epoch, e.index)):
            by_length.setdefault(self.length(e.num_tokens), []).append(e)
        out = []
        for length in sorted(by_length, reverse=True):
            group, rows = by_length[length], self.rows(length)
            out += [(length, group[i : i + rows]) for i in range(0, len(group), rows)]
        return out

    @property
    def max_shapes(self) -> int:
        return len(self.lengths)


def shape_plan(train: Any, block_size: int, device: torch.device) -> ShapePlan | None:
    """The plan for a recipe's `train` section on `device` (None when it pads each batch to fit)."""
    lengths = length_buckets(train.length_buckets, train.max_seq_len, device)
    return None if lengths is None else ShapePlan(lengths, train.num_anchors, block_size)


class CompileCounter:
    """torch._dynamo's compile counters since construction (they are process-wide; this diffs them)."""

    def __init__(self) -> None:
        self.start = self._read()

    @staticmethod
    def _read() -> tuple[int, int]:
        import sys

        if "torch._dynamo" not in sys.modules:  # nothing compiled yet, and nothing to import for it
            return 0, 0
        from torch._dynamo.utils import counters

        return int(counters["frames"]["total"]), int(counters["stats"]["unique_graphs"])

    def read(self) -> dict[str, int]:
        """{"compiles": frames compiled (first compiles + recompiles), "graphs": graphs produced}."""
        now = self._read()
        return {"compiles": now[0] - self.start[0], "graphs": now[1] - self.start[1]}


def describe(shapes: dict[str, Any] | None) -> str:
    """The run summary's shapes in words, for the final log line."""
    if not shapes:
        return "batch shapes not recorded"
    buckets = shapes.get("length_buckets")
    padded = f"padded to lengths {'/'.join(map(str, buckets))}" if buckets else "each padded to fit"
    return f"{shapes['signatures']} batch shapes ({padded}), {shapes['compiles']} compiles"
