"""Bench statistics, the /metrics parser and the report (JSON, Markdown, PNG plots with their series).

.venv/bin/python -m pytest tests/bench/test_bench_report.py -q
"""

from __future__ import annotations

import json
import random

import pytest
from PIL import Image

from dspark_cli.artifacts.bench import BenchSummary
from dspark_cli.bench.calibration import calibration
from dspark_cli.bench.endpoint import counter_delta, parse_prometheus, spec_counters, speedups
from dspark_cli.bench.report import markdown, reference_rows, terminal_tables, write_report
from dspark_cli.bench.stats import TurnStats, percentile, ratio_estimate, summarize

VLLM_METRICS = """\
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="tiny-mla"} 120.0
# HELP vllm:spec_decode_num_drafts_created Number of spec decoding drafts.
vllm:spec_decode_num_drafts_created{engine="0",model_name="tiny-mla"} 1.7e+09
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="tiny-mla"} 360.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="tiny-mla"} 150.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="tiny-mla",position="0"} 80.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="tiny-mla",position="1"} 45.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="tiny-mla",position="2"} 25.0
vllm:num_requests_running{engine="0",model_name="tiny-mla"} 0.0
"""


def test_prometheus_parser_and_spec_counters():
    parsed = parse_prometheus(VLLM_METRICS)
    assert parsed["vllm:num_requests_running"] == [({"engine": "0", "model_name": "tiny-mla"}, 0.0)]
    counters = spec_counters(VLLM_METRICS)
    assert counters == {
        "num_drafts": 120.0,
        "num_draft_tokens": 360.0,
        "num_accepted_tokens": 150.0,
        "num_accepted_tokens_per_pos": [80.0, 45.0, 25.0],
    }
    before = {
        "num_drafts": 20.0,
        "num_draft_tokens": 60.0,
        "num_accepted_tokens": 50.0,
        "num_accepted_tokens_per_pos": [30.0, 15.0, 5.0],
    }
    delta = counter_delta(before, counters)
    assert delta["num_drafts"] == 100 and delta["num_accepted_tokens"] == 100
    assert delta["tau"] == pytest.approx(2.0)  # 1 + 100 accepted / 100 drafting steps
    assert delta["acceptance_per_position"] == pytest.approx([0.5, 0.3, 0.2])
    assert spec_counters("vllm:num_requests_running 0.0\n") is None  # no speculation on this server


def test_ratio_estimate_interval_covers_the_truth():
    """Clustered data (a per-turn easiness): the 95% interval covers the true tau ~95% of the time."""
    rng = random.Random(0)
    true_tau, hits, trials = None, 0, 300
    for _ in range(trials):
        num, den = [], []
        for _turn in range(40):
            p = min(0.95, max(0.05, rng.gauss(0.6, 0.2)))  # this turn's acceptance probability
            steps = rng.randint(5, 30)
            tokens = sum(1 + sum(1 for _ in range(4) if rng.random() < p) for _ in range(steps))
            num.append(tokens)
            den.append(steps)
        est = ratio_estimate(num, den)
        true_tau = 1 + 4 * 0.6  # E[1 + Binomial(4, p)] with E[p] = 0.6 (the truncation is symmetric)
        hits += est["ci95"][0] <= true_tau <= est["ci95"][1]
    assert 0.90 <= hits / trials <= 0.99, hits / trials


def test_summarize_counts_tau_and_positions():
    turns = [
        TurnStats("a", accepted=[2, 0, 3], verified=[3, 3, 3], output_tokens=8, seconds=2.0),
        TurnStats("b", accepted=[1, 1], verified=[3, 2], output_tokens=4, seconds=1.0),
    ]
    out = summarize(turns, block_size=3)
    assert out["tau"]["mean"] == pytest.approx((3 + 1 + 4 + 2 + 2) / 5)
    assert [p["mean"] for p in out["acceptance_per_position"]] == pytest.approx([4 / 5, 2 / 5, 1 / 5])
    assert out["verified_per_step"] == pytest.approx((4 + 4 + 4 + 4 + 3) / 5)
    assert out["tokens_per_second"] == pytest.approx(4.0)
    assert out["by_category"]["b"]["tau"]["mean"] == pytest.approx(2.0)
    assert percentile([1, 2, 3, 4], 50) == pytest.approx(2.5)


def _result() -> BenchSummary:
    per_pos = [{"mean": 0.8 - 0.1 * i, "ci95": [0.7 - 0.1 * i, 0.9 - 0.1 * i], "n": 10} for i in range(4)]
    run = {
        "dataset": "mt_bench",
        "temperature": 1.0,
        "threshold": 0.0,
        "num_turns": 4,
        "num_steps": 40,
        "tau": {"mean": 3.1, "ci95": [2.8, 3.4], "n": 40},
        "acceptance_per_position": per_pos,
        "verified_per_step": 5.0,
        "drafts_per_step": 4.0,
        "output_tokens": 120,
        "seconds": 2.0,
        "tokens_per_second": 60.0,
        "by_category": {
            "writing": {"num_turns": 2, "num_steps": 20, "tau": {"mean": 3.3, "ci95": [3.0, 3.6], "n": 20}},
            "math": {"num_turns": 2, "num_steps": 20, "tau": {"mean": 2.9, "ci95": [2.5, 3.3], "n": 20}},
        },
    }
    run["calibration"] = calibration(
        [
            TurnStats(
                "all",
                [2, 0, 1, 4],
                [4, 4, 4, 4],
                0,
                0.0,
                [[0.9, 0.7, 0.5, 0.4], [0.3, 0.5, 0.5, 0.5], [0.8, 0.4, 0.3, 0.2], [0.95, 0.9, 0.9, 0.8]],
            )
        ],
        4,
    )
    sweep = [
        {
            "dataset": "mt_bench",
            "temperature": 1.0,
            "threshold": t,
            "tau": 3.1 - t,
            "tau_ci95": [None, None],
            "verified_per_step": 5.0 - 3 * t,
            "drafts_per_step": 4.0 - 3 * t,
            "tokens_per_verified": (3.1 - t) / (5.0 - 3 * t),
            "tokens_per_second": 60.0,
        }
        for t in (0.0, 0.3, 0.7)
    ]
    engine = {
        "num_speculative_tokens": 4,
        "rejection_sample_method": "block",
        "draft_sample_method": "probabilistic",
        "top_p": 1.0,
        "max_tokens": 32,
        "device": "cpu",
        "dtype": "float32",
        "warnings": [],
    }

    def level(c, tps, tau):
        spec = (
            None
            if tau is None
            else {
                "num_drafts": 10 * c,
                "num_draft_tokens": 30 * c,
                "num_accepted_tokens": int(10 * c * (tau - 1)),
                "num_accepted_tokens_per_pos": [6 * c, 4 * c, 2 * c],
                "tau": tau,
            }
        )
        return {
            "concurrency": c,
            "temperature": 0.0,
            "output_tokens_per_second": tps,
            "ttft_mean": 0.05,
            "tpot_mean": 1 / tps,
            "spec_decode": spec,
        }

    endpoint = {
        "endpoint": "http://spec",
        "datasets": ["mt_bench"],
        "levels": [level(1, 30.0, 2.2), level(4, 80.0, 2.1)],
    }
    baseline = {
        "endpoint": "http://base",
        "datasets": ["mt_bench"],
        "levels": [level(1, 20.0, None), level(4, 70.0, None)],
    }
    online = {"endpoint_runs": endpoint, "baseline_runs": baseline, "speedup": speedups(endpoint, baseline)}
    result = BenchSummary.from_dict(
        {
            "name": "unit",
            "target": "tiny",
            "draft_dir": "d",
            "warnings": [],
            "offline": {"engine": engine, "runs": [run], "confidence_sweep": sweep},
            "online": online,
        }
    )
    result.reference = reference_rows(result, {"mt_bench_tau_t1": 3.72, "mt_bench_tau_t0": 4.0})
    return result


def test_speedup_is_the_throughput_ratio():
    rows = _result().online.speedup
    assert [r.speedup for r in rows] == pytest.approx([1.5, 80 / 70])


def test_report_files_plots_and_tables(tmp_path):
    result = _result()
    files = write_report(result, tmp_path)
    data = json.loads((tmp_path / "bench.json").read_text())
    assert data["reference"][0] == {"key": "mt_bench_tau_t1", "reference": 3.72, "offline": 3.1, "online": None}
    assert data["reference"][1]["online"] == pytest.approx(2.2)  # the online T=0 tau beside its reference
    expected = {
        "acceptance_per_position": ["offline mt_bench T=1", "online T=0"],
        "tau_by_category": ["mt_bench T=1", "reference mt_bench_tau_t1"],  # no T=0 run: no t0 line
        "throughput_vs_concurrency": ["speculative T=0", "baseline T=0"],
        "confidence_tradeoff": ["mt_bench T=1"],
        "calibration": ["mt_bench T=1"],
    }
    assert set(files["plots"]) == set(expected)
    for name, series in expected.items():
        path = tmp_path / f"{name}.png"
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        with Image.open(path) as image:
            image.load()
            meta = json.loads(image.text["Description"])
            colours = len(image.convert("RGB").getcolors(maxcolors=1 << 24))
        assert meta == {"kind": name, "series": series}
        assert colours > 10, f"{name} looks blank"
    text = (tmp_path / "bench.md").read_text()
    assert "3.10 [2.80, 3.40]" in text and "3.72" in text and "![tau_by_category](tau_by_category.png)" in text
    assert "| mt_bench | 1 | 0.7 |" in text  # the confidence sweep row
    assert "### Calibration of the confidence head" in text and "mt_bench T=1: " in text
    titles = [t[0] for t in terminal_tables(result)]
    assert titles[0].startswith("offline") and titles[-1] == "online: http://spec"
    assert "1.50" in str(terminal_tables(result)[-1][2][0])
    assert markdown(result, {}).count("## ") >= 3


def test_bench_json_reads_into_its_records_and_back_unchanged(tmp_path):
    write_report(_result(), tmp_path)
    written = json.loads((tmp_path / "bench.json").read_text())
    report = BenchSummary.from_dict(written)
    assert json.dumps(report.to_dict()) == json.dumps(written)  # every key, in its order
    run = report.offline.runs[0]
    assert run.tau.ci95 == [2.8, 3.4] and run.by_category["math"].tau.mean == 2.9
    assert run.calibration.positions[0].position == 1 and report.online.speedup[0].speedup == pytest.approx(1.5)
    # an older, partial report (the shape publish's tests write): fields it lacks default, no key is added,
    # a key this version does not know is kept
    old = {
        "kind": "dspark.bench",
        "draft_dir": "d",
        "offline": {
            "runs": [
                {"dataset": "tiny-eval", "temperature": 0.0, "threshold": 0.5, "tau": {"mean": 2.0, "n": 100}},
            ]
        },
        "files": {"checksums": {"bench.md": "00"}},
        "later": {"a": 1},
    }
    typed = BenchSummary.from_dict(old)
    assert json.dumps(typed.to_dict()) == json.dumps(old)
    assert typed.offline.runs[0].tau.ci95 == [None, None] and typed.complete is None and typed.tau_lines() == []
