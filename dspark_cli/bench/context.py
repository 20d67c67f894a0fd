"""Acceptance against context length: every verification step binned by the tokens before its anchor.

    from dspark_cli.bench.context import bin_edges, by_context, drop_note, sweep_prompts
    bins = by_context(turns, bin_edges(1024), block_size=7)    # tau and per-position acceptance per bin
    drop_note(bins)                                            # "acceptance drops: tau 1.9 at 512-1024 ..."
    prompts = sweep_prompts(recipe.bench)                      # (dataset, user turn), lazily, in order

Every offline run is binned (its contexts are the prompts plus the answers so far, short for
single-turn sets). `bench.context_sweep: true` adds long contexts: `bench.context_sweep_conversations`
long conversations, each fed the datasets' prompts in order (each prompt used once, read past
`bench.num_prompts` as needed) and answered turn by turn with the target's own earlier answers in
the context, until the next prompt no longer fits `target.max_model_len` (offline.py runs them).
Each bin's tau carries the same cluster-robust 95% t interval as the main runs (stats.py; turns are
the clusters, and each bin says how many it has), clipped to [1, N + 1]. Standard library only.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import pairwise
from typing import Any

from dspark_cli.bench.stats import ratio_estimate


def bin_edges(max_model_len: int, first: int = 128) -> list[int]:
    """0, first, 2 first, 4 first, ... up to max_model_len (the last edge)."""
    edges, edge = [0], first
    while edge < max_model_len:
        edges.append(edge)
        edge *= 2
    return [*edges, max_model_len]


def by_context(turns: Sequence[Any], edges: Sequence[int], block_size: int) -> list[dict[str, Any]]:
    """Per bin [edges[j], edges[j+1]) of context length: steps, tau and per-position acceptance."""
    out = []
    for low, high in pairwise(edges):
        tokens, steps, per_position = [], [], [[] for _ in range(block_size)]
        for turn in turns:
            picked = [a for a, c in zip(turn.accepted, turn.contexts, strict=True) if low <= c < high]
            tokens.append(sum(picked) + len(picked))
            steps.append(len(picked))
            for i in range(block_size):
                per_position[i].append(sum(1 for a in picked if a > i))
        if sum(steps) == 0:
            continue
        out.append(
            {
                "low": low,
                "high": high,
                "num_steps": sum(steps),
                "num_turns": sum(1 for s in steps if s),
                "tau": ratio_estimate(tokens, steps, bounds=(1.0, block_size + 1.0)),
                "acceptance_per_position": [ratio_estimate(c, steps)["mean"] for c in per_position],
            }
        )
    return out


def drop_note(bins: Sequence[dict[str, Any]]) -> str:
    """Where tau first falls below the shortest bin's, beyond both 95% intervals (or that it does not)."""
    if not bins:
        return "no verification steps"
    first = bins[0]
    base, (base_low, _) = first["tau"]["mean"], first["tau"]["ci95"]
    for row in bins[1:]:
        mean, (_, high) = row["tau"]["mean"], row["tau"]["ci95"]
        if base_low is not None and high is not None and high < base_low:
            return (
                f"acceptance drops: tau {mean:.2f} at {row['low']}-{row['high']} tokens of context against "
                f"{base:.2f} at {first['low']}-{first['high']} (95% intervals apart)"
            )
    shown = " -> ".join(f"{r['tau']['mean']:.2f}" for r in bins)
    return f"no drop beyond the 95% intervals up to {bins[-1]['high']} tokens of context (tau by bin: {shown})"


def sweep_prompts(bench: Any) -> Iterator[tuple[str, str]]:
    """(dataset label, user turn) for every user turn of `bench.datasets`, in order, read lazily and not
    cut at `bench.num_prompts` (the sweep's conversations take as many as they need)."""
    from dspark_cli.bench.datasets import dataset_source
    from dspark_cli.prompts.sources import read_source

    for entry in bench.datasets:
        label, source = dataset_source(entry, bench)
        for conv in read_source(source):
            for text in conv.user_turns:
                yield label, text
