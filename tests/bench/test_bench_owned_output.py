"""`dspark bench` writes only a report folder it made, one draft's report per folder, and no local path.

    .venv/bin/python -m pytest tests/bench/test_bench_owned_output.py -q

Two drafts for the bundled tiny-mla, as someone published them (`dl/their`, `dl/other`: random weights,
each with its recipe), benched without `--recipe`, so the report goes beside them (`dl/bench`). A folder
holding a file of the user's is refused before any work, by `dspark bench` and `dspark validate` alike; a
second draft is refused the first one's folder (each draft its own `-o`), while the same draft re-benched
replaces its own report (what `dspark run` does); bench.json and bench.md, which publish uploads, spell no
path of this machine, and publish still finds the report of the draft it measured, and only of that draft.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from bench_support import export_random_draft
from typer.testing import CliRunner

from dspark_cli.cli import app
from dspark_cli.recipe import load_recipe
from dspark_cli.targets import BUNDLED_TARGETS

pytestmark = [
    pytest.mark.usefixtures("one_thread"),
    pytest.mark.skipif(not (BUNDLED_TARGETS["tiny-mla"] / "config.json").is_file(), reason="tiny targets not built"),
]

FAST = ["bench.num_prompts=1", "bench.max_tokens=8", "bench.temperatures=[0.0]", "bench.confidence_thresholds=[0.0]"]
MINE = "# my notes on their draft\n"


@pytest.fixture(scope="module")
def published(tmp_path_factory) -> Path:
    """A folder holding two exported drafts for tiny-mla, `their` and `other` (another seed)."""
    root = tmp_path_factory.mktemp("published")
    recipe = load_recipe("tiny", ["target.model=tiny-mla", "draft.arch=mla", f"output_dir={root / 'run'}"])
    export_random_draft(recipe, root / "their", seed=0)
    export_random_draft(recipe, root / "other", seed=1)
    return root


def _download(published: Path, tmp_path: Path, *names: str) -> list[Path]:
    """The drafts `names` as the user downloaded them: `tmp_path/dl/NAME`."""
    for name in names:
        shutil.copytree(published / name, tmp_path / "dl" / name)
    return [tmp_path / "dl" / name for name in names]


def _bench(*args: str):
    return CliRunner().invoke(app, ["bench", *args, *FAST])


def _validate(tmp_path: Path, draft: Path):
    """`dspark validate` of a recipe that benches `draft` into dl/bench (as `dspark run` would)."""
    overrides = [f"output_dir={tmp_path / 'dl'}", f"export.output_dir={draft}", "target.model=tiny-mla"]
    return CliRunner().invoke(app, ["validate", "tiny", *overrides, "draft.arch=mla", "--stage", "bench"])


def test_bench_and_validate_refuse_a_folder_bench_did_not_make(published, tmp_path):
    [their] = _download(published, tmp_path, "their")
    mine = tmp_path / "dl" / "bench"  # where the report would go: the user's own folder, their notes in it
    mine.mkdir()
    (mine / "bench.md").write_text(MINE)
    result = _bench(str(their))
    assert result.exit_code == 2, result.output
    assert f"bench.output_dir: {mine} already exists and is not dspark bench output" in result.output
    assert "pass -o a new (or empty) directory" in result.output and "tau" not in result.output
    assert (mine / "bench.md").read_text() == MINE and os.listdir(mine) == ["bench.md"]  # nothing written there
    # validate judges the folder as bench does, and says so in the same words
    validated = _validate(tmp_path, their)
    assert validated.exit_code == 2 and f"bench.output_dir: {mine} already exists" in validated.output
    assert os.listdir(mine) == ["bench.md"]
    # its own -o: written, and marked as bench's own
    result = _bench(str(their), "-o", str(tmp_path / "dl" / "their-bench"))
    assert result.exit_code == 0, result.output
    owner = json.loads((tmp_path / "dl" / "their-bench" / ".dspark-owner").read_text())
    assert owner == {"kind": "dspark.bench", "draft": "../their"}


@pytest.mark.slow  # three offline benches of a tiny draft: ~15 s
def test_a_second_draft_never_replaces_the_first_drafts_report(published, tmp_path):
    their, other = _download(published, tmp_path, "their", "other")
    folder = tmp_path / "dl" / "bench"
    assert _bench(str(their)).exit_code == 0
    report = (folder / "bench.json").read_bytes()
    markdown = (folder / "bench.md").read_bytes()
    result = _bench(str(other))
    assert result.exit_code == 2, result.output
    assert f"{folder} holds the bench report of another draft" in result.output
    assert f"-o {tmp_path / 'dl' / 'other-bench'}" in result.output  # the way out, spelled
    assert (folder / "bench.json").read_bytes() == report and (folder / "bench.md").read_bytes() == markdown
    validated = _validate(tmp_path, other)
    assert validated.exit_code == 2 and "holds the bench report of another draft" in validated.output
    # each draft its own folder
    result = _bench(str(other), "-o", str(tmp_path / "dl" / "other-bench"))
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "dl" / "other-bench" / "bench.json").read_text())["draft_dir"] == "../other"
    # the same draft again replaces its own report (`dspark run` re-benches the draft it exported)
    assert _validate(tmp_path, their).exit_code == 0
    assert _bench(str(their)).exit_code == 0
    again = json.loads((folder / "bench.json").read_text())
    assert again["complete"] is True and again["draft_dir"] == "../their"


def _strings(value):
    if isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)
    elif isinstance(value, str):
        yield value


@pytest.mark.slow  # two offline benches of a tiny draft and two publish dry runs: ~15 s
def test_the_report_names_no_path_of_this_machine_and_publish_finds_its_draft(published, tmp_path, monkeypatch):
    [their] = _download(published, tmp_path, "their")
    private = tmp_path / "private"  # the user's own prompts and chat template, named by absolute path
    private.mkdir()
    prompts = private / "prompts.jsonl"
    prompts.write_text(json.dumps({"messages": [{"role": "user", "content": "Name three colours."}]}) + "\n")
    out = (tmp_path / "dl" / "bench").resolve()
    monkeypatch.chdir(private)  # a relative path of the user's is a local path too
    result = _bench(
        str(their.resolve()),
        "--offline",
        f"bench.output_dir={out}",
        f"bench.datasets=[{prompts}, ./prompts.jsonl]",
        "bench.baselines=[ngram]",
        f"serve.extra_args=[--chat-template={private / 'template.jinja'}]",
    )
    assert result.exit_code == 0, result.output
    data = json.loads((out / "bench.json").read_text())
    local = [s for s in _strings(data) if s.startswith(("/", "~")) or "=/" in s or str(tmp_path) in s]
    assert local == [], "bench.json names paths of this machine"
    assert data["draft_dir"] == "../their" and data["offline"]["engine"]["draft_dir"] == "../their"
    assert data["target"] == data["offline"]["engine"]["target"] == "tiny-mla"
    assert data["bench"]["datasets"] == ["../../private/prompts.jsonl"] * 2 and data["bench"]["output_dir"] == "."
    assert data["serve"]["extra_args"] == ["--chat-template=../../private/template.jinja"]
    assert data["files"]["json"] == "bench.json" and data["files"]["markdown"] == "bench.md"
    assert set(data["files"]["plots"].values()) <= set(data["files"]["checksums"])  # names in the folder
    text = (out / "bench.md").read_text()
    assert str(tmp_path) not in text and str(BUNDLED_TARGETS["tiny-mla"]) not in text and "draft: `../their`" in text
    # what publish uploads from the folder: bench.json and the files it lists, and it finds the draft by its manifest
    monkeypatch.chdir(tmp_path)
    plan = _publish_plan(their)
    assert {"bench/bench.json", "bench/bench.md"} <= {f["path"] for f in plan["files"]}
    assert "Measured acceptance" in plan["card_text"] and str(tmp_path) not in plan["card_text"]
    # a report an older dspark wrote (no draft_sha256, the draft by its absolute path) is left out, not uploaded
    current = (out / "bench.json").read_text()
    older = {**json.loads(current), "draft_dir": str(their.resolve())}
    del older["draft_sha256"]
    (out / "bench.json").write_text(json.dumps(older))
    assert not any(f["path"].startswith("bench/") for f in _publish_plan(their)["files"])
    (out / "bench.json").write_text(current)
    # a draft exported again into the same directory is another draft: the old report is not its report
    shutil.rmtree(their)
    shutil.copytree(published / "other", their)
    plan = _publish_plan(their)
    assert not any(f["path"].startswith("bench/") for f in plan["files"])


def _publish_plan(draft: Path) -> dict:
    result = CliRunner().invoke(app, ["publish", str(draft), "--repo-id", "me/tiny", "--dry-run", "--format", "json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_a_report_of_an_older_dspark_is_benchs_own_and_keeps_its_draft(tmp_path):
    """A folder an older dspark wrote before bench marked its folders (bench.json of kind dspark.bench, the
    draft as it was given, and the files it lists) is bench's own, of that draft; one more file is not."""
    from dspark_cli.artifacts.bench_output import output_problem

    their, other = tmp_path / "dl" / "their", tmp_path / "dl" / "other"
    folder = tmp_path / "dl" / "bench"
    folder.mkdir(parents=True)
    (folder / "bench.md").write_text("# dspark bench\n")
    listed = {"checksums": {"bench.md": "0" * 64}}
    (folder / "bench.json").write_text(json.dumps({"kind": "dspark.bench", "draft_dir": str(their), "files": listed}))
    assert output_problem(folder, their) is None
    assert "holds the bench report of another draft" in (output_problem(folder, other) or "")
    (folder / "bench-notes.md").write_text(MINE)
    assert "is not dspark bench output" in (output_problem(folder, their) or "")
