"""Online training's rank side: a step plan known before any state is captured, read from the stream.

    source = OnlineSource(recipe, env=env, out_dir=out_dir, contract=contract)   # plans; rank 0 starts producers
    source.num_steps                                  # fixed up front, whatever P producers and N ranks are
    for step in source.steps(start_step, position):   # this rank's sequences of each step, from the stream
        ...
    source.finish(step)                               # the stream summary (peak, producers, idle time per side)

The plan comes from the capture plan (datagen lengths; no hidden state needed): epoch 0 takes the
trainable sequences in plan order (shard 0, 1, ...: the order producers finish them in, so
the stream stays short), later epochs (only with `capture.keep_max_bytes`) a seeded shuffle of the
shards and of each shard's sequences. Steps are packed by `plan.pack_steps` on the budget
`train.tokens_per_step` alone, so a step's global batch does not depend on P or N; only where a
step would hold fewer sequences than ranks does it join the next one (the last step takes the few
left at the end, so every sequence is trained). Each step is split over ranks by `Step.for_rank`'s balanced
rule, from lengths alone, so every rank knows every step's owner of every sequence; a rank reads
only the shards holding its own sequences. Anchors are seeded by (seed, epoch, position in the plan).
The plan and the stream bounds it implies live in stream_plan.py (no torch: the preflight uses them).

Release on consumption: before drawing step s + 1, rank 0 releases every shard no step after s uses
(step s's gradient reduction needed every rank, so every rank has read its share). The stream
position is the step: a checkpoint at step c records it (`position["step"]`); `--resume auto`
rewinds the stream to the shards step c + 1 needs (capture/stream.py `rewind`), the producers
capture again those already released, and the run continues with exactly the sequences the plan
gives it. Each rank appends the sequence ids it trains to `<train dir>/stream-ids/rank-R.jsonl`
(`{"step", "ids", "pid"}`). An interrupted run (Ctrl-C) resumes the same way, from its last checkpoint or
from the start; its producers stopped without recording a failure (capture/producers.py).

Rank 0 claims the stream for this train directory for the whole run (capture/stream_owner.py: the
`.dspark-owner` mark naming the train directory, and `.dspark-lock` in a directory stream) before the
producers start, and lets go in `close()`: a second train run with another train directory is refused,
as is a folder dspark did not make.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dspark_cli.errors import DataError, UsageError
from dspark_cli.training.data import Step, prepare
from dspark_cli.training.stream_plan import Item, OnlinePlan, bound_problem, plan_for_recipe, plan_online

__all__ = ["Item", "OnlinePlan", "OnlineSource", "OnlineStep", "plan_online", "utilisation"]

if TYPE_CHECKING:
    from dspark_cli.recipe.schema import Recipe

log = logging.getLogger(__name__)


def utilisation(producer_wait_s: list[float], rank_wait_s: list[float], wall_s: float) -> dict[str, Any]:
    """Which side is the bottleneck: the share of the run each side spent idle. Producers idle waiting
    for room in the stream (trainers too slow: add trainer GPUs), ranks idle waiting for shards
    (producers too slow: add inference engines). Producer waits are summed over restarts of the same
    producer, but only this run's trainer clock counts."""
    wall = max(wall_s, 1e-9)
    producer_idle = [min(1.0, w / wall) for w in producer_wait_s]
    rank_idle = [min(1.0, w / wall) for w in rank_wait_s]
    return {
        "wall_s": round(wall_s, 1),
        "producer_wait_s": [round(w, 1) for w in producer_wait_s],
        "rank_wait_s": [round(w, 1) for w in rank_wait_s],
        "producer_busy": round(1.0 - sum(producer_idle) / max(len(producer_idle), 1), 3),
        "trainer_busy": round(1.0 - sum(rank_idle) / max(len(rank_idle), 1), 3),
        "bottleneck": (
            "producers"
            if sum(rank_idle) / max(len(rank_idle), 1) > sum(producer_idle) / max(len(producer_idle), 1)
            else "trainers"
        ),
    }


class OnlineStep(Step):
    """One step as this rank sees it: only its own examples, the step's tokens over all ranks."""

    def __init__(self, examples: list[Any], position: dict[str, int], total_tokens: int) -> None:
        super().__init__(examples, position)
        self.total_tokens = total_tokens

    @property
    def num_tokens(self) -> int:
        return self.total_tokens

    def for_rank(self, rank: int, world_size: int) -> list[Any]:
        return self.examples


class OnlineSource:
    """The stream, the plan and (on rank 0, unless external) the producers' supervisor."""

    def __init__(self, recipe: Recipe, *, env: Any, out_dir: Path, contract: Any) -> None:
        from dspark_cli.capture import StreamReader, build_plan, open_store, stream_location
        from dspark_cli.machine.devices import device_split_problems

        capture = recipe.capture
        self.recipe, self.env, self.out_dir = recipe, env, out_dir
        if not capture.external_producers and (problems := device_split_problems(recipe)):
            raise UsageError(
                f"the producer / trainer device split cannot work: {'; '.join(problems)}",
                "set capture.devices and train.devices to disjoint lists that fit (docs/online.md)",
            )
        capture_plan = build_plan(recipe)
        self.plan = plan_for_recipe(recipe, capture_plan, world_size=env.world_size)
        self.required = self.plan.required_shards()
        problem = bound_problem(recipe, capture_plan, self.plan, world_size=env.world_size)  # the preflight's too
        if problem is not None:
            raise UsageError(*problem)
        self.location = stream_location(recipe)
        self.supervisor = None
        self._claim = contextlib.ExitStack()
        try:
            if env.is_main:  # this run's stream until close(): refused when another run's or a stranger's
                from dspark_cli.capture import claim_stream

                store = self._claim.enter_context(claim_stream(self.location, out_dir))
            else:
                store = open_store(self.location)
            expect = dataclasses.replace(contract, mask_token_id=None, block_size=None)
            self.reader = StreamReader(
                store,
                fingerprint=capture_plan.fingerprint,
                workers=capture.workers,
                expect=expect,
                timeout_s=capture.stream_timeout,
                gave_up=lambda: self.supervisor.gave_up if self.supervisor is not None else None,
            )
            self.started = time.time()
            if env.is_main and not capture.external_producers:
                self.supervisor = self._start_producers()
        except BaseException:
            self._claim.close()
            raise

    @property
    def num_steps(self) -> int:
        return len(self.plan.steps)

    def _start_producers(self) -> Any:
        from dspark_cli.capture import Supervisor
        from dspark_cli.machine.cpu import child_environ
        from dspark_cli.recipe import write_resolved

        recipe_file = write_resolved(self.recipe, self.out_dir / "online-producer", keep_secrets=True)
        log.info("starting %d capture producer(s) into %s", self.recipe.capture.workers, self.location)
        return Supervisor(  # each producer's output in the train directory's logs/producer-<w>.log
            recipe_file,
            self.location,
            self.recipe,
            environ=child_environ(),
            on_event=log.warning,
            log_dir=self.out_dir / "logs",
            store=self.reader.store,
        ).start()

    def steps(self, start_step: int, position: dict[str, int]) -> Iterator[Step]:
        """This rank's share of steps start_step + 1 .. num_steps (None-free; the plan fixes them).
        Called by every rank at once: rank 0 rewinds the stream to start_step, then all go on together."""
        if start_step and position.get("consumed") != self.plan.consumed(start_step):
            raise UsageError(
                f"the checkpoint at step {start_step} was made with another online step plan "
                f"(other train.nproc_per_node / nnodes, tokens_per_step or data)",
                "resume with the same number of ranks, or train into a new directory (-o DIR)",
            )
        if self.env.is_main:
            below = self.plan.release_below(start_step)
            if self.reader.rewind(below, step=start_step, window=self.recipe.capture.queue_max_shards):
                log.info(
                    "stream rewound to shard %d (step %d): the producers capture again what it lacks", below, start_step
                )
        from dspark_cli.training.distributed import barrier

        barrier(self.env)  # no rank reads before the stream is at this run's position
        return self._steps(start_step)

    def _steps(self, start_step: int) -> Iterator[Step]:
        rank = self.env.rank
        train = self.recipe.train
        remaining: dict[tuple[int, int], set[int]] = {}
        for ranks in self.plan.steps[start_step:]:
            for item in ranks[rank]:
                remaining.setdefault((item.epoch, item.shard), set()).add(item.slot)
        cache: dict[tuple[int, int], dict[int, Any]] = {}
        ids_dir = self.out_dir / "stream-ids"
        ids_dir.mkdir(parents=True, exist_ok=True)
        consumed = self.plan.consumed(start_step)
        with open(ids_dir / f"rank-{rank}.jsonl", "a", encoding="utf-8") as ids_log:
            for number in range(start_step, self.num_steps):
                below = self.plan.release_below(number)  # step `number` is trained by every rank
                if self.env.is_main and number > start_step and below > self.plan.release_below(number - 1):
                    self.reader.release(below, step=number)
                ranks = self.plan.steps[number]
                examples = []
                for item in ranks[rank]:
                    key = (item.epoch, item.shard)
                    if key not in cache:
                        wanted = remaining[key]
                        cache[key] = {s: q for s, q in enumerate(self.reader.read(item.shard)) if s in wanted}
                    seq = cache[key].pop(item.slot, None)
                    remaining[key].discard(item.slot)
                    if not remaining[key]:
                        del cache[key], remaining[key]
                    examples.append(self._prepare(item, seq, train))
                consumed += sum(len(r) for r in ranks)
                ids_log.write(
                    json.dumps({"step": number + 1, "ids": [i.seq_id for i in ranks[rank]], "pid": os.getpid()}) + "\n"
                )
                ids_log.flush()
                tokens = sum(i.num_tokens for r in ranks for i in r)
                yield OnlineStep(
                    examples, {"epoch": ranks[rank][-1].epoch, "consumed": consumed, "step": number + 1}, tokens
                )

    def _prepare(self, item: Item, seq: Any, train: Any) -> Any:
        where = f"{self.location}: shard {item.shard} position {item.slot}"
        if seq is None or seq.id != item.seq_id:
            raise DataError(
                f"{where} holds {getattr(seq, 'id', 'nothing')}, the plan says {item.seq_id}",
                "the stream was made from other datagen output; use a new stream",
            )
        example = prepare(
            seq,
            epoch=item.epoch,
            index=item.index,
            seed=train.seed,
            num_anchors=train.num_anchors,
            max_seq_len=train.max_seq_len,
        )
        if example is None or example.num_tokens != item.num_tokens:
            raise DataError(
                f"{where}: {item.seq_id} has no target states where its loss mask says so",
                "the capture backend dropped states; re-capture with capture.backend=hf to compare",
            )
        return example

    def after_checkpoint(self, step: int) -> None:
        """Nothing waits for a checkpoint: shards are released as they are trained on (`_steps`)."""

    def finish(self, step: int) -> dict[str, Any]:
        """Release everything (rank 0), stop the producers; the stream's numbers for the run summary,
        with each side's idle time: producers waiting for room, ranks waiting for data."""
        import torch

        from dspark_cli.training.distributed import all_reduce_sum

        waits = torch.zeros(self.env.world_size, dtype=torch.float64, device=self.env.device)
        waits[self.env.rank] = self.reader.wait_s
        waits = all_reduce_sum(waits, self.env)  # every rank's seconds waiting for shards
        if self.env.is_main:
            self.reader.release(self.plan.num_shards, step=step, finished=True)
        self.close()
        summary = self.reader.summary()
        summary.update(
            required_shards=self.required,
            planned_steps=self.num_steps,
            utilisation=utilisation(summary["producer_wait_s"], waits.tolist(), time.time() - self.started),
        )
        if self.env.is_main:
            use = summary["utilisation"]
            log.info(
                "stream utilisation: producers busy %.0f%% (idle waiting for room), trainers busy %.0f%% "
                "(idle waiting for shards): the %s are the bottleneck",
                100 * use["producer_busy"],
                100 * use["trainer_busy"],
                use["bottleneck"],
            )
        return summary

    def close(self) -> None:
        """Stop the producers (rank 0), then let go of the stream's claim; again: nothing."""
        if self.supervisor is not None:
            self.supervisor.stop()
            if self.supervisor.gave_up:  # the reader's error carries it to the user (a warning would repeat it)
                log.info("capture producers: %s", self.supervisor.gave_up)
            self.supervisor = None
        self._claim.close()
