"""Acceptance binned by context length (bench/context.py): hand-computed bins, the drop note, chaining.

    .venv/bin/python -m pytest tests/test_bench_context.py -q        # < 5 s
"""

from __future__ import annotations

import pytest

from dspark_cli.bench.context import bin_edges, by_context, chained, drop_note
from dspark_cli.bench.datasets import BenchDataset
from dspark_cli.bench.stats import TurnStats
from dspark_cli.prompts.conversation import Conversation


def _turn(accepted, contexts):
    return TurnStats("all", accepted, [3] * len(accepted), 0, 0.0, [None] * len(accepted), contexts)


def test_edges_and_hand_computed_bins():
    assert bin_edges(1024) == [0, 128, 256, 512, 1024]
    assert bin_edges(100) == [0, 100]
    turns = [_turn([3, 1, 0], [10, 130, 300]), _turn([2, 2], [50, 200])]
    bins = by_context(turns, [0, 128, 256, 512], block_size=3)
    assert [(b["low"], b["num_steps"], b["num_turns"]) for b in bins] == [(0, 2, 2), (128, 2, 2), (256, 1, 1)]
    assert bins[0]["tau"]["mean"] == pytest.approx((4 + 3) / 2)
    assert bins[1]["tau"]["mean"] == pytest.approx((2 + 3) / 2)
    assert bins[0]["acceptance_per_position"] == pytest.approx([1.0, 1.0, 0.5])
    assert bins[2]["acceptance_per_position"] == pytest.approx([0.0, 0.0, 0.0])


def test_drop_note_needs_intervals_apart():
    high = [_turn([5, 5, 4, 5], [10, 20, 30, 40]) for _ in range(6)] + [_turn([4, 5, 5, 5], [10, 20, 30, 40])]
    low = [_turn([0, 1, 0, 0], [600, 610, 620, 630]) for _ in range(6)] + [_turn([1, 0, 0, 0], [600, 610, 620, 630])]
    note = drop_note(by_context(high + low, [0, 128, 512, 1024], block_size=6))
    assert note.startswith("acceptance drops: tau 1.") and "512-1024" in note and "0-128" in note
    flat = drop_note(by_context(high, [0, 128, 512, 1024], block_size=6))
    assert flat.startswith("no drop beyond the 95% intervals up to 128")


def test_chained_conversations_reach_long_contexts():
    convs = [Conversation(id=str(i), source="x", messages=[{"role": "user", "content": f"q{i}"}]) for i in range(10)]
    chains = chained(BenchDataset("tiny-eval", convs), max_model_len=1024, max_tokens=128).conversations
    assert [len(c.user_turns) for c in chains] == [7, 3]
    assert chains[0].user_turns[:2] == ["q0", "q1"] and chains[0].meta == {"category": "context-sweep"}
