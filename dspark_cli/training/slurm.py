"""The Slurm job script of an online run: producer nodes first, then the torchrun training nodes.

    dspark init kimi-k3 -o k3.yaml --slurm capture.workers=4 train.nnodes=2   # writes k3.yaml and k3.sbatch
    sbatch k3.sbatch                          # the whole online run on a 6-node allocation

The script is one file with two parts. Run by `sbatch`, it checks the allocation's size, runs
`dspark datagen` once (one task; resumable, a no-op when complete) and starts itself on every node
(`srun --ntasks-per-node=1 bash -c TEXT SCRIPT --node`: the text itself, since Slurm keeps the batch script
only on the first node). Run with `--node`, it reads `SLURM_NODEID` and
`SLURM_JOB_NODELIST` and becomes one role:

- nodes 0 .. P-1, P = ceil(capture.workers x engine GPUs / GPUs per node): `dspark produce` for this
  node's share of the producers (`--only`), each engine on its own GPUs;
- nodes P .. P+T-1, T = train.nnodes: `dspark train` with `train.rdzv_endpoint` on node P, which starts
  torchrun with `--nnodes=T` and c10d rendezvous; `capture.external_producers=true` (they only read).

Every node gets the same recipe, the same shape overrides (written into the script) and the
arguments given to `sbatch`, so all agree on one stream; each node logs to `LOGS/node-K.log`. A
failed node ends the step (`--kill-on-bad-exit`); submitting again resumes (`--resume auto`, the
producers capture again what the checkpoint does not cover).

Nothing the user gives becomes script text unquoted: the recipe path and every override are written
`shlex.quote`d (a `$(...)`, a backtick, a quote or a `;` in them is text, and the commands get each as one
argument). A newline in a single-quoted word is safe, but the recipe path also names the script in its
header comments, where a newline would start a line of its own (a command, or an `#SBATCH` directive):
control characters there are refused in one line, as are those other than a newline or tab in an
override (a carriage return makes sbatch refuse the whole script). The Slurm variables the script reads
(`SLURM_NNODES`, `SLURM_NODEID`) are checked to be numbers before any arithmetic uses them.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dspark_cli.errors import UsageError

if TYPE_CHECKING:
    from dspark_cli.recipe.schema import Recipe

RDZV_PORT = 29400
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_CONTROL_BUT_NEWLINE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")  # an override may hold a newline or a tab


def _printable(value: str, pattern: re.Pattern[str], what: str, hint: str) -> str:
    found = pattern.search(value)
    if found is not None:
        raise UsageError(f"{what} {value!r} holds a control character ({found.group()!r}): not in a Slurm script", hint)
    return value


@dataclass(frozen=True)
class SlurmShape:
    """How many nodes of each kind an online run takes."""

    workers: int  # capture.workers
    engine_gpus: int  # GPUs per producer engine: datagen.tensor_parallel_size (vLLM), 1 (hf)
    gpus_per_node: int
    train_nodes: int  # train.nnodes
    nproc_per_node: int

    @property
    def producers_per_node(self) -> int:
        return max(1, self.gpus_per_node // self.engine_gpus)

    @property
    def producer_nodes(self) -> int:
        return -(-self.workers // self.producers_per_node)

    @property
    def nodes(self) -> int:
        return self.producer_nodes + self.train_nodes


def slurm_shape(recipe: Recipe, gpus_per_node: int) -> SlurmShape:
    if recipe.capture.mode != "online":
        raise UsageError(
            "the Slurm job script runs online training; the recipe has capture.mode=offline", "add capture.mode=online"
        )
    engine = recipe.datagen.tensor_parallel_size if recipe.capture.backend == "vllm" else 1
    if engine > gpus_per_node:
        raise UsageError(
            f"one producer engine takes {engine} GPUs (datagen.tensor_parallel_size), more than "
            f"--gpus-per-node={gpus_per_node}",
            "give the nodes' GPU count, or a smaller engine",
        )
    if recipe.train.nproc_per_node > gpus_per_node:
        raise UsageError(
            f"train.nproc_per_node={recipe.train.nproc_per_node} is more than --gpus-per-node={gpus_per_node}",
            "one rank per GPU: lower train.nproc_per_node or raise train.nnodes",
        )
    return SlurmShape(recipe.capture.workers, engine, gpus_per_node, recipe.train.nnodes, recipe.train.nproc_per_node)


def slurm_script(recipe: Recipe, recipe_path: str, overrides: list[str], *, gpus_per_node: int = 8) -> str:
    """The job script's text for `recipe` (as loaded from `recipe_path` with `overrides`)."""
    shape = slurm_shape(recipe, gpus_per_node)
    _printable(recipe_path, _CONTROL, "the recipe path", "choose a file name without newlines or control characters")
    for item in overrides:
        _printable(item, _CONTROL_BUT_NEWLINE, "the override", "write it without control characters")
    if not re.fullmatch(r"[A-Za-z0-9._+-]+", recipe.name):  # the recipe's own rule: #SBATCH lines take no quotes
        raise UsageError(f"name {recipe.name!r} is not a plain name", "letters, digits, '.', '_', '+' and '-'")
    if recipe_path.startswith("-"):  # not an option of `dspark datagen`
        recipe_path = f"./{recipe_path}"
    fixed = [
        o
        for o in overrides
        if not o.startswith(("capture.workers=", "train.nnodes=", "train.nproc_per_node=", "capture.mode="))
    ]
    shape_args = [
        "capture.mode=online",
        f"capture.workers={shape.workers}",
        f"train.nnodes={shape.train_nodes}",
        f"train.nproc_per_node={shape.nproc_per_node}",
        *fixed,
    ]
    quoted = " ".join(shlex.quote(a) for a in shape_args)
    name = f"dspark-{recipe.name}"
    script_name = recipe_path.rsplit("/", 1)[-1].rsplit(".", 1)[0] + ".sbatch"
    script_name = f"./{script_name}" if script_name.startswith("-") else script_name
    return f"""#!/bin/bash
# dspark online training on a Slurm allocation, written by `dspark init ... --slurm`.
#   sbatch {shlex.quote(script_name)} [key=value ...]   # overrides go to every node
# nodes 0..{shape.producer_nodes - 1}: `dspark produce` ({shape.workers} producer(s) of {shape.engine_gpus} GPU(s), \
{shape.producers_per_node} per node)
# nodes {shape.producer_nodes}..{shape.nodes - 1}: `dspark train` under torchrun (--nnodes={shape.train_nodes}, \
{shape.nproc_per_node} ranks each), rendezvous on node {shape.producer_nodes}
# The recipe's output_dir (and capture.stream, unless mooncake://) must be on a filesystem every node mounts.
#SBATCH --job-name={name}
#SBATCH --nodes={shape.nodes}
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node={shape.gpus_per_node}
#SBATCH --exclusive
#SBATCH --output=dspark-%x-%j.out
set -euo pipefail

RECIPE={shlex.quote(recipe_path)}
SHAPE=({quoted})
PRODUCER_NODES={shape.producer_nodes}
PRODUCERS_PER_NODE={shape.producers_per_node}
WORKERS={shape.workers}
TRAIN_NODES={shape.train_nodes}
RDZV_PORT=${{DSPARK_RDZV_PORT:-{RDZV_PORT}}}
DSPARK=${{DSPARK:-dspark}}
LOGS=${{DSPARK_LOGS:-logs/dspark-${{SLURM_JOB_ID:-job}}}}

hosts() {{  # the allocation's host names, in node order
    if command -v scontrol >/dev/null 2>&1; then scontrol show hostnames "$SLURM_JOB_NODELIST"
    else tr ',' '\\n' <<< "$SLURM_JOB_NODELIST"; fi
}}

if [ "${{1:-}}" != "--node" ]; then
    HEAD=$(hosts | sed -n "$((PRODUCER_NODES + 1))p")
    if [ "${{SLURM_NNODES:-}}" != "$((PRODUCER_NODES + TRAIN_NODES))" ]; then
        echo "error: this job needs $((PRODUCER_NODES + TRAIN_NODES)) nodes, the allocation has ${{SLURM_NNODES:-none}}" >&2
        echo "  submit it with sbatch (its #SBATCH --nodes line), or write the script again for this size" >&2
        exit 2
    fi
    mkdir -p -- "$LOGS"
    srun --nodes=1 --ntasks=1 "$DSPARK" datagen "$RECIPE" "${{SHAPE[@]}}" "train.rdzv_endpoint=$HEAD:$RDZV_PORT" "$@"
    # the script's text, not its path: sbatch runs a copy in the first node's spool, which other nodes lack
    exec srun --ntasks-per-node=1 --kill-on-bad-exit=1 bash -c "$(cat -- "$0")" "$0" --node "$@"
fi
shift

NODE=${{SLURM_NODEID:?SLURM_NODEID is not set: run this part through srun}}
case $NODE in ''|*[!0-9]*) echo "error: SLURM_NODEID=$NODE is not a node number" >&2; exit 2 ;; esac
mapfile -t HOSTS < <(hosts)
mkdir -p -- "$LOGS"
LOG="$LOGS/node-$NODE.log"
echo "dspark: node $NODE of ${{#HOSTS[@]}} (${{HOSTS[$NODE]:-?}}), log $LOG" >&2
HEAD=${{HOSTS[$PRODUCER_NODES]:?the allocation lists fewer hosts than nodes}}
SHAPE+=("train.rdzv_endpoint=$HEAD:$RDZV_PORT")  # the first training node's; the same recipe on every node
if [ "$NODE" -lt "$PRODUCER_NODES" ]; then
    FIRST=$((NODE * PRODUCERS_PER_NODE))
    LAST=$((FIRST + PRODUCERS_PER_NODE - 1))
    [ "$LAST" -lt "$WORKERS" ] || LAST=$((WORKERS - 1))
    exec "$DSPARK" produce "$RECIPE" --only "$(seq -s, "$FIRST" "$LAST")" "${{SHAPE[@]}}" "$@" >"$LOG" 2>&1
fi
exec "$DSPARK" train "$RECIPE" "${{SHAPE[@]}}" capture.external_producers=true --resume=auto "$@" >"$LOG" 2>&1
"""
