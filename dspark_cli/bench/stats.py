"""Acceptance statistics with confidence intervals (standard library only).

    turns = [TurnStats("writing", accepted=[3, 0, 7], verified=[7, 7, 7], output_tokens=12, seconds=0.4), ...]
    summary = summarize(turns, block_size=7)
    summary["tau"]          # {"mean": 2.33, "ci95": [1.9, 2.8], "n": ...}

tau is tokens per verification step, bonus included: sum(accepted + 1) / steps, pooled over all
steps. Steps within one turn are correlated (an easy answer is easy all along), so the intervals
treat each turn as one cluster: the ratio estimator's cluster-robust (delta-method) standard error,
se^2 = sum_j (y_j - R n_j)^2 / (m (m - 1) nbar^2) over m turns with y_j tokens in n_j steps, and
a 95% normal interval R +- 1.96 se. Per-position acceptance (position i accepted in a step when at
least i + 1 drafts were) uses the same estimator, with steps as the denominator, which is exactly
what vLLM's `spec_decode_num_accepted_tokens_per_pos / spec_decode_num_drafts` measures.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

Z95 = 1.959963984540054


@dataclass
class TurnStats:
    category: str
    accepted: list[int] = field(default_factory=list)  # per verification step
    verified: list[int] = field(default_factory=list)  # drafts sent to the target per step
    output_tokens: int = 0
    seconds: float = 0.0
    confidences: list[list[float] | None] = field(default_factory=list)  # per step: the head's confidences
    contexts: list[int] = field(default_factory=list)  # per step: context length at the anchor


def ratio_estimate(numerators: Sequence[float], denominators: Sequence[float]) -> dict[str, Any]:
    """Pooled ratio sum(y) / sum(n) over clusters with a cluster-robust 95% interval."""
    pairs = [(y, n) for y, n in zip(numerators, denominators, strict=True) if n > 0]
    total_n = sum(n for _, n in pairs)
    if not pairs or total_n <= 0:
        return {"mean": None, "ci95": [None, None], "n": 0}
    ratio = sum(y for y, _ in pairs) / total_n
    m = len(pairs)
    if m < 2:
        return {"mean": ratio, "ci95": [None, None], "n": total_n}
    nbar = total_n / m
    var = sum((y - ratio * n) ** 2 for y, n in pairs) / (m * (m - 1) * nbar * nbar)
    half = Z95 * math.sqrt(var)
    return {"mean": ratio, "ci95": [ratio - half, ratio + half], "n": total_n}


def summarize(turns: Sequence[TurnStats], block_size: int) -> dict[str, Any]:
    """tau, per-position acceptance, verified tokens per step, speed; overall and by category."""
    out = _summary(turns, block_size)
    groups: dict[str, list[TurnStats]] = defaultdict(list)
    for turn in turns:
        groups[turn.category].append(turn)
    out["by_category"] = {name: _summary(group, block_size, brief=True) for name, group in sorted(groups.items())}
    return out


def _summary(turns: Sequence[TurnStats], block_size: int, brief: bool = False) -> dict[str, Any]:
    steps = [len(t.accepted) for t in turns]
    tokens = [sum(t.accepted) + len(t.accepted) for t in turns]
    out: dict[str, Any] = {"num_turns": len(turns), "num_steps": sum(steps), "tau": ratio_estimate(tokens, steps)}
    if brief:
        return out
    out["acceptance_per_position"] = [
        ratio_estimate([sum(1 for a in t.accepted if a > i) for t in turns], steps) for i in range(block_size)
    ]
    out["verified_per_step"] = ratio_estimate([sum(v + 1 for v in t.verified) for t in turns], steps)["mean"]
    out["drafts_per_step"] = ratio_estimate([sum(t.verified) for t in turns], steps)["mean"]
    seconds = sum(t.seconds for t in turns)
    out["output_tokens"] = sum(t.output_tokens for t in turns)
    out["seconds"] = seconds
    out["tokens_per_second"] = out["output_tokens"] / seconds if seconds > 0 else None
    return out


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0-100) by linear interpolation; None for no values."""
    ordered = sorted(values)
    if not ordered:
        return None
    position = (len(ordered) - 1) * q / 100.0
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None
