"""The acceptance profile: `dspark bench --offline` writes speculation_profile.json beside bench.json, a
re-export copies it into the draft, `dspark serve` recommends num_speculative_tokens from it.

    .venv/bin/python -m pytest tests/bench/test_bench_profile.py -q

One small offline bench of a random tiny-gqa draft (tests/bench_support.py's SMALL_BENCH) feeds every test:
the profile must repeat bench.json's per-position figures with the counts behind them, and serve's
recommendation must equal an exhaustive search over k evaluated by a slow loop written here.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from bench_support import PUBLISHED_RECIPE, SMALL_BENCH, export_random_draft
from cli_support import invoke

from dspark_cli.artifacts.profile import PROFILE, find_profile, read_profile
from dspark_cli.bench.adaptive import load_cost_model
from dspark_cli.bench.profile import recommend
from dspark_cli.export import verify_draft
from dspark_cli.recipe import load_recipe

pytestmark = pytest.mark.usefixtures("one_thread")

# a table whose verification cost grows with the tokens verified, so the best k lies inside 1 .. N
RISING = {"draft_curve": [[1, 1.0], [64, 1.0]], "verify_curve": [[1, 3.0], [2, 3.5], [3, 5.0], [4, 6.5], [5, 8.0]]}


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> dict[str, Path]:
    """runs/<tmp>: a random tiny-gqa draft exported by `dspark export`, benched offline (SMALL_BENCH)."""
    root = tmp_path_factory.mktemp("profile")
    recipe = load_recipe("tiny", [*PUBLISHED_RECIPE[2:], f"output_dir={root}", "export.dtype=float32"])
    draft = export_random_draft(recipe, root / "draft")
    result = invoke("bench", str(draft), "--offline", *SMALL_BENCH, "--format", "json")
    assert result.exit_code == 0, result.output
    return {"root": root, "draft": draft, "bench": root / "bench", "train": root / "draft-train"}


def slow_throughput(doc: dict, temperature: float, k: int, cost: dict) -> float:
    """Tokens per modelled ms at concurrency 1 verifying k drafts, from the profile's counts and the cost table
    as written (each curve made non-decreasing; a size costs what the next profiled size costs)."""
    entries = [e for e in doc["profiles"] if e["temperature"] == temperature]
    steps = sum(e["num_steps"] for e in entries)
    tokens = 1.0
    for position in range(k):
        tokens += sum(e["positions"][position]["accepted"] for e in entries) / steps

    def padded(curve: list[list[float]], size: int) -> float:
        best, running = None, float("-inf")
        for point, ms in sorted(curve):
            running = max(running, ms)
            if best is None and point >= size:
                best = running
        return best if best is not None else running

    return tokens / (padded(cost["draft_curve"], 1) + padded(cost["verify_curve"], k + 1))


@pytest.mark.slow  # the module's offline bench of a tiny-gqa draft: ~15 s loaded
def test_the_profile_repeats_bench_json_per_position_with_counts(run):
    report = json.loads((run["bench"] / "bench.json").read_text())
    doc = read_profile(run["bench"] / PROFILE)
    assert doc["format"] == "dspark.speculation_profile" and doc["version"] == 1
    assert report["files"]["profile"] == PROFILE and PROFILE in report["files"]["checksums"]
    weights = hashlib.sha256((run["draft"] / "model.safetensors").read_bytes()).hexdigest()
    assert doc["draft"]["weights_sha256"] == weights
    assert doc["draft"]["block_size"] == 4 and doc["draft"]["target"] == "tiny-gqa"
    runs = [r for r in report["offline"]["runs"] if r["threshold"] == 0.0]
    assert [(e["dataset"], e["temperature"]) for e in doc["profiles"]] == [
        (r["dataset"], r["temperature"]) for r in runs
    ]
    for entry, measured in zip(doc["profiles"], runs, strict=True):
        assert entry["marginal_accept_rates"] == [p["mean"] for p in measured["acceptance_per_position"]]
        assert entry["tau"] == measured["tau"]["mean"] and entry["num_steps"] == measured["num_steps"]
        given = entry["num_steps"]
        for i, position in enumerate(entry["positions"]):
            assert position["position"] == i and position["given"] == given
            assert position["accepted"] <= given  # acceptance is a prefix
            assert position["marginal"] == pytest.approx(position["accepted"] / entry["num_steps"], abs=1e-12)
            assert position["conditional"] == (position["accepted"] / given if given else None)
            given = position["accepted"]
        assert entry["tau"] == pytest.approx(1 + sum(entry["marginal_accept_rates"]), abs=1e-9)


@pytest.mark.slow  # the module's offline bench of a tiny-gqa draft: ~15 s loaded
@pytest.mark.parametrize("cost", ["h200-estimate", "rising"])
def test_the_recommendation_is_the_exhaustive_best_k(run, cost):
    doc = read_profile(run["bench"] / PROFILE)
    table = RISING if cost == "rising" else load_cost_model(cost).describe()
    for temperature in (0.0, 1.0):
        [advice] = recommend(doc, cost=load_cost_model(table), temperature=temperature)
        scores = {k: slow_throughput(doc, temperature, k, table) for k in range(1, 5)}
        assert advice["k"] == max(scores, key=lambda k: (scores[k], -k))
        for row in advice["rows"][1:]:
            assert 1e3 * scores[row["k"]] == pytest.approx(row["tokens_per_second"], rel=1e-9)


def test_an_interior_optimum_is_found():
    """A profile whose later positions are rarely accepted: with a rising cost, k = 2 is the best by hand."""
    positions = [{"accepted": a} for a in (90, 80, 5, 1)]
    doc = {"profiles": [{"temperature": 0.0, "dataset": "x", "num_steps": 100, "positions": positions,
                         "marginal_accept_rates": [0.9, 0.8, 0.05, 0.01]}]}  # fmt: skip
    [advice] = recommend(doc, cost=load_cost_model(RISING))
    # tokens/ms: k=0 (the target alone) 1/3=0.333, k=1 1.9/4.5=0.422, k=2 2.7/6=0.45, k=3 2.75/7.5=0.367, k=4 2.76/9=0.307
    assert advice["k"] == 2 and advice["speculation_pays"]


@pytest.mark.slow  # the module's offline bench of a tiny-gqa draft: ~15 s loaded
def test_export_after_bench_places_the_profile_and_serve_recommends_from_it(run):
    from dspark_cli.export.run import export_checkpoint

    recipe = load_recipe("tiny", [*PUBLISHED_RECIPE[2:], f"output_dir={run['root']}", "export.dtype=float32"])
    export_checkpoint(run["train"], recipe=recipe, force=True)  # the same weights again: the profile follows
    placed = run["draft"] / PROFILE
    assert json.loads(placed.read_text()) == json.loads((run["bench"] / PROFILE).read_text())
    verify_draft(run["draft"], "tiny-gqa")  # outside the manifest's checksums: the draft still verifies
    assert find_profile(run["draft"])[1] == placed
    result = invoke("serve", str(run["draft"]), "--dry-run", "--explain", "serve.expected_temperature=1.0")
    assert result.exit_code == 0, result.output
    [advice] = recommend(read_profile(placed), cost=load_cost_model("h200-estimate"), temperature=1.0)
    assert f"recommended num_speculative_tokens at T=1: {advice['k']}" in result.output
    assert "modelled tokens/s" in result.output and "<- recommended" in result.output
    # other weights in the same place: the profile no longer describes them and is not used, nor copied
    export_random_draft(recipe, run["root"] / "other", seed=1)
    assert find_profile(run["root"] / "other", run["bench"]) is None
    export_checkpoint(run["root"] / "other-train", recipe=recipe, output=run["root"] / "other2")
    assert not (run["root"] / "other2" / PROFILE).exists()
