"""Which devices the online producers and the trainer ranks use on one machine, and when a split cannot work.

    from dspark_cli.machine.devices import device_split_problems, producer_environ
    visible_gpus()                                # GPUs this process may use, counted without starting CUDA
    default_split(recipe, gpus=8)                 # ([0, 1, 2, 3], [4, 5, 6, 7]) when neither list is set
    device_split_problems(recipe, available=8)   # [] or one line per problem (the preflight's rule)
    producer_environ(recipe, worker=1, base=os.environ)   # CUDA_VISIBLE_DEVICES for producer 1

`capture.devices` and `train.devices` are device numbers of this machine (indices into an outer
CUDA_VISIBLE_DEVICES when one is set). Producer w takes the w-th group of `engine_devices(recipe)`
entries of `capture.devices` (vLLM: the capture engine's tensor parallelism,
`datagen.tensor_parallel_size`; hf: one device); trainer local rank r takes `train.devices[r]`.
With both lists unset, online training with local producers on a machine with GPUs takes the
default split (`default_split`): producers the first `capture.workers x engine_devices` GPUs,
trainer ranks the next `train.nproc_per_node`. The launcher resolves it once and passes it to every
rank explicitly (training/launch.py). Otherwise unset means nothing is pinned (CPU runs, external
producers, offline training).
"""

from __future__ import annotations

import glob
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dspark_cli.recipe.schema import Recipe

ALL_DEVICES = "DSPARK_ALL_DEVICES"  # the machine's device list before a rank narrowed CUDA_VISIBLE_DEVICES
# torchrun's variables: a producer started by a rank is not part of the training job
TORCHRUN_VARS = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "ROLE_RANK",
    "ROLE_NAME",
    "ROLE_WORLD_SIZE",
    "GROUP_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_USE_AGENT_STORE",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "TORCHELASTIC_ERROR_FILE",
)


DEVICE_NODES = "/dev/nvidia[0-9]*"  # one character device per GPU the driver (or container runtime) gives us


def visible_gpus(environ: Mapping[str, str] = os.environ) -> int:
    """The CUDA devices a process with `environ` sees, counted without initialising CUDA here.

    `torch.cuda.device_count()` starts the CUDA runtime in the calling process, and the runtime reads
    CUDA_VISIBLE_DEVICES only then: a launcher or rank that counted that way could no longer narrow
    its own devices to `train.devices` afterwards. So the count comes from the NVIDIA device nodes
    (`/dev/nvidia0`, `/dev/nvidia1`, ...: on bare metal one per GPU, in a container the GPUs the
    runtime gave it), narrowed by CUDA_VISIBLE_DEVICES as CUDA reads it: entries up to the first
    invalid one (negative, out of range, repeated, not a number or a GPU-/MIG- UUID); empty means none.
    Nodes, not NVML: nothing to install or load (pynvml is no dependency, torch's NVML count is a
    private function), the answer is instant, and no node means no GPU, which keeps CPU machines free
    of any driver call. UUID entries are taken as valid, since checking them needs NVML.
    """
    physical = len(glob.glob(DEVICE_NODES))
    if not physical:
        return 0
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return physical
    seen: list[str] = []
    for entry in (e.strip() for e in visible.split(",")):
        if entry.startswith(("GPU-", "MIG-")):
            valid = True
        else:
            try:
                valid = 0 <= int(entry) < physical
            except ValueError:
                valid = False
            entry = str(int(entry)) if valid else entry
        if not valid or entry in seen:
            break
        seen.append(entry)
    return len(seen)


def engine_devices(recipe: Recipe) -> int:
    """Devices one producer's engine needs: vLLM's tensor parallelism, or one for hf."""
    return recipe.datagen.tensor_parallel_size if recipe.capture.backend_here() == "vllm" else 1


def default_split(recipe: Recipe, gpus: int) -> tuple[list[int], list[int]] | None:
    """The split when neither `capture.devices` nor `train.devices` is set, for online training with local
    producers on a machine with `gpus` GPUs: producers the first `capture.workers x engine_devices`,
    trainer ranks the next `train.nproc_per_node` (it may not fit: `device_split_problems` says so).
    None when nothing is to be pinned: offline, external producers, a list given, or no GPU."""
    capture, train = recipe.capture, recipe.train
    if capture.mode != "online" or capture.external_producers or capture.devices or train.devices or gpus <= 0:
        return None
    need = capture.workers * engine_devices(recipe)
    return list(range(need)), list(range(need, need + train.nproc_per_node))


def describe_split(capture: list[int], train: list[int]) -> str:
    """`producers on GPUs 0-3, trainer ranks on GPUs 4-7` (a range when contiguous)."""

    def spell(devices: list[int]) -> str:
        contiguous = len(devices) > 1 and devices == list(range(devices[0], devices[-1] + 1))
        return f"{devices[0]}-{devices[-1]}" if contiguous else ",".join(map(str, devices))

    return f"producers on GPUs {spell(capture)}, trainer ranks on GPUs {spell(train)}"


def apply_default_split(recipe: Recipe, gpus: int) -> str | None:
    """Set `default_split` on `recipe` in place when there is one and it fits the `gpus`; the line that
    describes it, or None (nothing to pin, or a split that does not fit: the preflight refuses that)."""
    split = default_split(recipe, gpus)
    if split is None or len(split[0]) + len(split[1]) > gpus:
        return None
    recipe.capture.devices, recipe.train.devices = split
    return describe_split(*split)


def device_split_problems(recipe: Recipe, available: int | None = None) -> list[str]:
    """Why this machine's producer / trainer split cannot work (empty when it can), one line each:
    overlapping lists, too few capture devices for `capture.workers` engines of `engine_devices`,
    too few train devices for `train.nproc_per_node`, numbers beyond the `available` devices, or
    (neither list set) a default split larger than the machine."""
    capture, train = recipe.capture, recipe.train
    problems: list[str] = []
    if available and (split := default_split(recipe, available)) and len(split[0]) + len(split[1]) > available:
        return [
            f"unset, so the default split gives {capture.workers} producers x {engine_devices(recipe)} GPUs "
            f"(engine tensor parallelism) and train.nproc_per_node={train.nproc_per_node} trainer ranks one "
            f"GPU each: {len(split[0]) + len(split[1])} GPUs, this machine has {available}"
        ]
    cap, trn = list(capture.devices or []), list(train.devices or [])
    for name, devices in (("capture.devices", cap), ("train.devices", trn)):
        if len(set(devices)) != len(devices):
            problems.append(f"{name} lists a device twice: {devices}")
        beyond = [d for d in devices if available is not None and d >= available]
        if beyond:
            problems.append(f"{name}: devices {beyond} do not exist (this machine has {available})")
    if capture.mode != "online":
        return problems
    if overlap := sorted(set(cap) & set(trn)):
        problems.append(
            f"capture.devices and train.devices share devices {overlap}: the engines and the trainers "
            "would compete for their memory"
        )
    need = capture.workers * engine_devices(recipe)
    if cap and len(cap) < need:
        problems.append(
            f"capture.devices has {len(cap)} devices, {capture.workers} producers x "
            f"{engine_devices(recipe)} (engine tensor parallelism) need {need}"
        )
    if trn and len(trn) < train.nproc_per_node:
        problems.append(f"train.devices has {len(trn)} devices for train.nproc_per_node={train.nproc_per_node}")
    if (cap and not trn) or (trn and not cap):
        problems.append("capture.devices and train.devices: set both (or neither) so the split is explicit")
    return problems


def _machine_devices(environ: Mapping[str, str]) -> list[str] | None:
    outer = environ.get(ALL_DEVICES) or environ.get("CUDA_VISIBLE_DEVICES")
    return [d for d in outer.split(",") if d.strip()] if outer else None


def _visible(numbers: list[int], environ: Mapping[str, str]) -> str:
    machine = _machine_devices(environ)
    return ",".join(machine[n] if machine is not None and n < len(machine) else str(n) for n in numbers)


def producer_environ(recipe: Recipe, worker: int, base: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The environment of producer `worker`: not a torchrun worker, and on its own devices when set."""
    env = {k: v for k, v in base.items() if k not in TORCHRUN_VARS}
    devices = recipe.capture.devices
    if devices:
        per = engine_devices(recipe)
        env["CUDA_VISIBLE_DEVICES"] = _visible(list(devices)[worker * per : (worker + 1) * per], base)
        env[ALL_DEVICES] = ",".join(_machine_devices(base) or [])
    return env


def narrow_train_devices(recipe: Recipe, environ: dict[str, str] = os.environ) -> str | None:  # type: ignore[assignment]
    """Before CUDA starts in a trainer rank: keep only `train.devices` visible (local rank r uses the
    r-th); remember the machine's list for the producers it starts. Returns the new value, or None."""
    devices = recipe.train.devices
    if not devices or ALL_DEVICES in environ:
        return None
    machine = _machine_devices(environ)
    environ[ALL_DEVICES] = ",".join(machine) if machine else ",".join(str(i) for i in range(max(devices) + 1))
    environ["CUDA_VISIBLE_DEVICES"] = _visible(list(devices), environ)
    return environ["CUDA_VISIBLE_DEVICES"]
