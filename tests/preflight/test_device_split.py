"""The producer / trainer device split on one machine, and counting GPUs without starting CUDA.

    .venv/bin/python -m pytest tests/preflight/test_device_split.py -q

No GPU here: machines are described (`Machine(gpus=8)`, `gpus=8`), and where the code counts
device nodes the test says how it stands in for them.
"""

from __future__ import annotations

import glob

import pytest

from dspark_cli.machine.devices import default_split, device_split_problems, narrow_train_devices, producer_environ
from dspark_cli.preflight import Machine, preflight
from dspark_cli.recipe import load_recipe
from dspark_cli.training.launch import launch_command, resolve_device_split, torchrun_environ

ONLINE = ["capture.mode=online", "train.max_steps=10"]


def _recipe(*overrides: str):
    return load_recipe("tiny", [*ONLINE, *overrides])


@pytest.fixture
def four_gpu_nodes(monkeypatch):
    """A mock of what cannot run here: this machine has no /dev/nvidiaN nodes, so `glob.glob` reports four
    for that pattern (and is itself otherwise). `torch.cuda.device_count` is replaced by a function
    that fails the test: calling it starts the CUDA runtime in the caller, which then ignores a later
    CUDA_VISIBLE_DEVICES, so the preflight must not."""
    import torch

    real = glob.glob
    monkeypatch.setattr(
        glob,
        "glob",
        lambda pattern, **kw: (
            [f"/dev/nvidia{i}" for i in range(4)] if pattern.startswith("/dev/nvidia") else real(pattern, **kw)
        ),
    )

    def starts_cuda() -> int:
        raise AssertionError("torch.cuda.device_count() starts CUDA in the preflight's process")

    monkeypatch.setattr(torch.cuda, "device_count", starts_cuda)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return monkeypatch


def test_gpus_are_counted_from_device_nodes_and_cuda_visible_devices_without_starting_cuda(four_gpu_nodes):
    """Failed before: Machine().gpus called torch.cuda.device_count() whenever a device node existed
    (AssertionError from the replaced function). CUDA_VISIBLE_DEVICES is read as CUDA reads it: up to
    the first invalid entry."""
    import torch

    assert Machine().gpus == 4
    for visible, count in [
        ("", 0),
        ("0,1", 2),
        ("3,1", 2),
        ("1,7,2", 1),
        ("-1", 0),
        ("0,-1,1", 1),
        ("2,2", 1),
        ("GPU-4f1c,GPU-77aa", 2),
        ("x", 0),
        ("0, 1, 2, 3", 4),
    ]:
        four_gpu_nodes.setenv("CUDA_VISIBLE_DEVICES", visible)
        assert Machine().gpus == count, visible
    assert Machine(gpus=8).gpus == 8  # a described machine is taken as said
    assert not torch.cuda.is_initialized()


def test_no_device_node_means_no_gpu_whatever_cuda_visible_devices_says(monkeypatch):
    monkeypatch.setattr(glob, "glob", lambda pattern, **kw: [])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert Machine().gpus == 0


def test_the_default_split_puts_producers_first_and_ranks_next():
    tp2 = _recipe(
        "capture.backend=vllm", "datagen.tensor_parallel_size=2", "capture.workers=2", "train.nproc_per_node=4"
    )
    assert default_split(tp2, 8) == ([0, 1, 2, 3], [4, 5, 6, 7])
    assert default_split(_recipe("capture.workers=3", "train.nproc_per_node=2"), 8) == ([0, 1, 2], [3, 4])
    # nothing pinned: no GPU, offline, external producers, or a list given
    assert default_split(tp2, 0) is None
    assert default_split(load_recipe("tiny", ["capture.mode=offline"]), 8) is None
    assert default_split(_recipe("capture.external_producers=true"), 8) is None
    assert default_split(_recipe("capture.devices=[0]", "train.devices=[1]"), 8) is None


def test_the_preflight_refuses_a_default_split_the_machine_cannot_hold():
    too_big = _recipe("capture.workers=4", "train.nproc_per_node=8")  # 4 hf producers + 8 ranks on 8 GPUs
    problems = [p for p in preflight(too_big, ["train"], machine=Machine(gpus=8)) if "default split" in p]
    assert len(problems) == 1 and "12 GPUs, this machine has 8" in problems[0], problems
    assert "lower capture.workers / train.nproc_per_node" in problems[0]
    fits = _recipe("capture.workers=4", "train.nproc_per_node=4")
    assert not [p for p in preflight(fits, ["train"], machine=Machine(gpus=8)) if "capture.devices" in p]
    # on CPU nothing is pinned, so nothing is refused
    assert not [p for p in preflight(too_big, ["train"], machine=Machine(gpus=0)) if "capture.devices" in p]
    assert device_split_problems(too_big, available=None) == []


def _child_recipe(cmd: list[str]):
    """The recipe a torchrun child of `cmd` loads (its `-m dspark_cli.training RECIPE key=value ...` arguments)."""
    args = cmd[cmd.index("dspark_cli.training") + 1 :]
    return load_recipe(args[0], [a for a in args[1:] if not a.startswith("--")])


def test_the_launcher_passes_one_split_to_every_rank_and_the_producers_rank_0_starts():
    recipe = _recipe(
        "capture.backend=vllm", "datagen.tensor_parallel_size=2", "capture.workers=2", "train.nproc_per_node=4"
    )
    line = resolve_device_split(recipe, gpus=8)
    assert line is not None and "producers on GPUs 0-3, trainer ranks on GPUs 4-7" in line
    assert (recipe.capture.devices, recipe.train.devices) == ([0, 1, 2, 3], [4, 5, 6, 7])  # in place: one process
    assert resolve_device_split(recipe, gpus=8) is None  # resolved once; given lists are left alone
    cmd = launch_command(
        recipe,
        recipe_arg="tiny",
        overrides=[*ONLINE, "capture.backend=vllm", "datagen.tensor_parallel_size=2", "capture.workers=2"],
        resume="auto",
        output_dir=None,
        devices=(recipe.capture.devices, recipe.train.devices),
    )
    assert "capture.devices=[0,1,2,3]" in cmd and "train.devices=[4,5,6,7]" in cmd
    child = _child_recipe(cmd)
    assert (child.capture.devices, child.train.devices) == ([0, 1, 2, 3], [4, 5, 6, 7])
    # each rank narrows to the trainer GPUs (local rank r on the r-th); rank 0's producers get theirs
    for outer, ranks, producers in [
        (None, "4,5,6,7", ["0,1", "2,3"]),
        ("8,9,10,11,12,13,14,15", "12,13,14,15", ["8,9", "10,11"]),
    ]:
        environ = {} if outer is None else {"CUDA_VISIBLE_DEVICES": outer}
        assert narrow_train_devices(child, environ) == ranks
        assert [
            producer_environ(child, w, {**environ, "RANK": "0"})["CUDA_VISIBLE_DEVICES"] for w in (0, 1)
        ] == producers
    # on CPU: no split, no device overrides
    cpu = _recipe("capture.workers=2", "train.nproc_per_node=2")
    assert resolve_device_split(cpu, gpus=0) is None and cpu.capture.devices is None
    plain = launch_command(cpu, recipe_arg="tiny", overrides=ONLINE, resume="auto", output_dir=None)
    assert not [a for a in plain if "devices=" in a]


def test_max_restarts_reaches_torchrun():
    recipe = load_recipe("tiny", ["train.nproc_per_node=2", "train.max_restarts=2"])
    cmd = launch_command(recipe, recipe_arg="tiny", overrides=[], resume="auto", output_dir=None)
    assert "--max-restarts=2" in cmd[: cmd.index("-m", 2)] and "--resume=auto" in cmd
    default = launch_command(
        load_recipe("tiny", ["train.nproc_per_node=2"]), recipe_arg="tiny", overrides=[], resume="auto", output_dir=None
    )
    assert not [a for a in default if a.startswith("--max-restarts")]
    # the ranks get a store of their own, so a restarted gang never reads its predecessors' keys
    assert torchrun_environ({"PATH": "/bin"}) == {"PATH": "/bin", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    assert torchrun_environ({"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "0"})["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "0"


def test_a_restarted_gang_on_torchruns_shared_store_gets_keys_of_its_own():
    """Only the restart store's choice; the 2-process restart itself is tests/training/test_train_stream.py."""
    from dspark_cli.training.distributed import restart_store

    assert restart_store(2, {"TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RESTART_COUNT": "0"}) is None
    assert restart_store(2, {"TORCHELASTIC_USE_AGENT_STORE": "False", "TORCHELASTIC_RESTART_COUNT": "1"}) is None
    from dspark_cli.errors import UsageError

    with pytest.raises(UsageError, match="across machines"):  # agents count restarts differently: refused
        restart_store(
            16,
            {
                "TORCHELASTIC_USE_AGENT_STORE": "True",
                "TORCHELASTIC_RESTART_COUNT": "0",
                "TORCHELASTIC_MAX_RESTARTS": "3",
                "GROUP_WORLD_SIZE": "2",
            },
        )
    import torch.distributed as dist

    shared = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, wait_for_workers=False)  # torchrun's agent store
    shared.set("0/rank_0", "address of the dead gang's rank 0")
    store = restart_store(
        2,
        {
            "TORCHELASTIC_USE_AGENT_STORE": "True",
            "TORCHELASTIC_RESTART_COUNT": "1",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(shared.port),
        },
    )
    assert store is not None and not store.check(["0/rank_0"])  # the old key is not seen
    store.set("0/rank_0", "new")
    assert shared.get("dspark/restart-1/0/rank_0") == b"new"
