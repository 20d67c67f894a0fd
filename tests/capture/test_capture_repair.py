"""A damaged capture shard's error names a repair that works: real `dspark train` runs.

    .venv/bin/python -m pytest tests/capture/test_capture_repair.py -q        # ~1 min on 2 cores

The hint used to say "delete it and re-run capture": there is no capture command, and after deleting
the shard `train` said it was missing. Now `dspark train` captures a finished capture's missing
shards again, so deleting the damaged file and re-running `dspark train` is the whole repair.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from capture_support import DATAGEN_OVERRIDES, capture_recipe

pytestmark = (
    pytest.mark.slow
)  # every test here runs dspark stages in processes (torchrun, producers, training): minutes

ROOT = Path(__file__).resolve().parents[2]
DSPARK = str(Path(sys.executable).with_name("dspark"))
TRAIN = (
    "capture.shard_tokens=150",
    "train.max_steps=2",
    "train.checkpoint_every=2",
    "train.log_every=1",
    "train.tokens_per_step=512",
    "draft.block_size=4",
    "draft.markov_rank=16",
)


def _train(root: Path, *extra: str) -> subprocess.CompletedProcess:
    args = ["train", "tiny", "target.model=tiny-gqa", f"output_dir={root}", *DATAGEN_OVERRIDES, *TRAIN, *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", "COLUMNS": "200"}
    return subprocess.run([DSPARK, *args], capture_output=True, text=True, env=env, timeout=600, cwd=ROOT)


@pytest.mark.parametrize("how", ["flip", "truncate"])
def test_following_the_damaged_shard_hint_leads_to_a_successful_run(tmp_path, how):
    capture_recipe("tiny-gqa", tmp_path)  # the shared datagen output, copied to tmp_path/run/data
    root = tmp_path / "run"
    first = _train(root)
    assert first.returncode == 0, first.stderr[-3000:]
    hidden = root / "hidden"
    manifest = json.loads((hidden / "manifest.json").read_text())
    assert manifest["complete"] and len(manifest["shards"]) >= 2
    victim = hidden / manifest["shards"][1]["file"]
    data = bytearray(victim.read_bytes())
    if how == "flip":
        data[len(data) // 2] ^= 0x10
        data[len(data) // 2 + 1] ^= 0x10
    else:
        data = data[: len(data) - 100]
    victim.write_bytes(bytes(data))

    again = _train(root, "-o", str(tmp_path / "second"))  # a fresh training run reads every shard
    assert again.returncode == 1, again.stderr[-3000:]
    lines = again.stderr.strip().splitlines()
    assert len(lines) == 2 and str(victim) in lines[0], again.stderr
    assert "delete it and re-run `dspark train`" in again.stderr

    victim.unlink()  # what the hint says
    fixed = _train(root, "-o", str(tmp_path / "second"))
    assert fixed.returncode == 0, fixed.stderr[-3000:]
    after = json.loads((hidden / "manifest.json").read_text())

    def layout(shards):  # the recaptured bytes differed from the first capture's here (cause not traced)
        return [{k: v for k, v in s.items() if k != "sha256"} for s in shards]

    assert after["complete"] and layout(after["shards"]) == layout(manifest["shards"])  # the same shard again
    assert after["shards"][0] == manifest["shards"][0]  # the intact shards were kept
    assert json.loads((tmp_path / "second" / "manifest.json").read_text())["summary"]["steps"] == 2
