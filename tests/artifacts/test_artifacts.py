"""The strict readers of artifacts/: every stage output that is missing, unfinished, corrupt or of another
kind is one line naming the file (and the stage to re-run), never a traceback or a silent fallback.

    .venv/bin/python -m pytest tests/artifacts/test_artifacts.py -q        # a few seconds: small hand-made files

The files here are what a killed run, a bad copy or a wrong path leave; the readers are called through
the stages that use them (training's plan, export's draft loader, bench, serve and publish).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dspark_cli.errors import DataError, DsparkError


def one_line(exc: DsparkError) -> bool:
    return "\n" not in str(exc) and len(str(exc)) < 400


def test_an_unfinished_capture_is_not_counted_as_the_training_data(tmp_path):
    """`captured_lengths` (the exact plan) used to read the shards an unfinished capture had listed so
    far and plan on them as if they were the whole data set."""
    from dspark_cli.capture import captured_lengths

    hidden = tmp_path / "hidden"
    hidden.mkdir()
    (hidden / "manifest.json").write_text(json.dumps({"kind": "dspark.capture", "complete": False, "shards": []}))
    with pytest.raises(DataError, match="capture did not finish") as info:
        captured_lengths(hidden, 64)
    assert one_line(info.value)
    (hidden / "manifest.json").write_text(json.dumps({"kind": "dspark.datagen", "complete": True, "shards": []}))
    with pytest.raises(DataError, match="not a dspark capture output") as info:
        captured_lengths(hidden, 64)
    assert one_line(info.value)


def test_finished_capture_tells_unfinished_from_foreign(tmp_path):
    from dspark_cli.artifacts.capture import finished_capture

    assert finished_capture(tmp_path) is None  # nothing yet: capture runs
    (tmp_path / "manifest.json").write_text(json.dumps({"kind": "dspark.capture", "complete": False}))
    assert finished_capture(tmp_path) is None  # unfinished: capture resumes
    (tmp_path / "manifest.json").write_text("[1, 2]")
    with pytest.raises(DataError, match="corrupt manifest") as info:
        finished_capture(tmp_path)
    assert one_line(info.value) and str(tmp_path / "manifest.json") in str(info.value)


@pytest.mark.parametrize(
    "manifest, error",
    [
        ('{"kind": "dspark.train", "comp', "corrupt manifest"),
        ('{"kind": "dspark.capture", "complete": true}', "not the manifest of a dspark training run"),
        ('{"kind": "dspark.train", "complete": false}', "training did not finish"),
        (None, "training did not finish"),
    ],
)
def test_a_training_output_without_a_finished_manifest_is_one_line(tmp_path, manifest, error):
    """Export and training's evaluation read runs/NAME/train through `load_draft_dir`; its manifest.json
    used to be read with a bare json.loads (a corrupt one was a traceback, a foreign one was trusted)."""
    from dspark_cli.artifacts.draft import load_draft_dir

    train = tmp_path / "train"
    (train / "final").mkdir(parents=True)
    (train / "final" / "model.safetensors").write_bytes(b"never read: the manifest is checked first")
    if manifest is not None:
        (train / "manifest.json").write_text(manifest)
    with pytest.raises(DataError, match=error) as info:
        load_draft_dir(train)
    assert one_line(info.value) and str(train) in str(info.value)


def test_a_draft_beside_another_tools_manifest_is_still_a_draft(tmp_path):
    """Only a training run's manifest.json is taken for one: bench and serve load exported drafts that
    may sit in any directory (`_resolve` is the step of `load_draft_dir` that finds the manifest)."""
    from dspark_cli.artifacts.draft import _resolve

    draft = tmp_path / "models" / "draft"
    draft.mkdir(parents=True)
    (draft / "model.safetensors").write_bytes(b"weights")
    (tmp_path / "models" / "manifest.json").write_text('{"kind": "another-tool", "complete": true}')
    assert _resolve(draft) == (draft, {})
    train = tmp_path / "train"
    (train / "final").mkdir(parents=True)
    (train / "final" / "model.safetensors").write_bytes(b"weights")
    (train / "manifest.json").write_text('{"kind": "another-tool"}')
    with pytest.raises(DataError, match="not the manifest of a dspark training run"):  # final/ of a run: strict
        _resolve(train / "final")
    (train / "manifest.json").write_text('{"kind": "dspark.train", "complete": true, "summary": {"steps": 3}}')
    assert _resolve(train / "final") == (train / "final", json.loads((train / "manifest.json").read_text()))


def test_a_broken_draft_manifest_is_not_skipped_when_looking_for_the_drafts_recipe(tmp_path):
    """`dspark bench/serve/publish DRAFT` without --recipe take the recipe the draft carries; a corrupt
    dspark_manifest.json used to count as 'no recipe' (the defaults) instead of the error it is."""
    from dspark_cli.artifacts.draft import recipe_of_dir

    assert recipe_of_dir(tmp_path) is None  # neither recipe.yaml nor a manifest
    (tmp_path / "dspark_manifest.json").write_text('{"kind": "dspark.draft", "recipe": {')
    with pytest.raises(DataError, match="unreadable") as info:
        recipe_of_dir(tmp_path)
    assert one_line(info.value) and "dspark_manifest.json" in str(info.value)
    (tmp_path / "dspark_manifest.json").write_text(json.dumps({"kind": "something.else", "recipe": {"name": "x"}}))
    with pytest.raises(DataError, match="not the manifest of a dspark draft"):
        recipe_of_dir(tmp_path)


def test_publish_and_bench_baselines_read_only_bench_reports(tmp_path):
    """Publish puts the recipe's bench.json on the model card, and `bench.baseline_report` takes another
    run's online numbers: a corrupt file was a traceback, a file of another kind was used."""
    from dspark_cli.bench.endpoint import load_baseline_report
    from dspark_cli.publish.run import _bench_report
    from dspark_cli.recipe import load_recipe

    recipe = load_recipe("tiny", [f"output_dir={tmp_path}"])
    bench = Path(recipe.stage_dir("bench"))
    bench.mkdir(parents=True)
    assert _bench_report(recipe, tmp_path / "draft") == (None, {})  # no report: a card without numbers
    (bench / "bench.json").write_text('{"kind": "dspark.bench", "draft_dir": ')
    with pytest.raises(DataError, match="invalid JSON") as info:
        _bench_report(recipe, tmp_path / "draft")
    assert one_line(info.value) and str(bench / "bench.json") in str(info.value)
    other = tmp_path / "manifest.json"
    other.write_text(json.dumps({"kind": "dspark.capture", "online": {"endpoint_runs": {"levels": []}}}))
    with pytest.raises(DataError, match="not a dspark bench report") as info:
        load_baseline_report(str(other))
    assert one_line(info.value)


def test_stage_results_go_to_json_and_back_with_their_nested_records():
    """A torchrun run's summary is read back from rank 0's manifest: `from_dict(to_dict())` is the same
    result, nested records (the stream, the published files) typed again; keys a later version adds are
    ignored and fields an earlier manifest lacks take their defaults."""
    from dspark_cli.artifacts.results import PublishedFile, PublishSummary, StreamSummary, TrainSummary

    stream = StreamSummary(
        location="runs/x/hidden-stream",
        producers=2,
        peak_bytes=10,
        peak_shards=3,
        max_shards=3,
        producer_restarts=1,
        producer_wait_s=[0.5, 0.25],
        rewinds=0,
        required_shards=2,
    )
    train = TrainSummary(
        output_dir="runs/x/train",
        steps=4,
        num_steps=4,
        resumed_from=None,
        tokens=512,
        world_size=2,
        final_metrics={"loss": 1.5},
        wall_s=3.0,
        shapes=None,
        final="runs/x/train/final",
        stream=stream,
    )
    data = json.loads(json.dumps(train.to_dict()))
    assert data["stream"]["peak_shards"] == 3 and TrainSummary.from_dict(data) == train
    assert TrainSummary.from_dict({**data, "added_later": 1}) == train
    del data["stream"]
    assert TrainSummary.from_dict(data).stream is None
    published = PublishSummary(
        repo_id="me/d",
        hubs=["huggingface"],
        private=True,
        draft_dir="d",
        architecture=None,
        card="generated",
        files=[PublishedFile("README.md", 10, "generated")],
        dry_run=False,
        urls={"huggingface": "http://127.0.0.1/me/d"},
    )
    assert PublishSummary.from_dict(json.loads(json.dumps(published.to_dict()))) == published


def test_a_bench_result_has_tau_lines_for_the_threshold_zero_runs():
    from dspark_cli.artifacts.results import BenchSummary

    def run(temperature, threshold, mean):
        return {
            "dataset": "tiny-eval",
            "temperature": temperature,
            "threshold": threshold,
            "tau": {"mean": mean, "ci95": [mean - 0.1, mean + 0.1]},
            "calibration": {"verdict": "calibrated", "overall": {"ece": 0.05}},
        }

    report = {
        "kind": "dspark.bench",
        "format_version": 1,
        "dspark": "0",
        "name": "x",
        "created": "now",
        "target": "t",
        "draft_dir": "d",
        "bench": {},
        "serve": {},
        "warnings": [],
        "complete": True,
        "offline": {
            "runs": [run(0.0, 0.0, 3.0), run(0.0, 0.5, 2.0), run(1.0, 0.0, 2.5)],
            "baselines": [{"name": "ngram", "dataset": "tiny-eval", "temperature": 0.0, "tau": {"mean": 1.1}}],
        },
    }
    summary = BenchSummary.from_dict(report)
    lines = summary.tau_lines()
    assert [(line.temperature, line.tau) for line in lines] == [(0.0, 3.0), (1.0, 2.5)]
    assert lines[0].baselines == {"ngram": 1.1} and lines[1].baselines == {} and lines[0].ece == 0.05
    assert "online" not in summary.to_dict() and summary.to_dict()["offline"] == report["offline"]


@pytest.mark.parametrize(
    ("tail", "warned"),
    [
        (b"\x00" * 4096, "4,096 trailing NUL bytes"),  # the file grew, its last block never landed
        (b'{"step": 3, "lo', "a torn last line (line 3"),  # killed mid-write
        (b'{"step": 3, "lo' + b"\x00" * 100 + b"\n\x00\x00", "102 trailing NUL bytes and a torn last line"),
        (b"\x00\x00\x00\n", "3 trailing NUL bytes"),
        (b"", None),
    ],
    ids=["nuls", "torn", "torn-then-nuls", "a-zeroed-line", "whole"],
)
def test_a_log_a_crash_cut_short_keeps_its_good_lines_with_a_warning(tmp_path, caplog, tail, warned):
    from dspark_cli.artifacts.jsonl import read_log

    log = tmp_path / "metrics.jsonl"
    log.write_bytes(b'{"step": 1}\n{"step": 2}\n' + tail)
    with caplog.at_level("WARNING", logger="dspark_cli.artifacts.jsonl"):
        assert read_log(log, hint="h") == [{"step": 1}, {"step": 2}]
    assert (warned in caplog.text and str(log) in caplog.text) if warned else caplog.text == ""


@pytest.mark.parametrize(
    "bad", [b"\x00" * 40, b'{"step": 2', b"[1, 2]", b"5"], ids=["nuls", "torn", "a-list", "a-number"]
)
def test_a_log_damaged_in_the_middle_is_one_line_naming_the_file_and_line(tmp_path, bad):
    from dspark_cli.artifacts.jsonl import read_log

    log = tmp_path / "metrics.jsonl"
    log.write_bytes(b'{"step": 1}\n' + bad + b'\n{"step": 3}\n')
    with pytest.raises(DataError, match="damaged line") as info:
        read_log(log, hint="delete that line")
    assert one_line(info.value) and f"{log}:2:" in str(info.value) and info.value.hint == "delete that line"


def test_a_directory_another_node_is_claiming_is_not_a_strangers(tmp_path):
    """A shared directory (the online run's capture dir on a Slurm allocation) holds, for a moment, only the
    temporary file its owner mark is written through: another node's preflight must not call it someone
    else's (what made the three-node Slurm test fail once); a real stranger's file still is."""
    from dspark_cli.artifacts.files import OWNER_NAME, ownership_problem

    out = tmp_path / "hidden"
    out.mkdir()
    (out / f".{OWNER_NAME}.k2x9.tmp").write_text("{")
    assert ownership_problem(out, "dspark.capture", "capture.output_dir") is None
    (out / "notes.txt").write_text("mine")
    problem = ownership_problem(out, "dspark.capture", "capture.output_dir")
    assert problem is not None and "is not dspark capture output" in problem
