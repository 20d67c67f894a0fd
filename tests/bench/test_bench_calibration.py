"""The confidence head's calibration report (bench/calibration.py) against hand-computed numbers.

    .venv/bin/python -m pytest tests/bench/test_bench_calibration.py -q        # < 5 s

The engine-level check, a trained draft's head beside the same head replaced by a constant, is in
tests/bench/test_bench_trained.py (it needs the trained draft made there).
"""

from __future__ import annotations

import random

import pytest

from dspark_cli.bench.calibration import auc, calibration
from dspark_cli.bench.stats import TurnStats


def _turn(steps):
    """steps: (confidences, accepted); every draft verified."""
    return TurnStats("all", [a for _, a in steps], [len(c) for c, _ in steps], 0, 0.0, [c for c, _ in steps])


def test_hand_computed_case():
    # slot pairs (confidence, accepted) of the slots reached:
    # position 1: (.9, 1) (.9, 0) (.3, 1) (.25, 0); position 2: (.5, 1) (.8, 0)
    turn = _turn([([0.9, 0.5], 2), ([0.9, 0.5], 0), ([0.3, 0.8], 1), ([0.25, 0.8], 0)])
    cal = calibration([turn], block_size=2)
    first, second = cal["positions"]
    assert first["n"] == 4 and second["n"] == 2
    # bins: [.9, .9] pred .9 obs .5; [.3] obs 1; [.25] obs 0 -> 2/4 * .4 + 1/4 * .7 + 1/4 * .25
    assert first["ece"] == pytest.approx(0.4375)
    assert first["brier"] == pytest.approx((0.01 + 0.81 + 0.49 + 0.0625) / 4)
    assert second["ece"] == pytest.approx(0.5 * 0.5 + 0.5 * 0.8)
    assert second["brier"] == pytest.approx((0.25 + 0.64) / 2)
    overall = cal["overall"]
    assert overall["n"] == 6
    assert overall["ece"] == pytest.approx((2 * 0.4 + 0.7 + 0.25 + 0.5 + 0.8) / 6)
    assert overall["brier"] == pytest.approx((1.3725 + 0.89) / 6)
    assert overall["auc"] == pytest.approx(4.5 / 9)  # the .9/.9 tie counts one half
    assert [(b["low"], b["n"]) for b in overall["bins"]] == [(0.2, 1), (0.3, 1), (0.5, 1), (0.8, 1), (0.9, 2)]
    # survival: the product of confidences, over every step, against P(position accepted)
    assert first["predicted_survival"] == pytest.approx((0.9 + 0.9 + 0.3 + 0.25) / 4)
    assert first["observed_acceptance"] == pytest.approx(0.5)
    assert second["predicted_survival"] == pytest.approx((0.45 + 0.45 + 0.24 + 0.2) / 4)
    assert second["observed_acceptance"] == pytest.approx(0.25)
    assert cal["verdict"] == "miscalibrated" and len(cal["reasons"]) == 2


def test_auc_matches_pair_counting():
    rng = random.Random(1)
    pairs = [(round(rng.random(), 1), int(rng.random() < 0.5)) for _ in range(200)]
    pos = [p for p, y in pairs if y]
    neg = [p for p, y in pairs if not y]
    slow = sum(1.0 if a > b else 0.5 if a == b else 0.0 for a in pos for b in neg) / (len(pos) * len(neg))
    assert auc(pairs) == pytest.approx(slow)


def _simulated(confidence, steps=4000, block=4, seed=0):
    """Steps whose slots are accepted with the true probability `truth` while the head says `confidence`."""
    rng = random.Random(seed)
    out = []
    for _ in range(steps):
        truth = [rng.uniform(0.2, 0.95) for _ in range(block)]
        accepted = 0
        while accepted < block and rng.random() < truth[accepted]:
            accepted += 1
        out.append((confidence(truth), accepted))
    return _turn(out)


def test_an_honest_head_is_calibrated_and_a_constant_is_not():
    honest = calibration([_simulated(lambda truth: truth)], block_size=4)
    assert honest["verdict"] == "calibrated", honest["reasons"]
    assert honest["overall"]["ece"] < 0.03 and honest["overall"]["auc"] > 0.6
    for row in honest["positions"]:
        assert row["predicted_survival"] == pytest.approx(row["observed_acceptance"], abs=0.03)
    constant = calibration([_simulated(lambda truth: [0.9] * len(truth))], block_size=4)
    assert constant["verdict"] == "miscalibrated"
    assert constant["overall"]["auc"] == pytest.approx(0.5)  # a constant ranks nothing
    assert constant["overall"]["ece"] == pytest.approx(0.9 - constant["overall"]["observed"])
    assert len(constant["overall"]["bins"]) == 1
    # a constant at the base rate has no calibration error, and still ranks nothing
    base = constant["overall"]["observed"]
    flat = calibration([_simulated(lambda truth: [base] * len(truth))], block_size=4)
    assert flat["verdict"] == "uninformative"


def test_steps_without_confidences_give_no_report():
    turn = TurnStats("all", [1, 2], [3, 3], 0, 0.0, [None, None])
    assert calibration([turn], block_size=3) is None


def test_the_model_card_shows_the_calibration(tmp_path):
    import json
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from bench_support import export_random_draft

    from dspark_cli.artifacts.bench import BenchSummary
    from dspark_cli.publish.card import model_card
    from dspark_cli.recipe import load_recipe

    recipe = load_recipe("tiny", [f"output_dir={tmp_path}"])
    draft = export_random_draft(recipe, tmp_path / "draft")
    cal = calibration([_turn([([0.9, 0.5], 2), ([0.9, 0.5], 0), ([0.3, 0.8], 1), ([0.25, 0.8], 0)])], block_size=2)
    bench = BenchSummary.from_dict(
        {
            "offline": {
                "runs": [
                    {
                        "dataset": "tiny-eval",
                        "temperature": 1.0,
                        "threshold": 0.0,
                        "num_turns": 1,
                        "tau": {"mean": 2.0, "ci95": [1.5, 2.5], "n": 4},
                        "calibration": cal,
                    }
                ]
            }
        }
    )
    manifest = json.loads((draft / "dspark_manifest.json").read_text())
    card = model_card(draft, manifest, repo_id="me/tiny-dspark", recipe=recipe, license_id="apache-2.0", bench=bench)
    assert "## Confidence head calibration" in card
    assert "| tiny-eval | 1 | 6 | 0.61 | 0.50 | 0.508 | 0.377 | 0.50 | miscalibrated |" in card
