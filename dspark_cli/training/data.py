"""Captured sequences -> training examples -> packed steps -> per-rank batches.

    from dspark_cli.training.data import StepStream, collate
    stream = StepStream(source, seed=0, num_anchors=32, max_seq_len=512, tokens_per_step=4096,
                        world_size=1, epochs=2.0)
    for step in stream:                       # step.examples: this step's sequences (all ranks)
        mine = step.for_rank(rank, world_size)
        batch = collate(mine, dtype=torch.float32)

Conventions (docs/concepts.md, One drafting step; docs/train.md, Data):
- anchor `a` drafts the block at positions a .. a+N-1; slot i predicts token a+i+1 from the target's
  distribution at position a+i, i.e. `lm_head(last_hidden[a+i])`;
- a label position `p` is trainable (`label_ok[p]`) when `loss_mask[p]` and the target's state at
  `p - 1` was captured (capture stores `last_hidden` on loss-masked rows only, so the first token of
  each response, whose predecessor is a prompt token, has no target distribution and is skipped);
- anchors: up to `num_anchors` distinct positions `a` with `label_ok[a + 1]`, drawn without
  replacement by a generator seeded from (seed, epoch, index of the sequence in the source), so a
  resumed run, a 2-process run and a 1-process run draw the same anchors.
Sequences with no trainable label are skipped; longer ones are truncated to `max_seq_len`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from dspark_cli.training.plan import epoch_items, pack_steps, shuffle_stream


@dataclass
class Example:
    """One prepared training sequence."""

    epoch: int
    index: int  # position in the source order of its epoch (seeds its anchors)
    input_ids: torch.Tensor  # [T] int64
    aux: torch.Tensor  # [T, F] as captured (bf16)
    last_hidden: torch.Tensor  # [T, H] as captured (bf16), post-final-norm
    label_ok: torch.Tensor  # [T] bool
    anchors: torch.Tensor  # [A'] int64, sorted, A' <= num_anchors

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])


def anchor_seed(seed: int, epoch: int, index: int) -> int:
    return ((seed * 1_000_003 + epoch) * 1_000_033 + index) & 0x7FFFFFFFFFFFFFFF


def trainable_labels(loss_mask: torch.Tensor, last_hidden: torch.Tensor) -> torch.Tensor:
    """[T] bool: position p is a label we can train (loss-masked, target state at p-1 present)."""
    has_target = last_hidden.ne(0).any(dim=-1)
    ok = torch.zeros_like(loss_mask, dtype=torch.bool)
    ok[1:] = loss_mask[1:].bool() & has_target[:-1]
    return ok


def sample_anchors(label_ok: torch.Tensor, num_anchors: int, generator: torch.Generator) -> torch.Tensor:
    """Sorted anchor positions a with label_ok[a + 1]; all of them when there are few."""
    candidates = torch.nonzero(label_ok[1:], as_tuple=False).flatten()
    if candidates.numel() > num_anchors:
        pick = torch.randperm(candidates.numel(), generator=generator)[:num_anchors]
        candidates = candidates[pick]
    return torch.sort(candidates).values


def prepare(seq: Any, *, epoch: int, index: int, seed: int, num_anchors: int, max_seq_len: int) -> Example | None:
    """A CapturedSequence -> Example (None when it has nothing to train)."""
    length = min(int(seq.input_ids.shape[0]), max_seq_len)
    ids = seq.input_ids[:length].long()
    last = seq.last_hidden[:length]
    label_ok = trainable_labels(seq.loss_mask[:length], last)
    gen = torch.Generator().manual_seed(anchor_seed(seed, epoch, index))
    anchors = sample_anchors(label_ok, num_anchors, gen)
    if anchors.numel() == 0:
        return None
    return Example(epoch, index, ids, seq.aux_hidden[:length], last, label_ok, anchors)


@dataclass
class Step:
    """One optimiser step's sequences (all ranks) and where the stream stands after it."""

    examples: list[Example]
    position: dict[str, int]  # {"epoch": e, "consumed": n}: resume point after this step

    @property
    def num_tokens(self) -> int:
        return sum(e.num_tokens for e in self.examples)

    def for_rank(self, rank: int, world_size: int) -> list[Example]:
        """Balanced split by tokens (longest first to the lightest rank); deterministic."""
        loads = [0] * world_size
        owned: list[list[Example]] = [[] for _ in range(world_size)]
        order = sorted(range(len(self.examples)), key=lambda i: (-self.examples[i].num_tokens, i))
        for i in order:
            r = min(range(world_size), key=lambda k: (loads[k], len(owned[k]), k))
            owned[r].append(self.examples[i])
            loads[r] += self.examples[i].num_tokens
        return owned[rank]


@dataclass
class StepStream:
    """Seeded epochs over a re-iterable source, packed into steps; resumable from a `Step.position`.

    `source()` returns a fresh iterator over CapturedSequence-like objects (the same order every
    call). `epochs=None` reads epochs until the caller stops (used with `max_steps`); an online
    source is read once (`single_pass=True`).
    """

    source: Callable[[], Iterable[Any]]
    seed: int
    num_anchors: int
    max_seq_len: int
    tokens_per_step: int
    world_size: int
    epochs: float | None
    num_items_per_epoch: int | None = None  # needed for fractional epochs
    single_pass: bool = False
    start: dict[str, int] = field(default_factory=lambda: {"epoch": 0, "consumed": 0})

    def _examples(self) -> Iterator[tuple[tuple[Example, int, int], int]]:
        if self.single_pass:
            epochs: Iterable[tuple[int, int | None]] = [(0, None)]
        elif self.epochs is not None and self.epochs != int(self.epochs):
            if self.num_items_per_epoch is None:
                raise ValueError("fractional epochs need num_items_per_epoch")
            epochs = epoch_items(self.num_items_per_epoch, self.epochs)
        else:
            epochs = _forever() if self.epochs is None else ((e, None) for e in range(int(self.epochs)))
        for epoch, count in epochs:
            if epoch < self.start["epoch"]:
                continue
            # a single-pass source cannot be read again from its start, so a resumed run takes it from where it is now
            skip = self.start["consumed"] if epoch == self.start["epoch"] and not self.single_pass else 0
            prepared = self._prepared(epoch)
            stream = prepared if self.single_pass else shuffle_stream(prepared, self.seed, epoch)
            for n, (example, num_tokens) in enumerate(stream):
                if count is not None and n >= count:
                    break
                if n < skip:
                    continue
                yield (example, epoch, n + 1), num_tokens

    def _prepared(self, epoch: int) -> Iterator[tuple[Example, int]]:
        for index, seq in enumerate(self.source()):
            example = prepare(
                seq,
                epoch=epoch,
                index=index,
                seed=self.seed,
                num_anchors=self.num_anchors,
                max_seq_len=self.max_seq_len,
            )
            if example is not None:
                yield example, example.num_tokens

    def __iter__(self) -> Iterator[Step]:
        for group in pack_steps(self._examples(), self.tokens_per_step, self.world_size):
            _, epoch, consumed = group[-1]
            yield Step([g[0] for g in group], {"epoch": epoch, "consumed": consumed})


def _forever() -> Iterator[tuple[int, None]]:
    epoch = 0
    while True:
        yield epoch, None
        epoch += 1


MICRO_BATCH_SLACK = 0.7  # a micro-batch takes sequences costing >= 70% of its largest one


def row_cost(example: Example, block_size: int = 7) -> int:
    """Padded work of a row: its block slots plus its context positions."""
    return example.anchors.numel() * block_size + example.num_tokens


def micro_batches(examples: list[Example], slack: float = MICRO_BATCH_SLACK) -> list[list[Example]]:
    """Split one rank's sequences into micro-batches of alike cost, largest first.

    A batch pads every row to its longest sequence and its largest anchor count; with chat data of
    mixed lengths that wasted ~45% of block slots and ~70% of context positions on the tiny targets.
    Each extra micro-batch costs one more forward/backward (per-op overhead, large on CPU).
    """
    order = sorted(examples, key=lambda e: (-row_cost(e), -e.num_tokens, e.epoch, e.index))
    groups: list[list[Example]] = []
    for example in order:
        if groups and row_cost(example) >= slack * row_cost(groups[-1][0]):
            groups[-1].append(example)
        else:
            groups.append([example])
    return groups


def split_to(groups: list[list[Example]], count: int) -> list[list[Example]]:
    """Exactly `count` micro-batches: split the largest ones, then pad with empty ones (an empty
    micro-batch trains nothing but takes part in the collectives)."""
    groups = [list(g) for g in groups]
    while len(groups) < count and any(len(g) > 1 for g in groups):
        big = max(range(len(groups)), key=lambda i: (len(groups[i]), -i))
        half = len(groups[big]) // 2
        groups[big : big + 1] = [groups[big][:half], groups[big][half:]]
    return groups + [[] for _ in range(count - len(groups))]


@dataclass
class Batch:
    """One rank's share of a step, right-padded to its longest sequence or to a fixed shape."""

    aux: torch.Tensor  # [B, T, F]
    input_ids: torch.Tensor  # [B, T]
    last_hidden: torch.Tensor  # [B, T, H]
    label_ok: torch.Tensor  # [B, T] bool
    seq_lens: torch.Tensor  # [B] (0 for an empty padding row)
    anchors: torch.Tensor  # [B, A] (padding anchors are 0 with anchor_mask False)
    anchor_mask: torch.Tensor  # [B, A] bool
    num_tokens: int

    @property
    def signature(self) -> tuple[int, int, int]:
        """(rows, tokens, anchors): what a compiled kernel specialises on (training/shapes.py)."""
        return (*self.input_ids.shape, self.anchors.shape[1])

    def to(self, device: torch.device) -> Batch:
        moved = {
            k: (v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v) for k, v in self.__dict__.items()
        }
        return Batch(**moved)


def collate(
    examples: list[Example], dtype: torch.dtype, like: Example | None = None, shape: tuple[int, int, int] | None = None
) -> Batch:
    """Stack examples into a right-padded batch; hidden states cast to the compute dtype.

    `shape` = (rows, tokens, anchors): pad to exactly that (static shapes, training/shapes.py); rows
    beyond the examples are empty (no tokens, no anchors). Otherwise the batch is as wide as its
    longest row and its largest anchor count. No examples: a batch of `like`'s feature sizes with no
    anchors (trains nothing), of `shape`, or else of one 2-token row."""
    if not examples:
        assert like is not None, "an empty micro-batch needs an example to take its shapes from"
        if shape is not None:
            return _padded([], dtype, shape, like.aux.shape[-1], like.last_hidden.shape[-1])
        empty = Example(
            like.epoch,
            like.index,
            like.input_ids[:2],
            like.aux[:2],
            like.last_hidden[:2],
            torch.zeros(2, dtype=torch.bool),
            torch.zeros(1, dtype=torch.long),
        )
        batch = collate([empty], dtype)
        batch.anchor_mask.zero_()
        batch.num_tokens = 0
        return batch
    if shape is None:
        shape = (len(examples), max(e.num_tokens for e in examples), max(e.anchors.numel() for e in examples))
    return _padded(examples, dtype, shape, examples[0].aux.shape[-1], examples[0].last_hidden.shape[-1])


def _padded(examples: list[Example], dtype: torch.dtype, shape: tuple[int, int, int], feat: int, hidden: int) -> Batch:
    bsz, width, num_anchors = shape
    if len(examples) > bsz or any(e.num_tokens > width or e.anchors.numel() > num_anchors for e in examples):
        raise ValueError(f"{len(examples)} examples do not fit the batch shape {shape}")
    aux = torch.zeros(bsz, width, feat, dtype=dtype)
    last = torch.zeros(bsz, width, hidden, dtype=dtype)
    ids = torch.zeros(bsz, width, dtype=torch.long)
    label_ok = torch.zeros(bsz, width, dtype=torch.bool)
    anchors = torch.zeros(bsz, num_anchors, dtype=torch.long)
    anchor_mask = torch.zeros(bsz, num_anchors, dtype=torch.bool)
    seq_lens = torch.zeros(bsz, dtype=torch.long)
    for b, e in enumerate(examples):
        n, a = e.num_tokens, e.anchors.numel()
        aux[b, :n] = e.aux
        last[b, :n] = e.last_hidden
        ids[b, :n] = e.input_ids
        label_ok[b, :n] = e.label_ok
        anchors[b, :a] = e.anchors
        anchor_mask[b, :a] = True
        seq_lens[b] = n
    return Batch(aux, ids, last, label_ok, seq_lens, anchors, anchor_mask, int(seq_lens.sum()))
