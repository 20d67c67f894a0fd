"""Is the confidence head calibrated? Predicted against observed acceptance, per draft position.

    from dspark_cli.bench.calibration import calibration
    report = calibration(turns, block_size=7)      # turns: TurnStats with per-step confidences
    report["overall"]["ece"], report["positions"][0]["brier"], report["verdict"]

What the head predicts. The confidence head is trained on `clamp(1 - L1/2, 0, 1)` of slot i with the
true prefix fed to the Markov head (docs/train.md), i.e. the probability that slot i is accepted
*given that slots 0 .. i-1 were*; vLLM's adaptive verification multiplies the confidences along a
draft into a survival probability. So the events checked are, for every verification step and every
verified slot i that was reached (the first i drafts accepted): the prediction `c_i` and the outcome
`y_i = 1` if slot i was accepted too. Per position and pooled over positions:

- reliability bins: `num_bins` equal-width bins of the prediction over [0, 1] (a prediction of exactly 1
  falls in the last), each with its count, mean prediction and observed acceptance rate;
- expected calibration error `ECE = sum_b (n_b / n) |observed_b - predicted_b|`;
- Brier score `mean((c_i - y_i)^2)`;
- AUC (the probability that an accepted slot got a higher confidence than a rejected one, ties
  counting one half): calibration alone cannot tell a head that ranks from a constant equal to the
  base rate, which has ECE 0 and AUC 0.5.

Per position the report also gives the mean predicted survival (the product of the confidences up to
the slot, what vLLM ranks by) against the observed acceptance rate of that position over all steps,
the number `acceptance_per_position` reports.

The verdict: `miscalibrated` when the pooled ECE exceeds `ECE_LIMIT` (0.10), `uninformative` when
the AUC is at most `AUC_LIMIT` (0.55: it does not rank drafts, so survival-based selection is
blind), else `calibrated`. Standard library only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

ECE_LIMIT = 0.10
AUC_LIMIT = 0.55
NUM_BINS = 10


def reliability(pairs: Sequence[tuple[float, int]], num_bins: int = NUM_BINS) -> dict[str, Any]:
    """ECE, Brier score, AUC and reliability bins of (prediction, outcome) pairs."""
    n = len(pairs)
    if n == 0:
        return {"n": 0, "predicted": None, "observed": None, "ece": None, "brier": None, "auc": None, "bins": []}
    bins: list[list[tuple[float, int]]] = [[] for _ in range(num_bins)]
    for p, y in pairs:
        bins[max(0, min(int(p * num_bins), num_bins - 1))].append((p, y))
    rows, ece = [], 0.0
    for b, members in enumerate(bins):
        if not members:
            continue
        predicted = sum(p for p, _ in members) / len(members)
        observed = sum(y for _, y in members) / len(members)
        ece += len(members) / n * abs(observed - predicted)
        rows.append(
            {
                "low": b / num_bins,
                "high": (b + 1) / num_bins,
                "n": len(members),
                "predicted": predicted,
                "observed": observed,
            }
        )
    return {
        "n": n,
        "predicted": sum(p for p, _ in pairs) / n,
        "observed": sum(y for _, y in pairs) / n,
        "ece": ece,
        "brier": sum((p - y) ** 2 for p, y in pairs) / n,
        "auc": auc(pairs),
        "bins": rows,
    }


def auc(pairs: Sequence[tuple[float, int]]) -> float | None:
    """Mann-Whitney AUC: P(prediction of an accepted slot > that of a rejected one), ties 1/2."""
    ordered = sorted(pairs)
    positives = sum(y for _, y in pairs)
    negatives = len(pairs) - positives
    if positives == 0 or negatives == 0:
        return None
    rank_sum, i = 0.0, 0
    while i < len(ordered):  # average ranks over ties
        j = i
        while j < len(ordered) and ordered[j][0] == ordered[i][0]:
            j += 1
        mid_rank = (i + 1 + j) / 2
        rank_sum += mid_rank * sum(y for _, y in ordered[i:j])
        i = j
    return (rank_sum - positives * (positives + 1) / 2) / (positives * negatives)


def calibration(turns: Sequence[Any], block_size: int, num_bins: int = NUM_BINS) -> dict[str, Any] | None:
    """The calibration report of the steps in `turns` (TurnStats with `confidences`); None without any."""
    conditional: list[list[tuple[float, int]]] = [[] for _ in range(block_size)]
    survival: list[list[tuple[float, int]]] = [[] for _ in range(block_size)]
    for turn in turns:
        for confidences, accepted, verified in zip(turn.confidences, turn.accepted, turn.verified, strict=True):
            if confidences is None:
                continue
            alive = 1.0
            for i in range(min(verified, len(confidences), block_size)):
                alive *= confidences[i]
                survival[i].append((alive, int(accepted > i)))
                if accepted >= i:  # slot i was reached: the first i drafts were accepted
                    conditional[i].append((confidences[i], int(accepted > i)))
    if not any(conditional):
        return None
    positions = []
    for i in range(block_size):
        row = reliability(conditional[i], num_bins)
        n_all = len(survival[i])
        row["position"] = i + 1
        row["predicted_survival"] = sum(p for p, _ in survival[i]) / n_all if n_all else None
        row["observed_acceptance"] = sum(y for _, y in survival[i]) / n_all if n_all else None
        positions.append(row)
    overall = reliability([pair for slot in conditional for pair in slot], num_bins)
    verdict, reasons = judge(overall)
    return {"num_bins": num_bins, "overall": overall, "positions": positions, "verdict": verdict, "reasons": reasons}


def judge(overall: dict[str, Any]) -> tuple[str, list[str]]:
    """('calibrated' | 'miscalibrated' | 'uninformative', the reasons in words)."""
    reasons, verdict = [], "calibrated"
    if overall["ece"] is not None and overall["ece"] > ECE_LIMIT:
        verdict = "miscalibrated"
        reasons.append(
            f"ECE {overall['ece']:.3f} > {ECE_LIMIT:g}: predicted {overall['predicted']:.2f} "
            f"on average, observed {overall['observed']:.2f}"
        )
    if overall["auc"] is not None and overall["auc"] <= AUC_LIMIT:
        verdict = "miscalibrated" if verdict == "miscalibrated" else "uninformative"
        reasons.append(
            f"AUC {overall['auc']:.2f} <= {AUC_LIMIT:g}: the confidences do not rank accepted above rejected drafts"
        )
    if not reasons:
        auc_text = f", AUC {overall['auc']:.2f}" if overall["auc"] is not None else ""
        reasons.append(f"ECE {overall['ece']:.3f} <= {ECE_LIMIT:g}{auc_text}")
    return verdict, reasons
