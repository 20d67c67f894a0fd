"""`dspark bench A B ... --offline`: several drafts in one report, on the same prompts, seeds and settings.

    .venv/bin/python -m pytest tests/bench/test_bench_many.py -q

Two random tiny-gqa drafts exported by `dspark export` (seeds 0 and 1, in folders both named `draft`)
and a published copy of the first. Each draft's numbers in the several-draft report must be exactly
its own single-draft bench's (so the prompts, seeds and settings were the same for all, and the target
loaded once changed nothing); the report is one folder owned by the set of drafts.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from bench_support import PUBLISHED_RECIPE, SMALL_BENCH, export_random_draft, write_random_draft
from cli_support import invoke
from PIL import Image

from dspark_cli.recipe import load_recipe

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def drafts(tmp_path_factory) -> dict[str, Path]:
    work = tmp_path_factory.mktemp("many")
    recipe = load_recipe("tiny", [*PUBLISHED_RECIPE[2:], f"output_dir={work / 'run'}"])
    a = export_random_draft(recipe, work / "a" / "draft", seed=0)
    b = export_random_draft(recipe, work / "b" / "draft", seed=1)
    published = work / "c" / "draft"
    published.mkdir(parents=True)
    for name in ("config.json", "model.safetensors"):
        shutil.copy2(a / name, published / name)
    return {"a": a, "b": b, "published": published}


def bench_json(*args: str) -> dict:
    result = invoke("bench", *args, *PUBLISHED_RECIPE, *SMALL_BENCH, "--format", "json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def numbers(offline: dict) -> dict:
    return {
        "runs": [[r["temperature"], r["tau"], r["acceptance_per_position"], r["calibration"]] for r in offline["runs"]],
        "sweep": [[s["threshold"], s["tau"]] for s in offline["confidence_sweep"]],
        "baselines": [[b["name"], b["temperature"], b["tau"]] for b in offline["baselines"]],
        "adaptive": offline["adaptive_verification"]["runs"],
    }


@pytest.mark.slow  # three offline benches of tiny-gqa (two single, one of three drafts): ~50 s loaded
def test_several_drafts_one_report_each_as_benched_alone(drafts, tmp_path):
    a, b, published = drafts["a"], drafts["b"], drafts["published"]
    alone = {key: bench_json(str(drafts[key]), "--offline", "-o", str(tmp_path / key)) for key in ("a", "b")}
    out = a.parent.parent / "compare"  # beside the drafts' folders: the report names them `../a/draft`
    data = bench_json(str(a), str(b), str(published), "--offline", "-o", str(out))
    # the frame of a one-draft report, no draft of its own, then the drafts
    assert data["draft_dir"] is None and "offline" not in data and "draft_sha256" not in data
    assert list(data)[:11] == [k for k in alone["a"] if k not in ("offline", "draft_sha256")][:11]
    entries = data["drafts"]
    assert [e["name"] for e in entries] == ["a/draft", "b/draft", "c/draft"]  # folders named alike: one above
    assert [e["published"] for e in entries] == [False, False, True]
    assert [e.get("draft_sha256") for e in entries[:2]] == [alone["a"]["draft_sha256"], alone["b"]["draft_sha256"]]
    assert "draft_sha256" not in entries[2] and len(entries[2]["draft_weights_sha256"]) == 64
    assert [e["draft_dir"] for e in entries] == ["../a/draft", "../b/draft", "../c/draft"]
    assert list(entries[0]["offline"]) == list(alone["a"]["offline"])  # the single-draft shape
    # same prompts, same seeds, same settings: each draft's numbers are its single bench's, to the last digit
    assert numbers(entries[0]["offline"]) == numbers(alone["a"]["offline"])
    assert numbers(entries[1]["offline"]) == numbers(alone["b"]["offline"])
    assert numbers(entries[2]["offline"]) == numbers(alone["a"]["offline"])  # the published copy of a
    assert numbers(entries[0]["offline"]) != numbers(entries[1]["offline"])  # two drafts that differ
    assert [w for w in data["warnings"] if "unknown chat template" in w][0].startswith("c/draft: ")
    # one plot of per-position acceptance listing every draft; tau compared with the baselines shown once
    assert set(data["files"]["plots"]) == {"acceptance_per_position", "tau_by_draft"}
    with Image.open(out / "acceptance_per_position.png") as image:
        series = json.loads(image.text["Description"])["series"]
    assert series == [f"{d} mt_bench T={t}" for d in ("a/draft", "b/draft", "c/draft") for t in (0, 1)]
    with Image.open(out / "tau_by_draft.png") as image:
        bars = json.loads(image.text["Description"])["series"]
    assert bars == ["a/draft", "b/draft", "c/draft", "n-gram (prompt lookup)", "untrained draft"]
    text = (out / "bench.md").read_text()
    header = "| dataset | T | a/draft tau [95% CI] | b/draft tau [95% CI] | c/draft tau [95% CI] |"
    assert header + " n-gram (prompt lookup) | untrained draft |" in text
    assert "### Acceptance by position" in text and "### Calibration of the confidence heads" in text
    # the folder belongs to the set of drafts: in any order it is theirs, one of them alone is refused
    owner = json.loads((out / ".dspark-owner").read_text())
    assert owner == {"kind": "dspark.bench", "drafts": ["../a/draft", "../b/draft", "../c/draft"]}
    from dspark_cli.artifacts.bench import read_bench_report
    from dspark_cli.artifacts.bench_output import output_problem

    assert output_problem(out, [published, b, a]) is None
    assert "holds the bench report of other drafts" in (output_problem(out, a) or "")
    assert "holds the bench report of other drafts" in (output_problem(out, [a, b]) or "")
    assert "holds the bench report of another draft" in (output_problem(tmp_path / "a", [a, b]) or "")
    report = read_bench_report(out / "bench.json")
    assert report.to_dict() == json.loads((out / "bench.json").read_text())
    assert not report.measured_draft(a)  # publish uploads no comparison as a draft's own report


def test_every_draft_is_checked_before_any_work(drafts, tmp_path):
    other = write_random_draft(tmp_path / "other")  # made for another target's geometry
    out = tmp_path / "report"
    result = invoke("bench", str(drafts["a"]), str(other), "--offline", *PUBLISHED_RECIPE, *SMALL_BENCH, "-o", str(out))
    lines = result.output.strip().splitlines()
    assert result.exit_code == 1 and len(lines) == 2 and "not benchmarking it" in lines[0], result.output
    assert str(other) in lines[0] and not out.exists()


def test_several_drafts_are_compared_offline_only(drafts, tmp_path):
    result = invoke("bench", str(drafts["a"]), str(drafts["b"]), "--endpoint", "http://127.0.0.1:9", *PUBLISHED_RECIPE)
    assert result.exit_code == 2 and "several drafts are compared offline only" in result.output, result.output
    result = invoke("bench", str(drafts["a"]), str(drafts["a"]), "--offline", *PUBLISHED_RECIPE)
    assert result.exit_code == 2 and "the same draft is given twice" in result.output, result.output


def test_drafts_come_before_the_overrides(tmp_path):
    from dspark_cli.cli.bench import split_drafts

    (tmp_path / "x=y").mkdir()  # a path with `=` in it is still a draft
    assert split_drafts("a", ["b", str(tmp_path / "x=y"), "k=v", "m=n"]) == (
        ["a", "b", str(tmp_path / "x=y")],
        ["k=v", "m=n"],
    )
    assert split_drafts("k=v", ["m=n"]) == ([], ["k=v", "m=n"])
    assert split_drafts(None, None) == ([], [])
