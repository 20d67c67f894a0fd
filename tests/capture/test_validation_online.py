"""Online capture of the validation split: producer 0 of two publishes it into a file stream under its own
keys, the trainers read it (the same sequences as the offline `validation/` capture), and releasing or
finishing the training shards leaves it there.

    .venv/bin/python -m pytest tests/capture/test_validation_online.py -q
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from capture_support import start_producers
from mooncake_support import mooncake_master, needs_mooncake
from split_support import split_copy

from dspark_cli.capture import StreamReader, build_plan, contract_for_recipe, iter_captured, open_store, run_capture
from dspark_cli.capture.validation_stream import VALIDATION_KEY, publish_validation
from dspark_cli.recipe import write_resolved
from dspark_cli.training.validation_data import validation_sequences

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # an offline capture, then two producer processes: ~30 s
def test_two_producers_deliver_the_validation_split_the_offline_capture_has(tmp_path):
    recipe = split_copy(tmp_path, "capture.workers=2")
    offline_recipe = split_copy(tmp_path, "capture.workers=1")
    run_capture(offline_recipe)
    contract = contract_for_recipe(recipe)
    offline = list(iter_captured(Path(offline_recipe.stage_dir("capture")) / "validation", expect=contract))
    assert offline
    stream_dir = tmp_path / "stream"
    write_resolved(recipe, tmp_path / "cfg")
    supervisor = start_producers(tmp_path / "cfg" / "recipe.yaml", stream_dir)
    online_recipe = split_copy(tmp_path, "capture.workers=2", "capture.mode=online", f"capture.stream={stream_dir}")
    plan = build_plan(recipe)
    try:
        reader = StreamReader(
            open_store(stream_dir), fingerprint=plan.fingerprint, workers=2, expect=contract, timeout_s=120
        )
        for index in range(len(plan.shards)):  # a trainer's reads and releases, to the end
            reader.read(index)
            reader.release(index + 1, step=index + 1, finished=index + 1 == len(plan.shards))
        _, err = supervisor.communicate(timeout=120)
    finally:
        supervisor.kill()
    assert supervisor.returncode == 0, err[-2000:]
    assert not list((stream_dir / "shards").glob("*.safetensors"))  # training shards released...
    assert len(list((stream_dir / "validation").glob("*.safetensors"))) == len(
        build_plan(recipe, split="validation").shards
    )  # ...the split stays
    for got in (
        validation_sequences(online_recipe, contract, online_reader=reader),
        validation_sequences(online_recipe, contract),  # any rank, opening the stream itself
    ):
        assert [s.id for s in got] == [s.id for s in offline]
        for a, b in zip(got, offline, strict=True):
            for field in ("input_ids", "loss_mask", "aux_hidden", "last_hidden"):
                assert torch.allclose(getattr(a, field).float(), getattr(b, field).float(), atol=1e-5), (a.id, field)
    # a restarted producer 0 finds the split there: nothing is captured again (no engine needed)
    before = (stream_dir / VALIDATION_KEY).read_bytes()
    assert publish_validation(recipe, open_store(stream_dir), capturer=None) == 0
    assert (stream_dir / VALIDATION_KEY).read_bytes() == before


@pytest.mark.slow  # `dspark train` online: two producers and two gloo ranks, ~40 s
@pytest.mark.parametrize("store", ["files", pytest.param("mooncake", marks=needs_mooncake)])
def test_online_training_with_two_producers_and_two_ranks_validates_on_the_split(tmp_path, store):
    """Over a file stream and over `mooncake://` (a real mooncake_master on loopback; a client of this test lends
    the memory, as a mooncake_client would): the split reaches every rank through the stream either way."""
    with contextlib.ExitStack() as stack:
        stream = []
        if store == "mooncake":
            from dspark_cli.capture.mooncake_store import MooncakeStore

            location = stack.enter_context(mooncake_master(tmp_path / "master.log"))
            stack.enter_context(MooncakeStore(location + "&segment=256MB"))
            stream = [f"capture.stream={location}"]
        _train_online_and_check_validation(tmp_path, stream)


def _train_online_and_check_validation(tmp_path: Path, stream: list[str]) -> None:
    recipe = split_copy(
        tmp_path,
        *stream,
        "capture.mode=online",
        "capture.workers=2",
        "train.nproc_per_node=2",
        "train.max_steps=4",
        "train.tokens_per_step=256",
        "train.max_seq_len=128",
        "train.num_anchors=8",
        "train.warmup_steps=1",
        "train.validate_every=2",
        "train.checkpoint_every=2",
        "train.log_every=1",
    )
    write_resolved(recipe, tmp_path / "cfg")
    done = subprocess.run(
        [str(Path(sys.executable).with_name("dspark")), "train", str(tmp_path / "cfg" / "recipe.yaml")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    train_dir = Path(recipe.stage_dir("train"))
    location = json.loads((train_dir / "manifest.json").read_text())["summary"]["stream"]["location"]
    assert location.startswith("mooncake://") == any("mooncake://" in o for o in stream), location
    records = [json.loads(line) for line in (train_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    validations = [r for r in records if r.get("kind") == "validation"]
    held_out = json.loads((Path(recipe.stage_dir("datagen")) / "manifest.json").read_text())["validation"]
    assert [r["step"] for r in validations] == [2, 4]
    assert all(r["sequences"] == held_out["num_conversations"] > 0 for r in validations)
    best = max(validations, key=lambda r: r["tau_t1"])  # the first maximum, as training keeps it
    kept = json.loads((train_dir / "best" / "validation.json").read_text())
    assert kept["step"] == best["step"] and kept["value"] == pytest.approx(best["tau_t1"])
    assert "validation step 4/4" in done.stdout + done.stderr
