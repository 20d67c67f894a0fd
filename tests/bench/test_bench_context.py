"""Acceptance binned by context length (bench/context.py): hand-computed bins and intervals, the drop
note, the sweep's prompts.

    .venv/bin/python -m pytest tests/bench/test_bench_context.py -q        # < 5 s
"""

from __future__ import annotations

import pytest

from dspark_cli.bench.context import bin_edges, by_context, drop_note, sweep_prompts
from dspark_cli.bench.datasets import load_datasets
from dspark_cli.bench.stats import TurnStats, ratio_estimate, t95
from dspark_cli.recipe import load_recipe


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


def test_t_quantiles_match_the_printed_table():
    # Student's t 0.975 quantiles as printed in every table (e.g. NIST/SEMATECH e-Handbook 1.3.6.7.2)
    table = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 10: 2.228, 19: 2.093, 30: 2.042, 100: 1.984}
    for df, value in table.items():
        assert t95(df) == pytest.approx(value, abs=6e-4), df
    assert 1.95996 < t95(100000) < 1.9601


def test_few_turn_intervals_are_t_intervals_clipped_to_what_tau_can_be():
    # three turns of 2 steps with 5, 6, 7 tokens: R = 3, residuals -1, 0, 1, nbar = 2
    # se^2 = 2 / (3 * 2 * 2^2) = 1/12; half = t95(2) * se = 4.3027 * 0.28868 = 1.2421
    est = ratio_estimate([5, 6, 7], [2, 2, 2], bounds=(1.0, 8.0))
    assert est["mean"] == pytest.approx(3.0) and est["clusters"] == 3 and est["n"] == 6
    assert est["ci95"] == pytest.approx([3 - 1.24211, 3 + 1.24211], abs=1e-4)
    # two turns (6 and 2 tokens in 2 steps each): R = 2, se = 1, t95(1) = 12.706 -> [-10.7, 14.7] unclipped
    assert ratio_estimate([6, 2], [2, 2])["ci95"] == pytest.approx([2 - 12.7062, 2 + 12.7062], abs=1e-3)
    assert ratio_estimate([6, 2], [2, 2], bounds=(1.0, 8.0))["ci95"] == [1.0, 8.0]
    assert ratio_estimate([6], [2], bounds=(1.0, 8.0))["ci95"] == [None, None]  # one turn: no interval
    # the demo's old last bin (2 turns, 6 steps): within [1, N + 1] now
    bins = by_context(
        [_turn([3, 0, 4], [300, 310, 320]), _turn([0, 1, 0], [400, 410, 420])], [0, 256, 512], block_size=7
    )
    low, high = bins[0]["tau"]["ci95"]
    assert 1.0 <= low and high <= 8.0 and bins[0]["num_turns"] == 2


def test_sweep_prompts_read_past_num_prompts_in_order():
    bench = load_recipe("tiny", ["bench.datasets=[tiny-eval]", "bench.num_prompts=3"]).bench
    main = [c.user_turns[0] for c in load_datasets(bench)[0].conversations]
    prompts = list(sweep_prompts(bench))
    assert len(prompts) == 200 and {label for label, _ in prompts} == {"tiny-eval"}
    assert [text for _, text in prompts[:3]] == main  # the main runs' prompts first, then the rest
    assert len({text for _, text in prompts}) == 200


def test_plot_and_table_show_every_bin_with_its_turns(tmp_path):
    import json

    from PIL import Image

    from dspark_cli.artifacts.bench import BenchSummary
    from dspark_cli.bench.plots import plot_context
    from dspark_cli.bench.report import context_markdown

    chain = [_turn([4, 3, 2], [20 + 150 * k, 200 + 150 * k, 700 + 40 * k]) for k in range(4)]
    bins = by_context(chain, bin_edges(1024), block_size=7)
    sweep = {
        "dataset": "tiny-eval-chained",
        "temperature": 0.0,
        "datasets": ["tiny-eval"],
        "num_conversations": 2,
        "turns_per_conversation": [2, 2],
        "longest_context": 823,
        "max_model_len": 1024,
        "num_turns": 4,
        "bins": bins,
        "note": drop_note(bins),
    }
    offline = {
        "runs": [{"dataset": "tiny-eval", "temperature": 0.0, "by_context": by_context(chain[:1], [0, 128], 7)}],
        "context_sweep": [sweep],
    }
    assert [b["high"] for b in bins] == [128, 256, 512, 1024]
    path = plot_context(BenchSummary.from_dict({"offline": offline}), tmp_path / "context_sweep.png")
    with Image.open(path) as image:
        assert json.loads(image.text["Description"])["series"] == [
            "tiny-eval-chained T=0 (sweep: 2 conversations)",
            "tiny-eval T=0",
        ]
    text = "\n".join(context_markdown(BenchSummary.from_dict({"offline": offline}).offline))
    assert "2 conversations, 4 turns, longest context 823 of 1024 tokens" in text and "| 512-1024 | 5 | 4 |" in text
