"""Online training over the stream: 2 hf producers, FSDP2 ranks on gloo, kills, the disk bound.

    .venv/bin/python -m pytest tests/test_train_stream.py -q

The processes are real: `dspark train` (which relaunches itself under torchrun for 2 ranks, and
starts the producers' supervisor on rank 0), producers running `python -m dspark_cli.capture.online`,
torchrun's own restart for a killed rank. Sample ids come from each rank's stream-ids log.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from dspark_cli.targets import BUNDLED_TARGETS

pytestmark = pytest.mark.skipif(not (BUNDLED_TARGETS["tiny-gqa"] / "config.json").is_file(),
                                reason="tiny-gqa is not built")
ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
NUM_PROMPTS = 12
MAX_SHARDS = 3
# each step: two or three ~50-token sequences; shards of ~2 sequences; a checkpoint every 2 steps
TRAIN = ["capture.mode=online", "capture.workers=2", "capture.shard_tokens=100", f"capture.queue_max_shards={MAX_SHARDS}",
         "capture.batch_size=4", "draft.arch=gqa", "train.max_steps=null", "train.epochs=1.0", "train.tokens_per_step=128",
         "train.max_seq_len=64", "train.num_anchors=8", "train.log_every=1", "train.checkpoint_every=2",
         "train.warmup_steps=1", "train.lr=3e-3"]


@pytest.fixture(scope="module")
def datagen(tmp_path_factory):
    """One datagen output of NUM_PROMPTS prompts answered by tiny-gqa, shared by this module's tests."""
    from capture_support import DATAGEN_OVERRIDES

    from dspark_cli.datagen.run import run_datagen
    from dspark_cli.recipe import load_recipe

    root = tmp_path_factory.mktemp("stream-datagen")
    overrides = ["target.model=tiny-gqa", f"output_dir={root}", *DATAGEN_OVERRIDES,
                 f"datagen.sources=[{{path: tiny-prompts, max_samples: {NUM_PROMPTS}}}]"]
    run_datagen(load_recipe("tiny", overrides))
    return overrides, root / "data"


def overrides_for(datagen, tmp_path: Path, *extra: str) -> list[str]:
    import shutil

    base, data = datagen
    shutil.copytree(data, tmp_path / "run" / "data")
    return [*[o for o in base if not o.startswith("output_dir=")], f"output_dir={tmp_path / 'run'}", *TRAIN, *extra]


def planned_ids(overrides: list[str]) -> list[str]:
    from dspark_cli.capture import build_plan
    from dspark_cli.recipe import load_recipe

    return [i for shard in build_plan(load_recipe("tiny", overrides)).shards for i in shard.ids]


def env() -> dict[str, str]:
    return {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}


class Watcher:
    """Samples the stream directory every 2 ms: the most shard files and bytes present at once."""

    def __init__(self, directory: Path) -> None:
        self.directory, self.shards, self.bytes, self.samples = directory, 0, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            shards = total = 0
            for folder, _, files in os.walk(self.directory):
                for name in files:
                    try:
                        total += os.stat(os.path.join(folder, name)).st_size
                    except FileNotFoundError:
                        continue
                    shards += ".safetensors" in name
            self.shards, self.bytes, self.samples = max(self.shards, shards), max(self.bytes, total), self.samples + 1
            time.sleep(0.002)

    def __enter__(self) -> Watcher:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def step_logs(train_dir: Path) -> dict[int, list[tuple[int, int, list[str]]]]:
    """rank -> [(pid, step, ids)] in the order the rank logged them (all attempts)."""
    out = {}
    for path in sorted((train_dir / "stream-ids").glob("rank-*.jsonl")):
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        out[int(path.stem.split("-")[1])] = [(r["pid"], r["step"], r["ids"]) for r in rows]
    return out


def trained_ids(train_dir: Path, num_steps: int, checkpoint_every: int) -> tuple[Counter, int]:
    """The ids that made the final draft: each step as its last attempt trained it (an attempt killed
    after its last checkpoint re-runs from there). Also the most steps any rank trained twice."""
    ids: Counter = Counter()
    rerun = 0
    for rows in step_logs(train_dir).values():
        final: dict[int, list[str]] = {}
        for _, step, names in rows:
            if step in final:
                assert final[step] == names, f"step {step} drew other sequences when trained again"
            final[step] = names
        assert sorted(final) == list(range(1, num_steps + 1))
        for names in final.values():
            ids.update(names)
        rerun = max(rerun, len(rows) - num_steps)
    return ids, rerun


def run_dspark(args: list[str], *, timeout: float = 400, on_start=None) -> subprocess.CompletedProcess:
    proc = subprocess.Popen([str(BIN / "dspark"), *args], cwd=ROOT, env=env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        if on_start is not None:
            on_start(proc)
        out, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-4000:]
    return subprocess.CompletedProcess(args, proc.returncode, out, "")


def test_two_producers_two_ranks_train_every_sample_once_like_offline(datagen, tmp_path):
    from dspark_cli.recipe import load_recipe
    from dspark_cli.training.run import run_train

    overrides = overrides_for(datagen, tmp_path, "train.nproc_per_node=2")
    stream = tmp_path / "run" / "hidden-stream"
    with Watcher(stream) as watch:
        run_dspark(["train", "tiny", *overrides])
    train_dir = tmp_path / "run" / "train"
    manifest = json.loads((train_dir / "manifest.json").read_text())
    summary = manifest["summary"]
    assert summary["world_size"] == 2 and summary["stream"]["producers"] == 2
    ids, rerun = trained_ids(train_dir, summary["num_steps"], 2)
    assert ids == Counter(planned_ids(overrides)) and rerun == 0  # every sample exactly once
    # the bound: never more than MAX_SHARDS shards in the stream, as sampled and as the summary says
    assert watch.samples > 100 and watch.shards <= MAX_SHARDS and summary["stream"]["peak_shards"] <= MAX_SHARDS
    assert 0 < summary["stream"]["peak_bytes"] and watch.bytes <= summary["stream"]["peak_bytes"] * 1.5
    assert not list(stream.rglob("*.safetensors"))  # everything consumed was released
    # the offline run on the same data (one process, its own shuffled order): same neighbourhood
    offline = load_recipe("tiny", [o for o in overrides if not o.startswith(("capture.mode", "train.nproc"))]
                          + ["capture.mode=offline", f"train.output_dir={tmp_path / 'offline'}"])
    from dspark_cli.capture import ensure_capture

    ensure_capture(offline)  # capture is its own stage, before training
    reference = run_train(offline, resume="never")
    online_final, offline_final = summary["final_metrics"], reference["final_metrics"]
    print(f"tau online {online_final['tau_greedy']:.3f} ({summary['num_steps']} steps) offline "
          f"{offline_final['tau_greedy']:.3f} ({reference['num_steps']} steps); peak {summary['stream']['peak_bytes']} bytes")
    assert abs(online_final["tau_greedy"] - offline_final["tau_greedy"]) <= TAU_TOLERANCE, (online_final, offline_final)


# Tolerance of the online-vs-offline final tau: the runs see the same sequences in different orders
# (offline shuffles its epoch, online reads plan order), so they agree
# in distribution, not bit for bit.
TAU_TOLERANCE = 0.35


def wait_for(predicate, timeout: float = 300, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_a_killed_producer_is_restarted_and_no_sample_is_lost_or_repeated(datagen, tmp_path):
    from dspark_cli.recipe import load_recipe
    from dspark_cli.training.run import run_train

    overrides = overrides_for(datagen, tmp_path)
    stream = tmp_path / "run" / "hidden-stream"
    status = stream / "producers" / "0.json"
    killed = []

    def kill_producer_0_mid_run() -> None:
        def published() -> bool:
            try:
                data = json.loads(status.read_text())
            except (FileNotFoundError, json.JSONDecodeError):
                return False
            return len(data["shards"]) >= 1 and not data["finished"]
        wait_for(published, what="producer 0's first shard")
        pid = json.loads(status.read_text())["producer"]["pid"]
        os.kill(pid, signal.SIGKILL)
        killed.append(pid)

    killer = threading.Thread(target=kill_producer_0_mid_run, daemon=True)
    killer.start()
    with Watcher(stream) as watch:
        summary = run_train(load_recipe("tiny", overrides), resume="auto")
    killer.join(timeout=5)
    assert killed, "the producer finished before it could be killed"
    after = json.loads(status.read_text())
    assert after["producer"]["pid"] != killed[0] and after["finished"] and after["restarts"] == 1
    assert summary["stream"]["producer_restarts"] == 1
    ids, rerun = trained_ids(tmp_path / "run" / "train", summary["num_steps"], 2)
    assert ids == Counter(planned_ids(overrides)) and rerun == 0
    assert watch.shards <= MAX_SHARDS and summary["stream"]["peak_shards"] <= MAX_SHARDS


def kill_rank_1_after_the_first_checkpoint(train_dir: Path) -> tuple[threading.Thread, list[int]]:
    """A thread that SIGKILLs rank 1 once it draws step 3 (step 2 is then trained and checkpointed)."""
    rank1 = train_dir / "stream-ids" / "rank-1.jsonl"
    killed: list[int] = []

    def kill() -> None:
        def at_step_3() -> bool:
            return rank1.is_file() and any(json.loads(line)["step"] == 3 for line in rank1.read_text().splitlines())
        wait_for(at_step_3, what="rank 1 at step 3")
        pid = json.loads(rank1.read_text().splitlines()[-1])["pid"]
        os.kill(pid, signal.SIGKILL)
        killed.append(pid)

    killer = threading.Thread(target=kill, daemon=True)
    killer.start()
    return killer, killed


def assert_resumed_after_the_checkpoint(train_dir: Path, killed: list[int], overrides: list[str]) -> None:
    summary = json.loads((train_dir / "manifest.json").read_text())["summary"]
    assert summary["resumed_from"].endswith("step-000002") and summary["world_size"] == 2
    logs = step_logs(train_dir)
    second = [step for pid, step, _ in logs[1] if pid != killed[0]]
    assert second[0] == 3 and second[-1] == summary["num_steps"]  # continued right after the checkpoint
    ids, rerun = trained_ids(train_dir, summary["num_steps"], 2)
    assert ids == Counter(planned_ids(overrides))  # nothing lost, nothing trained twice into the result
    assert 1 <= rerun <= 2  # at most one checkpoint interval (train.checkpoint_every=2) trained again


def test_a_killed_rank_restarts_from_its_checkpoint_at_the_checkpointed_stream_position(datagen, tmp_path):
    overrides = overrides_for(datagen, tmp_path, "train.nproc_per_node=2")
    train_dir = tmp_path / "run" / "train"
    killer, killed = kill_rank_1_after_the_first_checkpoint(train_dir)
    cmd = [str(BIN / "dspark"), "train", "tiny", *overrides]
    first = subprocess.run(cmd, cwd=ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=400)
    killer.join(timeout=5)
    assert killed and first.returncode != 0, first.stdout[-3000:]
    again = subprocess.run(cmd, cwd=ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=400)  # the same command: --resume auto is the default
    assert again.returncode == 0, again.stdout[-4000:]
    assert_resumed_after_the_checkpoint(train_dir, killed, overrides)


def test_torchrun_restarts_a_killed_rank_in_place_and_the_run_completes(datagen, tmp_path):
    """train.max_restarts=1 (torchrun --max-restarts): rank 1 SIGKILLed after the checkpoint at step 2;
    torchrun stops rank 0 (and the producers it started) and restarts both ranks within the same
    command, which resume at step 3 from the stream position the checkpoint recorded. Failed before
    (no --max-restarts passed; with it, torchrun's shared rendezvous store handed the restarted rank 1
    the dead rank 0's gloo address: `Gloo connectFullMesh failed ... Connection refused`)."""
    overrides = overrides_for(datagen, tmp_path, "train.nproc_per_node=2", "train.max_restarts=1")
    train_dir = tmp_path / "run" / "train"
    killer, killed = kill_rank_1_after_the_first_checkpoint(train_dir)
    run = run_dspark(["train", "tiny", *overrides], timeout=300)
    killer.join(timeout=5)
    assert killed, run.stdout[-3000:]
    assert_resumed_after_the_checkpoint(train_dir, killed, overrides)


def test_kept_stream_trains_two_epochs_within_its_byte_bound(datagen, tmp_path):
    """capture.keep_max_bytes: the consumed shards stay for the second epoch (the published draft
    trained about two), every sample is trained exactly twice, and the stream never holds more
    bytes than the bound; at the end everything is released."""
    from dspark_cli.recipe import load_recipe
    from dspark_cli.training.run import run_train

    bound = 50_000_000
    overrides = overrides_for(datagen, tmp_path, "train.epochs=2.0", f"capture.keep_max_bytes={bound}",
                              f"capture.queue_max_shards={MAX_SHARDS}")
    stream = tmp_path / "run" / "hidden-stream"
    with Watcher(stream) as watch:
        summary = run_train(load_recipe("tiny", overrides), resume="never")
    ids, rerun = trained_ids(tmp_path / "run" / "train", summary["num_steps"], 2)
    once = Counter(planned_ids(overrides))
    assert ids == Counter({name: 2 * count for name, count in once.items()}) and rerun == 0
    assert watch.bytes <= bound and summary["stream"]["peak_bytes"] <= bound
    assert not list(stream.rglob("*.safetensors"))
