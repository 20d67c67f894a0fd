"""Online training in one process: `dspark train` starts the producers and trains from the stream.

    .venv/bin/python -m pytest tests/training/test_train_online.py -q        # tiny-gqa, one producer

(2 producers and 2 ranks, kills and the bound: tests/training/test_train_stream.py.)
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dspark_cli.targets import BUNDLED_TARGETS

pytestmark = (
    pytest.mark.slow
)  # every test here runs dspark stages in processes (torchrun, producers, training): minutes


@pytest.mark.skipif(not (BUNDLED_TARGETS["tiny-gqa"] / "config.json").is_file(), reason="tiny-gqa is not built")
def test_online_max_steps_stops_the_run_and_the_producers(tmp_path):
    from capture_support import capture_recipe

    from dspark_cli.training.run import run_train

    recipe = capture_recipe(
        "tiny-gqa",
        tmp_path,
        "capture.mode=online",
        "capture.shard_tokens=60",
        "capture.queue_max_shards=2",
        "draft.arch=gqa",
        "train.max_steps=2",
        "train.tokens_per_step=64",
        "train.max_seq_len=64",
        "train.num_anchors=8",
        "train.log_every=1",
        "train.checkpoint_every=1",
        "train.warmup_steps=1",
    )
    records = []
    summary = run_train(recipe, resume="auto", on_log=records.append)
    stream = Path(recipe.stage_dir("capture") + "-stream")
    consumer = json.loads((stream / "consumer.json").read_text())
    producer = json.loads((stream / "producers" / "0.json").read_text())
    # the plan had more steps; max_steps cut it, the producer was stopped, nothing is left in the stream
    assert summary.steps == summary.num_steps == 2 and [r["step"] for r in records] == [1, 2]
    assert consumer["finished"] and not producer["error"] and not list(stream.rglob("*.safetensors"))
    assert len(producer["shards"]) < producer["num_shards"]
    train_dir = Path(recipe.stage_dir("train"))
    assert (train_dir / "checkpoints" / "latest").read_text().strip() == "step-000002"
    assert (train_dir / "final" / "model.safetensors").is_file()
    assert summary.stream.peak_shards <= 2 and summary.tokens == sum(r["tokens"] for r in records)
