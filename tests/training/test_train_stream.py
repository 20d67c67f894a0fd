"""Online training over the stream: 2 hf producers, FSDP2 ranks on gloo, kills, the bound, Mooncake.

    .venv/bin/python -m pytest tests/training/test_train_stream.py -q

The processes are real: `dspark train` (which relaunches itself under torchrun for 2 ranks, and
starts the producers' supervisor on rank 0), producers running `python -m dspark_cli.capture.producers`,
torchrun's own restart for a killed rank, a `mooncake_master` for the Mooncake stream. Sample ids
come from each rank's stream-ids log. Every 2-rank run is compared with one uninterrupted run
(`uninterrupted`): same plan, same data, so its final weights must come out the same.
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
from mooncake_support import mooncake_master, needs_mooncake

from dspark_cli.targets import BUNDLED_TARGETS

pytestmark = [
    pytest.mark.skipif(not (BUNDLED_TARGETS["tiny-gqa"] / "config.json").is_file(), reason="tiny-gqa is not built"),
    pytest.mark.slow,
]  # every test here runs processes for a minute or more
ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
NUM_PROMPTS = 12
MAX_SHARDS = 3
# each step: two or three ~50-token sequences; shards of ~2 sequences; a checkpoint every 2 steps
TRAIN = [
    "capture.mode=online",
    "capture.workers=2",
    "capture.shard_tokens=100",
    f"capture.queue_max_shards={MAX_SHARDS}",
    "capture.batch_size=4",
    "draft.arch=gqa",
    "train.max_steps=null",
    "train.epochs=1.0",
    "train.tokens_per_step=128",
    "train.max_seq_len=64",
    "train.num_anchors=8",
    "train.log_every=1",
    "train.checkpoint_every=2",
    "train.warmup_steps=1",
    "train.lr=3e-3",
]


@pytest.fixture(scope="module")
def datagen(tmp_path_factory):
    """One datagen output of NUM_PROMPTS prompts answered by tiny-gqa, shared by this module's tests."""
    from capture_support import DATAGEN_OVERRIDES

    from dspark_cli.datagen.run import run_datagen
    from dspark_cli.recipe import load_recipe

    root = tmp_path_factory.mktemp("stream-datagen")
    overrides = [
        "target.model=tiny-gqa",
        f"output_dir={root}",
        *DATAGEN_OVERRIDES,
        f"datagen.sources=[{{path: tiny-prompts, max_samples: {NUM_PROMPTS}}}]",
    ]
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
    return {
        **os.environ,
        "PATH": f"{BIN}:{os.environ['PATH']}",
        "PYTHONPATH": str(ROOT),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "OMP_NUM_THREADS": "1",
    }


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
    proc = subprocess.Popen(
        [str(BIN / "dspark"), *args], cwd=ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        if on_start is not None:
            on_start(proc)
        out, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-4000:]
    return subprocess.CompletedProcess(args, proc.returncode, out, "")


def final_weights(train_dir: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(train_dir / "final" / "model.safetensors"))


# Killed-and-resumed runs against the uninterrupted one: the same steps see the same sequences (the plan),
# the same bytes (capture on CPU is deterministic: a recaptured shard has the same sha256, or the reader
# would have refused it), the same anchors (seeded by position) and a checkpoint that holds the fp32 weights
# and AdamW state, and gloo's reductions run in a fixed order, so the weights come out bit for bit the same:
# no tolerance is needed (measured: 0.0 max difference). The lr schedule depends only on the step.
WEIGHTS_ATOL = 0.0


def assert_same_weights(train_dir: Path, reference: dict) -> float:
    import torch

    weights = final_weights(train_dir)
    assert weights.keys() == reference.keys()
    worst = max(float((weights[k].float() - reference[k].float()).abs().max()) for k in weights)
    assert worst <= WEIGHTS_ATOL, f"final weights differ from the uninterrupted run's by up to {worst}"
    assert all(torch.equal(weights[k], reference[k]) for k in weights) or WEIGHTS_ATOL > 0
    return worst


def bounded_two_rank_run(datagen, tmp_path: Path, *extra: str) -> tuple[dict, list[str]]:
    """`dspark train` with 2 producers and 2 ranks; checks every sample trained once and the bound
    (sampled every 2 ms, and the manifest's peak); returns the summary and the overrides."""
    overrides = overrides_for(datagen, tmp_path, "train.nproc_per_node=2", *extra)
    stream = tmp_path / "run" / "hidden-stream"
    with Watcher(stream) as watch:
        run_dspark(["train", "tiny", *overrides])
    train_dir = tmp_path / "run" / "train"
    summary = json.loads((train_dir / "manifest.json").read_text())["summary"]
    assert summary["world_size"] == 2 and summary["stream"]["producers"] == 2
    ids, rerun = trained_ids(train_dir, summary["num_steps"], 2)
    assert ids == Counter(planned_ids(overrides)) and rerun == 0  # every sample exactly once
    # the bound: never more than MAX_SHARDS shards in the stream, as sampled and as the summary says
    assert watch.samples > 100 and watch.shards <= MAX_SHARDS and summary["stream"]["peak_shards"] <= MAX_SHARDS
    assert summary["stream"]["max_shards"] == MAX_SHARDS and summary["stream"]["required_shards"] <= MAX_SHARDS
    assert 0 < summary["stream"]["peak_bytes"] and watch.bytes <= summary["stream"]["peak_bytes"] * 1.5
    assert not list(stream.rglob("*.safetensors"))  # everything consumed was released
    use = summary["stream"]["utilisation"]
    assert len(use["rank_wait_s"]) == 2 and len(use["producer_wait_s"]) == 2
    assert 0 <= use["trainer_busy"] <= 1 and 0 <= use["producer_busy"] <= 1
    assert use["bottleneck"] in ("producers", "trainers")
    return summary, overrides


@pytest.fixture(scope="module")
def uninterrupted(datagen, tmp_path_factory):
    """2 producers, 2 ranks, a checkpoint only at the end (train.checkpoint_every=100 with a bound of 3
    shards: refused before the stream released on consumption); its summary and final weights."""
    tmp_path = tmp_path_factory.mktemp("uninterrupted")
    summary, _ = bounded_two_rank_run(datagen, tmp_path, "train.checkpoint_every=100")
    assert summary["stream"]["rewinds"] == 0
    return summary, final_weights(tmp_path / "run" / "train")


def test_two_producers_two_ranks_train_every_sample_once_like_offline(datagen, uninterrupted, tmp_path):
    """The same run with a checkpoint every 2 steps: the same bound holds (the stream's peak does not
    depend on the interval), the same weights come out; and offline training lands near it."""
    from dspark_cli.recipe import load_recipe
    from dspark_cli.training.run import run_train

    summary, overrides = bounded_two_rank_run(datagen, tmp_path)  # TRAIN's train.checkpoint_every=2
    assert summary["num_steps"] == uninterrupted[0]["num_steps"]
    assert_same_weights(tmp_path / "run" / "train", uninterrupted[1])
    # the offline run on the same data (one process, its own shuffled order): same neighbourhood
    offline = load_recipe(
        "tiny",
        [o for o in overrides if not o.startswith(("capture.mode", "train.nproc"))]
        + ["capture.mode=offline", f"train.output_dir={tmp_path / 'offline'}"],
    )
    from dspark_cli.capture import ensure_capture

    ensure_capture(offline)  # capture is its own stage, before training
    reference = run_train(offline, resume="never")
    online_final, offline_final = summary["final_metrics"], reference.final_metrics
    print(
        f"tau online {online_final['tau_greedy']:.3f} ({summary['num_steps']} steps) offline "
        f"{offline_final['tau_greedy']:.3f} ({reference.num_steps} steps); peak {summary['stream']['peak_bytes']} bytes"
    )
    assert abs(online_final["tau_greedy"] - offline_final["tau_greedy"]) <= TAU_TOLERANCE, (online_final, offline_final)


# Tolerance of the online-vs-offline final tau: the runs see the same sequences in different orders
# (offline shuffles its epoch, online reads plan order), so they agree
# in distribution, not bit for bit.
TAU_TOLERANCE = 0.35


def wait_for(predicate, timeout: float = 300, what: str = "", poll_s: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(poll_s)


def test_a_killed_producer_is_restarted_and_no_sample_is_lost_or_repeated(datagen, uninterrupted, tmp_path):
    overrides = overrides_for(datagen, tmp_path, "train.nproc_per_node=2")
    stream = tmp_path / "run" / "hidden-stream"
    status = stream / "producers" / "0.json"
    killed = []

    def kill_producer_0_mid_run(proc) -> None:
        def published() -> bool:
            assert proc.poll() is None, f"dspark train ended (exit {proc.returncode}) before the kill"
            try:
                data = json.loads(status.read_text())
            except (FileNotFoundError, json.JSONDecodeError):
                return False
            return len(data["shards"]) >= 1 and not data["finished"]

        wait_for(published, what="producer 0's first shard")
        pid = json.loads(status.read_text())["producer"]["pid"]
        os.kill(pid, signal.SIGKILL)
        killed.append(pid)

    with Watcher(stream) as watch:
        run_dspark(["train", "tiny", *overrides], on_start=kill_producer_0_mid_run)
    assert killed, "the producer finished before it could be killed"
    after = json.loads(status.read_text())
    assert after["producer"]["pid"] != killed[0] and after["finished"] and after["restarts"] == 1
    train_dir = tmp_path / "run" / "train"
    summary = json.loads((train_dir / "manifest.json").read_text())["summary"]
    assert summary["stream"]["producer_restarts"] == 1
    ids, rerun = trained_ids(train_dir, summary["num_steps"], 2)
    assert ids == Counter(planned_ids(overrides)) and rerun == 0
    assert watch.shards <= MAX_SHARDS and summary["stream"]["peak_shards"] <= MAX_SHARDS
    assert_same_weights(train_dir, uninterrupted[1])


def kill_rank_1_after_the_first_checkpoint(train_dir: Path, overrides: list[str]) -> tuple[threading.Thread, list[int]]:
    """A thread that SIGKILLs rank 1 once rank 0 has released a shard the checkpoint at step 2 does not
    cover (it does so as it draws step 4, step 3 being trained): the resumed run must rewind the stream,
    and the producers capture that shard again."""
    from dspark_cli.capture import build_plan
    from dspark_cli.recipe import load_recipe
    from dspark_cli.training.stream_source import plan_online

    recipe = load_recipe("tiny", overrides)
    plan = plan_online(
        build_plan(recipe),
        max_seq_len=recipe.train.max_seq_len,
        tokens_per_step=recipe.train.tokens_per_step,
        world_size=2,
        seed=recipe.train.seed,
    )
    covered = plan.release_below(2)
    assert plan.release_below(3) > covered and len(plan.steps) >= 4  # the data gives a rewind to test
    rank1, consumer = train_dir / "stream-ids" / "rank-1.jsonl", train_dir.parent / "hidden-stream" / "consumer.json"
    killed: list[int] = []

    def kill() -> None:
        def released_past_the_checkpoint() -> bool:
            try:
                return json.loads(consumer.read_text())["released_below"] > covered and rank1.is_file()
            except (FileNotFoundError, json.JSONDecodeError, KeyError):
                return False

        wait_for(released_past_the_checkpoint, what="a release past the checkpoint at step 2", poll_s=0.002)
        pid = json.loads(rank1.read_text().splitlines()[-1])["pid"]
        os.kill(pid, signal.SIGKILL)
        killed.append(pid)

    killer = threading.Thread(target=kill, daemon=True)
    killer.start()
    return killer, killed


def assert_resumed_after_the_checkpoint(
    train_dir: Path, killed: list[int], overrides: list[str], reference: dict
) -> None:
    summary = json.loads((train_dir / "manifest.json").read_text())["summary"]
    assert summary["resumed_from"].endswith("step-000002") and summary["world_size"] == 2
    assert summary["stream"]["rewinds"] == 1  # released past the checkpoint: captured again
    assert summary["stream"]["peak_shards"] <= MAX_SHARDS
    logs = step_logs(train_dir)
    second = [step for pid, step, _ in logs[1] if pid != killed[0]]
    assert second[0] == 3 and second[-1] == summary["num_steps"]  # continued right after the checkpoint
    ids, rerun = trained_ids(train_dir, summary["num_steps"], 2)
    assert ids == Counter(planned_ids(overrides))  # nothing lost, nothing trained twice into the result
    assert 1 <= rerun <= 2  # at most one checkpoint interval (train.checkpoint_every=2) trained again
    assert_same_weights(train_dir, reference)


def test_a_killed_rank_restarts_from_its_checkpoint_at_the_checkpointed_stream_position(
    datagen, uninterrupted, tmp_path
):
    """Rank 1 SIGKILLed: the whole job ends; the same command again (--resume auto) resumes at step 3,
    rewinds the stream and trains the same weights as the uninterrupted run."""
    overrides = overrides_for(datagen, tmp_path, "train.nproc_per_node=2")
    train_dir = tmp_path / "run" / "train"
    killer, killed = kill_rank_1_after_the_first_checkpoint(train_dir, overrides)
    cmd = [str(BIN / "dspark"), "train", "tiny", *overrides]
    first = subprocess.run(
        cmd, cwd=ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=400
    )
    killer.join(timeout=5)
    assert killed and first.returncode != 0, first.stdout[-3000:]
    again = subprocess.run(
        cmd, cwd=ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=400
    )  # the same command: --resume auto is the default
    assert again.returncode == 0, again.stdout[-4000:]
    assert_resumed_after_the_checkpoint(train_dir, killed, overrides, uninterrupted[1])


def test_torchrun_restarts_a_killed_rank_in_place_and_the_run_completes(datagen, uninterrupted, tmp_path):
    """train.max_restarts=1 (torchrun --max-restarts): rank 1 SIGKILLed after the checkpoint at step 2;
    torchrun stops rank 0 (and the producers it started) and restarts both ranks within the same
    command, which resume at step 3 from the stream position the checkpoint recorded. Failed before
    (no --max-restarts passed; with it, torchrun's shared rendezvous store handed the restarted rank 1
    the dead rank 0's gloo address: `Gloo connectFullMesh failed ... Connection refused`)."""
    overrides = overrides_for(datagen, tmp_path, "train.nproc_per_node=2", "train.max_restarts=1")
    train_dir = tmp_path / "run" / "train"
    killer, killed = kill_rank_1_after_the_first_checkpoint(train_dir, overrides)
    run = run_dspark(["train", "tiny", *overrides], timeout=300)
    killer.join(timeout=5)
    assert killed, run.stdout[-3000:]
    assert_resumed_after_the_checkpoint(train_dir, killed, overrides, uninterrupted[1])


def test_kept_stream_trains_two_epochs_within_its_byte_bound(datagen, tmp_path):
    """capture.keep_max_bytes: the consumed shards stay for the second epoch (the published draft
    trained about two), every sample is trained exactly twice, and the stream never holds more
    bytes than the bound; at the end everything is released."""
    from dspark_cli.recipe import load_recipe
    from dspark_cli.training.run import run_train

    bound = 50_000_000
    overrides = overrides_for(
        datagen,
        tmp_path,
        "train.epochs=2.0",
        f"capture.keep_max_bytes={bound}",
        f"capture.queue_max_shards={MAX_SHARDS}",
    )
    stream = tmp_path / "run" / "hidden-stream"
    with Watcher(stream) as watch:
        summary = run_train(load_recipe("tiny", overrides), resume="never")
    ids, rerun = trained_ids(tmp_path / "run" / "train", summary.num_steps, 2)
    once = Counter(planned_ids(overrides))
    assert ids == Counter({name: 2 * count for name, count in once.items()}) and rerun == 0
    assert watch.bytes <= bound and summary.stream.peak_bytes <= bound
    assert not list(stream.rglob("*.safetensors"))


@needs_mooncake
def test_over_mooncake_a_killed_producer_changes_nothing_and_training_matches_the_filesystem_stream(
    datagen, uninterrupted, tmp_path
):
    """The same 2-producer, 2-rank run over `mooncake://` (a real mooncake_master on loopback; this test's
    client lends the memory, as a mooncake_client would), producer 0 SIGKILLed after its first shard:
    every sample once, the bound, and the same loss and weights as over the shared-filesystem stream."""
    import contextlib

    from dspark_cli.capture.mooncake_store import MooncakeStore

    with mooncake_master(tmp_path / "master.log") as master, contextlib.ExitStack() as stack:
        stream = master.replace("/test-stream?", "/online-run?")
        lender = stack.enter_context(MooncakeStore(stream + "&segment=256MB"))  # the same namespace: it reads too
        overrides = overrides_for(datagen, tmp_path, "train.nproc_per_node=2", f"capture.stream={stream}")
        killed: list[int] = []

        def kill_producer_0_mid_run(proc) -> None:
            def published() -> bool:
                assert proc.poll() is None, f"dspark train ended (exit {proc.returncode}) before the kill"
                data = lender.get("producers/0.json")
                if data is None:
                    return False
                status = json.loads(data)
                return len(status["shards"]) >= 1 and not status["finished"]

            wait_for(published, what="producer 0's first shard in Mooncake")
            pid = json.loads(lender.get("producers/0.json"))["producer"]["pid"]
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

        run_dspark(["train", "tiny", *overrides], on_start=kill_producer_0_mid_run)
        assert killed, "the producer finished before it could be killed"
        leftover = lender.keys("shards/")
    train_dir = tmp_path / "run" / "train"
    summary = json.loads((train_dir / "manifest.json").read_text())["summary"]
    assert summary["stream"]["location"].startswith("mooncake://") and summary["stream"]["producer_restarts"] == 1
    ids, rerun = trained_ids(train_dir, summary["num_steps"], 2)
    assert ids == Counter(planned_ids(overrides)) and rerun == 0
    assert summary["stream"]["peak_shards"] <= MAX_SHARDS and leftover == []
    reference = uninterrupted[0]["final_metrics"]
    print(f"loss over mooncake {summary['final_metrics']['loss']:.6f}, over files {reference['loss']:.6f}")
    assert summary["final_metrics"]["loss"] == reference["loss"]
    assert_same_weights(train_dir, uninterrupted[1])


def test_the_slurm_script_trains_online_on_a_simulated_three_node_allocation(datagen, tmp_path):
    """`dspark init --slurm` writes the job script; its per-node part runs here as three "nodes" (each a
    process tree with its own SLURM_NODEID, one allocation list of localhost, rendezvous on localhost):
    node 0 runs both producers (`dspark produce --only 0,1`), nodes 1 and 2 are torchrun nodes of one
    rank each (`dspark train`, --nnodes=2). The run completes, every sample once, logs per node."""
    from mooncake_support import free_port

    overrides = overrides_for(datagen, tmp_path, "train.nnodes=2", "train.nproc_per_node=1")
    recipe = tmp_path / "job.yaml"
    made = subprocess.run(
        [str(BIN / "dspark"), "init", "tiny", "-o", str(recipe), "--slurm", "--gpus-per-node=2", *overrides],
        cwd=tmp_path,
        env=env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=120,
        check=False,
    )
    assert made.returncode == 0, made.stdout
    script = tmp_path / "job.sbatch"
    text = script.read_text()
    assert "#SBATCH --nodes=3" in text and "PRODUCER_NODES=1" in text and "TRAIN_NODES=2" in text
    logs = tmp_path / "logs"
    allocation = {
        "SLURM_JOB_NODELIST": "localhost,localhost,localhost",
        "SLURM_NNODES": "3",
        "SLURM_JOB_ID": "4242",
        "DSPARK_LOGS": str(logs),
        "DSPARK_RDZV_PORT": str(free_port()),
    }
    nodes = [
        subprocess.Popen(
            ["bash", str(script), "--node"],
            cwd=tmp_path,
            start_new_session=True,
            env={**env(), **allocation, "SLURM_NODEID": str(node)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for node in range(3)
    ]
    deadline = time.monotonic() + 900
    try:  # like srun --kill-on-bad-exit: one node failing ends the others
        while any(node.poll() is None for node in nodes) and time.monotonic() < deadline:
            if any(node.poll() not in (None, 0) for node in nodes):
                break
            time.sleep(0.5)
    finally:
        for node in nodes:
            if node.poll() is None:
                os.killpg(node.pid, signal.SIGKILL)
                node.wait()
    outs = [node.stdout.read() for node in nodes]
    detail = "\n".join(
        f"--- node {k} ---\n{(logs / f'node-{k}.log').read_text()[-3000:] if (logs / f'node-{k}.log').is_file() else outs[k]}"
        for k in range(3)
    )
    assert [node.returncode for node in nodes] == [0, 0, 0], detail
    assert "produce: 2 producer(s) done" in (logs / "node-0.log").read_text()
    for k in (1, 2):
        assert "launching" in (logs / f"node-{k}.log").read_text()
    train_dir = tmp_path / "run" / "train"
    summary = json.loads((train_dir / "manifest.json").read_text())["summary"]
    assert summary["world_size"] == 2 and summary["stream"]["producers"] == 2
    ids, rerun = trained_ids(train_dir, summary["num_steps"], 2)
    assert ids == Counter(planned_ids(overrides)) and rerun == 0
