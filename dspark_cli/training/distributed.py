"""Processes, devices and FSDP2: one process per GPU (or CPU process on gloo), launched by torchrun.

    env = init_distributed()                 # reads torchrun's RANK / WORLD_SIZE / LOCAL_RANK
    model = shard(train_step, env)           # FSDP2 fully_shard of the draft + its loss
    cmd = torchrun_command(["r.yaml"], nproc=2)   # what `dspark train --nproc 2` runs

Without torchrun's variables the run is one process with no process group, and the model is not
wrapped (FSDP2 on one rank only adds hooks). Under torchrun the backend is NCCL on CUDA and gloo
on CPU; `fully_shard` (FSDP2) works on both -- FSDP1 does not work on CPU.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

import torch
import torch.distributed as dist

from dspark_cli.machine.cpu import under_torchrun

LAUNCHED_ENV = "DSPARK_TORCHRUN_CHILD"  # set for the children so they do not launch torchrun again


@dataclass(frozen=True)
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    # True when this run joined torchrun's process group. A group someone else initialised in this
    # process (e.g. an in-process vLLM engine) is neither used for collectives nor destroyed by us.
    owns_group: bool = False

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1 or self.owns_group


def init_distributed(device: str | None = None) -> DistEnv:
    """Join torchrun's process group (if launched by it) and pick this process's device."""
    rank = int(os.environ.get("RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))
    local = int(os.environ.get("LOCAL_RANK", 0))
    use_cuda = torch.cuda.is_available() if device is None else device.startswith("cuda")
    dev = torch.device("cuda", local) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(dev)
    owns = under_torchrun()
    if owns and not dist.is_initialized():
        backend, device_id = ("nccl", dev) if use_cuda else ("gloo", None)
        store = restart_store(world)
        if store is None:
            dist.init_process_group(backend, device_id=device_id)
        else:
            dist.init_process_group(backend, store=store, rank=rank, world_size=world, device_id=device_id)
    return DistEnv(rank, world, local, dev, owns_group=owns)


def restart_store(world_size: int, environ: dict[str, str] | None = None) -> dist.Store | None:
    """The ranks' store after a torchrun restart when it is torchrun's shared rendezvous store
    (TORCHELASTIC_USE_AGENT_STORE): that store has no per-restart prefix, so a restarted gang would
    read the dead gang's keys, e.g. gloo / NCCL addresses (pytorch/pytorch#135712). On one machine
    (one agent) it is prefixed here by the agent's restart count. Several agents do not count
    restarts alike (one whose ranks were healthy restarts them without counting), so there a run
    that may restart is refused up front. None: the default store is right (no restart yet, or a
    store of the ranks' own, as `dspark train` launches torchrun: training/launch.py)."""
    environ = os.environ if environ is None else environ  # type: ignore[assignment]
    if environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    if int(environ.get("TORCHELASTIC_MAX_RESTARTS", "0") or 0) and int(environ.get("GROUP_WORLD_SIZE", "1") or 1) > 1:
        from dspark_cli.errors import UsageError

        raise UsageError(
            "torchrun --max-restarts across machines shares its rendezvous store with the ranks, so a "
            "restarted job would read the dead ranks' keys and hang",
            "start torchrun with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 in its environment "
            "(dspark train sets it when it launches torchrun itself)",
        )
    restart = int(environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
    if restart == 0:
        return None
    from torch.distributed.constants import default_pg_timeout

    shared = dist.TCPStore(
        environ["MASTER_ADDR"], int(environ["MASTER_PORT"]), world_size, is_master=False, timeout=default_pg_timeout
    )
    return dist.PrefixStore(f"dspark/restart-{restart}", shared)


def shard(module: torch.nn.Module, env: DistEnv, param_dtype: torch.dtype | None = None) -> torch.nn.Module:
    """FSDP2 with one unit for the whole draft: parameters, gradients and optimizer state are sharded
    across ranks; the parameters are gathered once per forward and once per backward.

    Not one unit per decoder layer: the draft's forward computes every layer's context K/V up front
    (`DSparkDraftModel.context_kv`, outside the layers' own forward), which per-layer units would
    meet still sharded. Drafts are a few layers, so gathering them whole costs little memory.

    `param_dtype` bf16 (bf16 training): FSDP2's `MixedPrecisionPolicy` all-gathers the parameters in
    bf16 (half the traffic and the unsharded copy) and reduce-scatters the gradients in fp32, so
    gradient sums lose no precision (and gloo, which cannot reduce bf16, works); the sharded master
    weights and AdamW's state stay fp32. Forward inputs are not cast: the batch is already in the
    compute dtype and the global slot weight must stay fp32.
    """
    if not env.distributed:
        return module
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy()
    if param_dtype is not None and param_dtype != torch.float32:
        policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32, cast_forward_inputs=False)
    fully_shard(module, mp_policy=policy)
    return module


def clip_grad_norm(params: list[torch.nn.Parameter], max_norm: float, env: DistEnv) -> torch.Tensor:
    """`torch.nn.utils.clip_grad_norm_` (2-norm, same coefficient), computed on FSDP2's local gradient
    shards: one norm pass and one scalar all-reduce, instead of torch's per-tensor DTensor dispatches
    (benchmarks/train_speed.py). Every FSDP2 gradient is Shard(0) over one
    mesh dimension, so each element lives on exactly one rank and the squared norms add up; any other
    placement goes to torch's implementation."""
    from torch.distributed.tensor import DTensor

    grads = [p.grad for p in params if p.grad is not None]
    sharded = [g for g in grads if isinstance(g, DTensor)]
    if any(len(g.placements) != 1 or not g.placements[0].is_shard() for g in sharded):
        return torch.nn.utils.clip_grad_norm_(params, max_norm)
    if not grads:
        return torch.zeros((), device=env.device)
    local = [g.to_local() if isinstance(g, DTensor) else g for g in grads]
    squares = torch.stack([n.float() for n in torch._foreach_norm(local, 2.0)]).square().sum()
    if sharded and env.distributed:
        dist.all_reduce(squares, op=dist.ReduceOp.SUM)
    total = squares.sqrt()
    torch._foreach_mul_(local, (max_norm / (total + 1e-6)).clamp(max=1.0))
    return total


def all_reduce_sum(tensor: torch.Tensor, env: DistEnv) -> torch.Tensor:
    if env.distributed:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def all_reduce_max(value: int, env: DistEnv) -> int:
    if not env.distributed:
        return value
    tensor = torch.tensor([value], dtype=torch.int64, device=env.device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return int(tensor.item())


def all_reduce_min(tensor: torch.Tensor, env: DistEnv) -> int:
    """The smallest value of a one-element tensor over ranks, as an int (a sync point)."""
    if env.distributed:
        tensor = tensor.clone()
        dist.all_reduce(tensor, op=dist.ReduceOp.MIN)
    return int(tensor.item())


def barrier(env: DistEnv) -> None:
    if env.distributed:
        dist.barrier()


def shutdown(env: DistEnv, *, failed: bool = False) -> None:
    """Leave the process group. After a finished run, barrier first: destroying the group while a peer is
    still in a collective hangs it. A rank that failed leaves without one: its peers are in a collective
    it will never join (a barrier there would wait beside them for the group's timeout, 30 minutes);
    its exit closes its connections, their collective fails, and torchrun stops the gang."""
    if env.owns_group and dist.is_initialized() and not failed:
        dist.barrier()
        dist.destroy_process_group()


def torchrun_command(
    rank_args: list[str],
    *,
    nproc: int,
    nnodes: int = 1,
    rdzv_endpoint: str | None = None,
    run_id: str = "dspark-train",
    max_restarts: int = 0,
    log_dir: str | None = None,
) -> list[str]:
    """`python -m torch.distributed.run ... -m dspark_cli.training <rank_args>` for `nproc` processes per
    machine (each rank runs training/__main__.py); `max_restarts` > 0: torchrun restarts the whole gang
    after a rank dies (each rank resumes from the last checkpoint, as `rank_args` say `--resume=auto`).
    `log_dir`: torchrun keeps each rank's error file (`<log_dir>/<run>/attempt_<n>/<local rank>/error.json`)
    and stderr there, and copies the stderr to its own (`--tee=2`)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}"]
    if max_restarts:
        cmd.append(f"--max-restarts={max_restarts}")
    if nnodes > 1:
        if not rdzv_endpoint:
            from dspark_cli.errors import UsageError

            raise UsageError(
                "train.nnodes > 1 needs train.rdzv_endpoint (host:port of the rendezvous)",
                "set train.rdzv_endpoint=HOST:29400 and run the same command on every machine",
            )
        cmd += [f"--nnodes={nnodes}", "--rdzv-backend=c10d", f"--rdzv-endpoint={rdzv_endpoint}", f"--rdzv-id={run_id}"]
    else:
        cmd += ["--standalone"]  # a free port on this machine; no clashes between runs
    if log_dir:
        cmd += [f"--log-dir={log_dir}", "--tee=2"]
    return [*cmd, "-m", "dspark_cli.training", *rank_args]
