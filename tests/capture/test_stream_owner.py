"""The online stream has one owner: the train run (its train.output_dir) that reads it, marked and locked.

    .venv/bin/python -m pytest tests/capture/test_stream_owner.py -q      # seconds

Real directories, real flocks; `dspark validate` through its CLI. The cases users met: two trainers with
different `-o` sharing the default stream (the second released and rewound the first's shards and died at
step 9), and `capture.stream` pointed at a user's own folder (dspark rewrote its consumer.json).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_support import invoke
from mooncake_support import mooncake_master, needs_mooncake

from dspark_cli.capture.store import FileStore
from dspark_cli.capture.stream import CONSUMER_KEY, STREAM_KIND, producer_key, write_json
from dspark_cli.capture.stream_owner import adopt_stream, claim_problem, claim_stream
from dspark_cli.errors import UsageError


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_second_train_run_is_refused_naming_the_owner_until_the_first_finished(tmp_path):
    stream, first, second = tmp_path / "stream", tmp_path / "a" / "train", tmp_path / "b" / "train"
    with claim_stream(str(stream), first) as store:
        owner = json.loads((stream / ".dspark-owner").read_text())
        assert owner == {"kind": "dspark.stream", "train_dir": str(first.resolve())}
        with pytest.raises(UsageError) as info:  # while the first runs
            with claim_stream(str(stream), second):
                pass
        store.put(CONSUMER_KEY, json.dumps({"released_below": 3, "finished": False}).encode())
    assert (
        info.value.message
        == f"capture.stream: {stream} is the stream of the train run in {first.resolve()} (not finished)"
    )
    assert "set capture.stream to another folder" in info.value.hint and f"-o {first.resolve()}" in info.value.hint
    before = snapshot(stream)
    with pytest.raises(UsageError, match="is the stream of the train run in"):  # stopped (Ctrl-C), not finished
        with claim_stream(str(stream), second):
            pass
    assert snapshot(stream) == before  # refused before anything was written
    with claim_stream(str(stream), first):  # its own run resumes
        pass
    FileStore(stream).put(CONSUMER_KEY, json.dumps({"released_below": 9, "finished": True}).encode())
    with claim_stream(str(stream), second):  # finished: the next run takes the stream over
        assert json.loads((stream / ".dspark-owner").read_text())["train_dir"] == str(second.resolve())


def test_the_same_train_run_twice_at_once_is_refused_by_the_lock(tmp_path):
    stream, train = tmp_path / "stream", tmp_path / "train"
    with claim_stream(str(stream), train):
        with pytest.raises(UsageError) as info:
            with claim_stream(str(stream), train):
                pass
    assert "is being written by another dspark process" in info.value.message
    assert "capture.stream" in info.value.hint
    with claim_stream(str(stream), train):  # let go with the first
        pass


def test_a_users_folder_with_its_own_consumer_json_is_refused_untouched(tmp_path):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "consumer.json").write_text('{"my": "numbers"}\n')
    (folder / "notes.txt").write_text("mine\n")
    before = snapshot(folder)
    with pytest.raises(UsageError) as info:
        with claim_stream(str(folder), tmp_path / "train"):
            pass
    assert info.value.message == (
        f"capture.stream: {folder} holds consumer.json, notes.txt, which dspark did not write; "
        "refusing to use it as the stream"
    )
    assert info.value.hint.startswith("set capture.stream to a new (or empty) folder")
    with pytest.raises(UsageError, match="which dspark did not write"):  # `dspark produce` too
        adopt_stream(f"file://{folder}")
    assert snapshot(folder) == before and sorted(p.name for p in folder.iterdir()) == ["consumer.json", "notes.txt"]
    (tmp_path / "file").write_text("x")
    assert "exists and is not a directory" in claim_problem(str(tmp_path / "file"), tmp_path / "train")[0]


def test_a_stream_dspark_made_before_it_was_marked_is_adopted(tmp_path):
    stream = tmp_path / "stream"
    store = FileStore(stream)
    write_json(store, producer_key(0), {"kind": STREAM_KIND, "shards": {}})
    write_json(store, CONSUMER_KEY, {"released_below": 2, "step": 4, "finished": False})
    assert claim_problem(str(stream), tmp_path / "train") is None
    with claim_stream(str(stream), tmp_path / "train"):
        assert json.loads((stream / ".dspark-owner").read_text())["train_dir"] == str((tmp_path / "train").resolve())
    assert json.loads((stream / "consumer.json").read_text())["released_below"] == 2  # its state stays


def test_dspark_produce_marks_a_new_stream_and_keeps_a_trainers_mark(tmp_path):
    stream = tmp_path / "stream"
    adopt_stream(str(stream))
    assert json.loads((stream / ".dspark-owner").read_text()) == {"kind": "dspark.stream"}
    with claim_stream(str(stream), tmp_path / "train"):
        pass
    adopt_stream(str(stream))
    assert json.loads((stream / ".dspark-owner").read_text())["train_dir"] == str((tmp_path / "train").resolve())


def test_validate_reports_a_users_folder_and_another_runs_stream(tmp_path):
    """`dspark validate` (the train stage's disk rules) says what rank 0's claim would refuse."""
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "consumer.json").write_text("{}\n")
    base = ["tiny", "capture.mode=online", f"output_dir={tmp_path / 'run'}"]
    result = invoke("validate", *base, f"capture.stream={folder}", "--stage", "train")
    assert result.exit_code == 2 and f"capture.stream: {folder} holds consumer.json" in result.output, result.output
    assert sorted(p.name for p in folder.iterdir()) == ["consumer.json"]
    stream = tmp_path / "run" / "hidden-stream"
    with claim_stream(str(stream), tmp_path / "other" / "train"):
        pass  # a run in another train directory, stopped before it finished
    result = invoke("validate", *base, "--stage", "train")
    assert result.exit_code == 2, result.output
    assert f"is the stream of the train run in {(tmp_path / 'other' / 'train').resolve()}" in result.output
    result = invoke("validate", *base, f"train.output_dir={tmp_path / 'other' / 'train'}", "--stage", "train")
    assert "is the stream of the train run" not in result.output, result.output


@needs_mooncake
@pytest.mark.slow  # a mooncake_master and two clients
def test_over_mooncake_the_owner_is_a_key_of_the_namespace(tmp_path):
    """The same claim over a real mooncake_master on loopback: the mark is a key, another train run is
    refused naming the owner, a namespace holding a consumer.json dspark did not write is refused untouched.
    The test's own client lends the memory (segment), as a mooncake_client would."""
    from dspark_cli.capture.mooncake_store import MooncakeStore

    first, second = tmp_path / "a" / "train", tmp_path / "b" / "train"
    with mooncake_master(tmp_path / "master.log") as master:
        location = master.replace("/test-stream?", "/owned?")
        with MooncakeStore(location + "&segment=32MB") as lender:
            with claim_stream(location, first):
                assert json.loads(lender.get(".dspark-owner"))["train_dir"] == str(first.resolve())
            with pytest.raises(UsageError) as info:
                with claim_stream(location, second):
                    pass
            assert f"is the stream of the train run in {first.resolve()}" in info.value.message
        foreign = master.replace("/test-stream?", "/theirs?")
        with MooncakeStore(foreign + "&segment=32MB") as theirs:
            theirs.put(CONSUMER_KEY, b'{"mine": 1}')
            with pytest.raises(UsageError, match="holds a consumer.json dspark did not write"):
                with claim_stream(foreign, first):
                    pass
            assert theirs.keys("") == [CONSUMER_KEY] and theirs.get(CONSUMER_KEY) == b'{"mine": 1}'
