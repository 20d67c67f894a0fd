"""Online training's step plan and the stream bounds it implies, from the capture plan alone (no torch).

    plan = plan_for_recipe(recipe, build_plan(recipe), world_size=8)    # every rank computes the same
    plan.steps[s][r]                # the items rank r trains at step s + 1
    plan.required_shards()          # the smallest capture.queue_max_shards that never stalls
    bound_problem(recipe, capture_plan, plan, world_size=8)   # None, or (message, hint): the bound is too small

Training ranks (stream_source.py) and the preflight (preflight/stream.py) both call `bound_problem`, so
`dspark validate` refuses the `capture.queue_max_shards` / `capture.keep_max_bytes` a rank would refuse.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from dspark_cli.errors import DataError
from dspark_cli.training.plan import epoch_rng, pack_steps

if TYPE_CHECKING:
    from dspark_cli.recipe.schema import Recipe


@dataclass(frozen=True)
class Item:
    """One trainable sequence of the plan."""

    epoch: int
    index: int  # position among all planned sequences (seeds its anchors)
    seq_id: str
    shard: int
    slot: int  # position inside its shard
    num_tokens: int  # after train.max_seq_len


@dataclass
class OnlinePlan:
    steps: list[list[list[Item]]]  # steps[s][rank]: the items rank trains at step s + 1
    num_shards: int
    last_use: list[int]  # per shard: the last step (1-based) an epoch-0 item of it is trained; 0 for none
    keep: bool  # shards kept for later epochs: released only at the end

    def release_below(self, step: int) -> int:
        """Shards below this index are needed by no step after `step` (0 while they are kept)."""
        if self.keep and step < len(self.steps):
            return 0
        return next((s for s, last in enumerate(self.last_use) if last > step), self.num_shards)

    def consumed(self, step: int) -> int:
        return sum(len(rank) for s in self.steps[:step] for rank in s)

    def required_shards(self) -> int:
        """The smallest `capture.queue_max_shards` that never stalls: the shards from the oldest one the
        current step still reads (everything older was released after the step before) to the newest
        one it reads. It does not depend on the checkpoint interval."""
        need, high = 1, -1
        for s, ranks in enumerate(self.steps, start=1):
            high = max([high] + [i.shard for rank in ranks for i in rank if i.epoch == 0])
            need = max(need, high - self.release_below(s - 1) + 1)
        return need


class _Length:
    def __init__(self, item: Item) -> None:
        self.item, self.num_tokens = item, item.num_tokens


def plan_online(
    capture_plan: Any,
    *,
    max_seq_len: int,
    tokens_per_step: int,
    world_size: int,
    seed: int,
    epochs: float = 1.0,
    max_steps: int | None = None,
    keep: bool = False,
    split: bool = True,
) -> OnlinePlan:
    """The whole run's steps and their per-rank split, from the capture plan's token ids and masks.
    `split=False` leaves each step whole (`steps[s] == [items]`): what the stream's bounds need, without
    importing torch (the preflight's case)."""
    first: list[Item] = []
    by_shard: dict[int, list[Item]] = {}
    slot, current = 0, None
    for index, (shard, seq_id, ids, mask) in enumerate(capture_plan.samples()):
        slot = slot + 1 if shard == current else 0
        current = shard
        kept = min(len(ids), max_seq_len)  # trainable: some loss position with a target state before it
        if any(mask[p] and mask[p - 1] for p in range(1, kept)):
            item = Item(0, index, seq_id, shard, slot, kept)
            first.append(item)
            by_shard.setdefault(shard, []).append(item)
    items = list(first)
    epoch = 1
    while keep and epoch < epochs:
        rng = epoch_rng(seed, epoch)
        order = sorted(by_shard)
        rng.shuffle(order)
        epoch_items = []
        for shard in order:
            group = list(by_shard[shard])
            rng.shuffle(group)
            epoch_items += [dataclasses.replace(i, epoch=epoch) for i in group]
        items += epoch_items[: round(min(1.0, epochs - epoch) * len(epoch_items))]
        epoch += 1
    steps: list[list[list[Item]]] = []
    num_shards = len(capture_plan.shards)
    last_use = [0] * num_shards
    groups: list[list[Item]] = []
    pending: list[Item] = []
    for group in pack_steps(((i, i.num_tokens) for i in items), tokens_per_step, 1):  # the budget alone
        pending += group
        if len(pending) >= world_size:  # a step of fewer sequences than ranks joins the next one
            groups.append(pending)
            pending = []
            if max_steps is not None and len(groups) >= max_steps:
                break
    if pending and groups and (max_steps is None or len(groups) < max_steps):
        groups[-1] += pending  # the few left at the end join the last step
    elif pending and not groups:
        raise DataError(
            f"{len(items)} trainable sequences cannot give each of {world_size} ranks one",
            "use fewer ranks, or more datagen samples",
        )
    if split:  # the balanced rule every rank applies (training/data.py, which imports torch)
        from dspark_cli.training.data import Step
    for group in groups:
        if split:
            owned = Step(cast("list[Any]", [_Length(i) for i in group]), {})  # lengths are all it reads
            steps.append([[cast(_Length, e).item for e in owned.for_rank(r, world_size)] for r in range(world_size)])
        else:
            steps.append([group])
        for item in group:
            if item.epoch == 0:
                last_use[item.shard] = len(steps)
    for s in range(1, num_shards):  # a shard nothing trains on goes with the one before it
        last_use[s] = max(last_use[s], last_use[s - 1])
    return OnlinePlan(steps, num_shards, last_use, keep)


def plan_for_recipe(recipe: Recipe, capture_plan: Any, *, world_size: int, split: bool = True) -> OnlinePlan:
    """`plan_online` with the recipe's settings: epochs beyond the first only when shards are kept."""
    train = recipe.train
    keep = recipe.capture.keep_max_bytes is not None
    return plan_online(
        capture_plan,
        max_seq_len=train.max_seq_len,
        tokens_per_step=train.tokens_per_step,
        world_size=world_size,
        seed=train.seed,
        epochs=train.epochs if keep else 1.0,
        max_steps=train.max_steps,
        keep=keep,
        split=split,
    )


def bound_problem(recipe: Recipe, capture_plan: Any, plan: OnlinePlan, *, world_size: int) -> tuple[str, str] | None:
    """Whether the stream's bound holds what the plan reads: with `capture.keep_max_bytes`, the whole stream
    (every shard is kept for later epochs); else, `capture.queue_max_shards`, the shards one step reads
    from at once (`OnlinePlan.required_shards`). None, or (message, hint), each one line."""
    capture, train = recipe.capture, recipe.train
    if capture.keep_max_bytes is not None:
        total = sum(capture_plan.shard_bytes(s) for s in capture_plan.shards)
        if total <= capture.keep_max_bytes:
            return None
        return (
            f"capture.keep_max_bytes={capture.keep_max_bytes:,} cannot hold the whole stream, which is kept "
            f"for train.epochs={train.epochs:g}: {len(capture_plan.shards)} shard(s), {total:,} bytes",
            f"set capture.keep_max_bytes>={total}, or unset it to read the data once",
        )
    need = plan.required_shards()
    if need <= capture.queue_max_shards:
        return None
    return (
        f"capture.queue_max_shards={capture.queue_max_shards} is too small: one training step reads from {need} "
        f"shards at once (train.tokens_per_step={train.tokens_per_step:,} over {world_size} rank(s), shards of "
        f"capture.shard_tokens={capture.shard_tokens:,} tokens)",
        f"set capture.queue_max_shards>={need}, or raise capture.shard_tokens (fewer, larger shards per step)",
    )
