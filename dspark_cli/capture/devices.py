"""Which devices the online producers and the trainer ranks use on one machine, and when a split cannot work.

    from dspark_cli.capture.devices import device_split_problems, producer_environ
    device_split_problems(recipe, available=8)   # [] or one line per problem (the preflight's rule)
    producer_environ(recipe, worker=1, base=os.environ)   # CUDA_VISIBLE_DEVICES for producer 1

`capture.devices` and `train.devices` are device numbers of this machine (indices into an outer
CUDA_VISIBLE_DEVICES when one is set). Producer w takes the w-th group of `engine_devices(recipe)`
entries of `capture.devices` (vLLM: the capture engine's tensor parallelism,
`datagen.tensor_parallel_size`; hf: one device); trainer local rank r takes `train.devices[r]`.
Unset, nothing is pinned (CPU runs, or a machine that only produces or only trains).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

ALL_DEVICES = "DSPARK_ALL_DEVICES"  # the machine's device list before a rank narrowed CUDA_VISIBLE_DEVICES
# torchrun's variables: a producer started by a rank is not part of the training job
TORCHRUN_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME",
                 "ROLE_WORLD_SIZE", "GROUP_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
                 "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_USE_AGENT_STORE",
                 "TORCH_NCCL_ASYNC_ERROR_HANDLING", "TORCHELASTIC_ERROR_FILE")


def engine_devices(recipe: Any) -> int:
    """Devices one producer's engine needs: vLLM's tensor parallelism, or one for hf."""
    return recipe.datagen.tensor_parallel_size if recipe.capture.backend == "vllm" else 1


def device_split_problems(recipe: Any, available: int | None = None) -> list[str]:
    """Why this machine's producer / trainer split cannot work (empty when it can), one line each:
    overlapping lists, too few capture devices for `capture.workers` engines of `engine_devices`,
    too few train devices for `train.nproc_per_node`, numbers beyond the `available` devices."""
    capture, train = recipe.capture, recipe.train
    problems: list[str] = []
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
        problems.append(f"capture.devices and train.devices share devices {overlap}: the engines and the trainers "
                        "would compete for their memory")
    need = capture.workers * engine_devices(recipe)
    if cap and len(cap) < need:
        problems.append(f"capture.devices has {len(cap)} devices, {capture.workers} producers x "
                        f"{engine_devices(recipe)} (engine tensor parallelism) need {need}")
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


def producer_environ(recipe: Any, worker: int, base: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The environment of producer `worker`: not a torchrun worker, and on its own devices when set."""
    env = {k: v for k, v in base.items() if k not in TORCHRUN_VARS}
    devices = recipe.capture.devices
    if devices:
        per = engine_devices(recipe)
        env["CUDA_VISIBLE_DEVICES"] = _visible(list(devices)[worker * per:(worker + 1) * per], base)
        env[ALL_DEVICES] = ",".join(_machine_devices(base) or [])
    return env


def narrow_train_devices(recipe: Any, environ: dict[str, str] = os.environ) -> str | None:  # type: ignore[assignment]
    """Before CUDA starts in a trainer rank: keep only `train.devices` visible (local rank r uses the
    r-th); remember the machine's list for the producers it starts. Returns the new value, or None."""
    devices = recipe.train.devices
    if not devices or ALL_DEVICES in environ:
        return None
    machine = _machine_devices(environ)
    environ[ALL_DEVICES] = ",".join(machine) if machine else ",".join(str(i) for i in range(max(devices) + 1))
    environ["CUDA_VISIBLE_DEVICES"] = _visible(list(devices), environ)
    return environ["CUDA_VISIBLE_DEVICES"]
