"""Teacher-forced acceptance metrics of a draft on captured sequences, without training it.

    from dspark_cli.training.evaluate import evaluate_draft, load_trained_draft
    model = load_trained_draft("runs/tiny/train", Target.of(recipe))   # final/ + the target's embeddings
    evaluate_draft(model, sequences, num_anchors=10_000)             # {"tau_greedy": .., "tau_t1": .., ...}

The numbers are the ones training logs (`metrics.summarize`): per-slot accuracy and acceptance, and
the expected acceptance length tau under greedy and T=1 verification, plus `tau_greedy_decode` and
`tau_t1_decode`: with every position an anchor, decoding itself is replayed on each response --
start at its first token, accept the teacher-forced block there, continue where it ends (greedy:
exactly; T=1: the expected number of steps by dynamic programming over the per-slot acceptance
probabilities) -- which is the teacher-forced estimate of the tau speculative decoding measures on
the same text (tests/training/test_train_tau.py, benchmarks/train_tau.py compare it with the reference engine).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from dspark_cli.targets import Target
from dspark_cli.training.data import collate, prepare
from dspark_cli.training.metrics import stats_size, summarize
from dspark_cli.training.step import LossConfig, TrainStep, local_weight, trainable_slots


def load_trained_draft(train_dir: str | Path, target: Target) -> Any:
    """The consolidated draft of a training run (`final/`), with the target's embeddings attached."""
    from dspark_cli.artifacts.draft import build_model, load_draft_dir

    loaded = load_draft_dir(train_dir)
    model = build_model(loaded.config, loaded.state_dict)
    embed, lm_head = target.embeddings()
    model.set_target_embeddings(embed, lm_head)
    return model


def replay(anchors: list[int], greedy: torch.Tensor, accept: torch.Tensor) -> tuple[float, float, float]:
    """(tokens, greedy steps, expected T=1 steps) of decoding one row whose anchors are `anchors`.

    greedy / accept [A, N]: per anchor and slot, 0/1 greedy acceptance and T=1 acceptance probability
    (0 past the end of the response). Runs of consecutive anchors are responses; each is decoded from
    its first anchor, a step at p accepting m drafts moves to p + m + 1.
    """
    tokens = greedy_steps = expected_steps = 0.0
    index = {p: j for j, p in enumerate(anchors)}
    runs, start = [], 0
    for j in range(1, len(anchors) + 1):
        if j == len(anchors) or anchors[j] != anchors[j - 1] + 1:
            runs.append((anchors[start], anchors[j - 1]))
            start = j
    for first, last in runs:
        tokens += last - first + 1
        p = first
        while p <= last:  # greedy: deterministic
            greedy_steps += 1
            p += 1 + int(greedy[index[p]].cumprod(0).sum())
        steps = {}  # T=1: expected steps from p, from the end backwards
        for p in range(last, first - 1, -1):
            alpha, reach, total = accept[index[p]].tolist(), 1.0, 1.0
            for m in range(len(alpha) + 1):  # m drafts accepted
                stop = 1.0 - alpha[m] if m < len(alpha) else 1.0
                total += reach * stop * steps.get(p + m + 1, 0.0)
                if m < len(alpha):
                    reach *= alpha[m]
            steps[p] = total
        expected_steps += steps[first]
    return tokens, greedy_steps, expected_steps


def every_position(
    sequences: Iterable[Any], *, num_anchors: int = 1 << 20, max_seq_len: int = 4096, seed: int = 0
) -> list[Any]:
    """The prepared examples (training/data.py `prepare`) of `sequences`, numbered in their order; with the
    default `num_anchors` every trainable position is an anchor. Sequences with nothing to score are left out."""
    return [
        e
        for i, s in enumerate(sequences)
        if (e := prepare(s, epoch=0, index=i, seed=seed, num_anchors=num_anchors, max_seq_len=max_seq_len))
    ]


def score_batch(
    step: Any, examples: list[Any], dtype: torch.dtype, *, like: Any = None, eager: bool = False
) -> tuple[torch.Tensor, tuple[float, float, float]]:
    """One forward of `step` (a `TrainStep`, FSDP2-sharded or not) over `examples`: the summed statistics
    (metrics.STATS layout, fp32 on the CPU) and the decoding replay's (tokens, greedy steps, expected T=1
    steps) summed over the examples. No examples: a batch of `like`'s sizes that scores nothing (a rank with
    no share still takes part in FSDP2's forward). `eager`: the uncompiled forward (other shapes than
    training's)."""
    n = step.draft.config.block_size
    batch = collate(examples, dtype, like=like).to(next(step.parameters()).device)
    ok = trainable_slots(batch, n)
    _, stats, (flat, greedy, accept) = step(
        batch, ok, local_weight(ok, step.loss_config.gamma).clamp_min(1e-12), slots=True, eager=eager
    )
    grids = []
    for values in (greedy, accept):
        grid = torch.zeros(ok.numel())
        grid[flat.cpu()] = values.float().cpu()
        grids.append(grid.view(ok.shape))
    tokens = greedy_steps = t1_steps = 0.0
    for b, example in enumerate(examples):
        count = example.anchors.numel()
        row = replay(example.anchors.tolist(), grids[0][b, :count], grids[1][b, :count])
        tokens, greedy_steps, t1_steps = tokens + row[0], greedy_steps + row[1], t1_steps + row[2]
    return stats.float().cpu(), (tokens, greedy_steps, t1_steps)


def decode_taus(tokens: float, greedy_steps: float, t1_steps: float) -> dict[str, float]:
    """`tau_greedy_decode` / `tau_t1_decode`: replayed tokens per decoding step."""
    return {"tau_greedy_decode": tokens / max(greedy_steps, 1.0), "tau_t1_decode": tokens / max(t1_steps, 1e-12)}


@torch.no_grad()
def evaluate_draft(
    model: Any,
    sequences: Iterable[Any],
    *,
    num_anchors: int = 1 << 20,
    max_seq_len: int = 4096,
    batch_size: int = 8,
    loss: LossConfig | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """Sum the training statistics over `sequences` and summarize; with anchors at every position (the
    default), also replay decoding (`tau_greedy_decode`, `tau_t1_decode`)."""
    loss = loss or LossConfig()
    step = TrainStep(model, loss).eval()
    n = model.config.block_size
    dtype = next(model.parameters()).dtype
    totals = torch.zeros(stats_size(n))
    replayed = torch.zeros(3, dtype=torch.float64)
    examples = every_position(sequences, num_anchors=num_anchors, max_seq_len=max_seq_len, seed=seed)
    for start in range(0, len(examples), batch_size):
        stats, row = score_batch(step, examples[start : start + batch_size], dtype)
        totals += stats
        replayed += torch.tensor(row, dtype=torch.float64)
    return {"sequences": len(examples), **summarize(totals.tolist(), n, loss), **decode_taus(*replayed.tolist())}
