"""Online training: `dspark train` starts the capture producer and trains from its bounded queue.

    .venv/bin/python -m pytest tests/test_train_online.py -q        # ~1 min on 2 cores (tiny-gqa)
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dspark_cli.targets import BUNDLED_TARGETS


@pytest.mark.skipif(not (BUNDLED_TARGETS["tiny-gqa"] / "config.json").is_file(), reason="tiny-gqa is not built")
def test_online_mode_trains_from_the_queue_until_the_producer_finishes(tmp_path):
    from capture_support import capture_recipe

    from dspark_cli.training.run import run_train

    recipe = capture_recipe("tiny-gqa", tmp_path, "capture.mode=online", "capture.shard_tokens=60",
                            "capture.queue_max_shards=2", "draft.arch=gqa", "train.max_steps=100",
                            "train.tokens_per_step=64", "train.max_seq_len=64", "train.num_anchors=8",
                            "train.log_every=1", "train.checkpoint_every=50", "train.warmup_steps=1")
    records = []
    summary = run_train(recipe, resume="auto", on_log=records.append)
    queue = Path(recipe.stage_dir("capture") + "-queue")
    status = json.loads((queue / "queue.json").read_text())
    assert status["finished"] is True and status["error"] is None and len(status["shards"]) >= 2
    assert not list(queue.glob("shard-*.safetensors"))  # every published shard was consumed and deleted
    # the queue ended before max_steps: training stops there, checkpointed, with a final draft
    assert 1 <= summary["steps"] < 100 and [r["step"] for r in records] == list(range(1, summary["steps"] + 1))
    train_dir = Path(recipe.stage_dir("train"))
    assert (train_dir / "checkpoints" / "latest").read_text().strip() == f"step-{summary['steps']:06d}"
    assert (train_dir / "final" / "model.safetensors").is_file()
    assert summary["tokens"] == sum(r["tokens"] for r in records)
