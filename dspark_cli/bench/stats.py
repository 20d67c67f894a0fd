"""Acceptance statistics with confidence intervals (standard library only).

    turns = [TurnStats("writing", accepted=[3, 0, 7], verified=[7, 7, 7], output_tokens=12, seconds=0.4), ...]
    summary = summarize(turns, block_size=7)
    summary["tau"]          # {"mean": 2.33, "ci95": [1.9, 2.8], "n": ...}

tau is tokens per verification step, bonus included: sum(accepted + 1) / steps, pooled over all
steps. Steps within one turn are correlated (an easy answer is easy all along), so the intervals
treat each turn as one cluster: the ratio estimator's cluster-robust (delta-method) standard error,
se^2 = sum_j (y_j - R n_j)^2 / (m (m - 1) nbar^2) over m turns with y_j tokens in n_j steps, and
a 95% interval R +- t se with Student's t quantile for m - 1 degrees of freedom (12.7 for 2 turns,
2.09 for 20, 1.96 in the limit: few clusters give honestly wide intervals), clipped to the range
the quantity can take (tau within [1, N + 1], an acceptance rate within [0, 1]); one turn gives no
interval. Per-position acceptance (position i accepted in a step when at least i + 1 drafts were)
uses the same estimator, with steps as the denominator, which is exactly what vLLM's
`spec_decode_num_accepted_tokens_per_pos / spec_decode_num_drafts` measures.
"""

from __future__ import annotations

import functools
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


def _t_central(t: float, df: int) -> float:
    """P(|T| < t) for Student's t with integer df: the closed form of Abramowitz & Stegun 26.7.3-4."""
    theta = math.atan(t / math.sqrt(df))
    s, c = math.sin(theta), math.cos(theta)
    if df == 1:
        return 2 * theta / math.pi
    if df % 2:  # odd: (2/pi) (theta + sin cos (1 + 2/3 cos^2 + 2*4/(3*5) cos^4 + ...)), df - 1 terms in all
        term, total = c, c
        for i in range(1, (df - 1) // 2):
            term *= c * c * (2 * i) / (2 * i + 1)
            total += term
        return 2 / math.pi * (theta + s * total)
    term, total = 1.0, 1.0  # even: sin (1 + 1/2 cos^2 + 1*3/(2*4) cos^4 + ...)
    for i in range(1, df // 2):
        term *= c * c * (2 * i - 1) / (2 * i)
        total += term
    return s * total


@functools.lru_cache(maxsize=512)
def t95(df: int) -> float:
    """The 0.975 quantile of Student's t with df degrees of freedom (a two-sided 95% interval's multiplier)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    low, high = 1.9, 13.0  # t95(inf) = 1.96, t95(1) = 12.71
    for _ in range(100):
        mid = (low + high) / 2
        if _t_central(mid, df) < 0.95:
            low = mid
        else:
            high = mid
    return (low + high) / 2


@dataclass
class TurnStats:
    category: str
    accepted: list[int] = field(default_factory=list)  # per verification step
    verified: list[int] = field(default_factory=list)  # drafts sent to the target per step
    output_tokens: int = 0
    seconds: float = 0.0
    confidences: list[list[float] | None] = field(default_factory=list)  # per step: the head's confidences
    contexts: list[int] = field(default_factory=list)  # per step: context length at the anchor


def ratio_estimate(
    numerators: Sequence[float], denominators: Sequence[float], bounds: tuple[float, float] | None = None
) -> dict[str, Any]:
    """Pooled ratio sum(y) / sum(n) over clusters with a cluster-robust 95% t interval, clipped to `bounds`
    (the values the ratio can take); `clusters` counts the clusters with steps (m)."""
    pairs = [(y, n) for y, n in zip(numerators, denominators, strict=True) if n > 0]
    total_n = sum(n for _, n in pairs)
    if not pairs or total_n <= 0:
        return {"mean": None, "ci95": [None, None], "n": 0, "clusters": 0}
    ratio = sum(y for y, _ in pairs) / total_n
    m = len(pairs)
    if m < 2:
        return {"mean": ratio, "ci95": [None, None], "n": total_n, "clusters": m}
    nbar = total_n / m
    var = sum((y - ratio * n) ** 2 for y, n in pairs) / (m * (m - 1) * nbar * nbar)
    half = t95(m - 1) * math.sqrt(var)
    low, high = ratio - half, ratio + half
    if bounds is not None:
        low, high = max(low, bounds[0]), min(high, bounds[1])
    return {"mean": ratio, "ci95": [low, high], "n": total_n, "clusters": m}


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
    out: dict[str, Any] = {
        "num_turns": len(turns),
        "num_steps": sum(steps),
        "tau": ratio_estimate(tokens, steps, bounds=(1.0, block_size + 1.0)),
    }
    if brief:
        return out
    out["acceptance_per_position"] = [
        ratio_estimate([sum(1 for a in t.accepted if a > i) for t in turns], steps, bounds=(0.0, 1.0))
        for i in range(block_size)
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
