"""Hostile names and overrides in the Slurm job script (`dspark init --slurm`): nothing a user types becomes
a line or a command of the script.

Each case writes the script from a hostile recipe file name or override, checks `bash -n`, the `#SBATCH`
directives sbatch would read, and then runs the script dry: bash with stub executables first on PATH
(srun, scontrol, sbatch, torchrun, python, dspark, touch), each appending its argv to a JSON log; the srun
stub runs its command once per node as Slurm would. The log must hold exactly the intended commands, the
hostile value intact as one argument, and no injected one (no `touch`, no PWNED file).

    .venv/bin/python -m pytest tests/cli/test_hostile_slurm.py -q
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_support import assert_user_error, invoke

# what the script may call that a Slurm node provides; `touch` too, so an injected `touch PWNED` is logged
STUBS = ("srun", "scontrol", "sbatch", "torchrun", "python", "python3", "dspark", "touch")
STUB = """#!{python} -S
import json, os, subprocess, sys
name, args = os.path.basename(sys.argv[0]), sys.argv[1:]
with open(os.environ["STUB_LOG"], "a", encoding="utf-8") as log:
    log.write(json.dumps({{"cmd": name, "argv": args, "node": os.environ.get("SLURM_NODEID")}}) + "\\n")
if name == "scontrol" and args[:2] == ["show", "hostnames"]:
    print("\\n".join(args[2].split(",")))
elif name == "srun":  # run the command after srun's options: once (--nodes=1) or on every node, in order
    first = next(i for i, a in enumerate(args) if not a.startswith("--"))
    options, command = args[:first], args[first:]
    nodes = 1 if "--nodes=1" in options else int(os.environ["SLURM_NNODES"])
    for node in range(nodes):
        code = subprocess.run(command, env={{**os.environ, "SLURM_NODEID": str(node)}}).returncode
        if code:
            sys.exit(code)
"""

NODES = "n0,n1,n2"  # tiny, capture.workers=2, train.nnodes=2, 2 GPUs per node: producers on n0, rendezvous on n1
SHAPE = ["capture.mode=online", "capture.workers=2", "train.nnodes=2", "train.nproc_per_node=1"]
INJECTIONS = ["$(touch PWNED)", "x`touch PWNED`", "'; touch PWNED; '", '"; touch PWNED; "', "a b; touch PWNED"]
NAMES = [
    "$(touch PWNED).yaml",
    "`touch PWNED`.yaml",
    "it's.yaml",
    'say "hi".yaml',
    "a b.yaml",
    "a;touch PWNED;.yaml",
    "-rf.yaml",  # read as an option if passed bare
    "${IFS}x.yaml",
]
OVERRIDES = [
    *(f"publish.license={value}" for value in INJECTIONS),
    "publish.license=x\ntouch PWNED",  # a newline: quoted, one argument
    "publish.license=x\n#SBATCH --wrap=touch PWNED",  # not a directive: sbatch reads those above the first command
    "publish.license=it's \"x\" \\'y",
]


def stub_path(tmp_path: Path) -> Path:
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    for name in STUBS:
        (stubs / name).write_text(STUB.format(python=sys.executable))
        (stubs / name).chmod(0o755)
    return stubs


def write_script(monkeypatch, where: Path, name: str, *overrides: str) -> Path:
    """`dspark init tiny -o NAME --slurm` in `where` (a relative name, as users type it); the script's path."""
    where.mkdir(exist_ok=True)
    monkeypatch.chdir(where)
    result = invoke(
        "init", "tiny", "-o", name, "--slurm", "--gpus-per-node=2", "capture.workers=2", "train.nnodes=2", *overrides
    )
    assert result.exit_code == 0, result.output
    script = (where / name).with_suffix(".sbatch")
    assert script.is_file() and (where / name).is_file()
    return script


def directives(script: Path) -> list[str]:
    """The `#SBATCH` lines sbatch reads: those before the first line that is neither blank nor a comment."""
    found = []
    for line in script.read_text().splitlines()[1:]:
        if line.strip() and not line.startswith("#"):
            break
        if line.startswith("#SBATCH"):
            found.append(line)
    return found


def dry_run(
    script: Path, tmp_path: Path, *sbatch_args: str, **env: str
) -> tuple[subprocess.CompletedProcess, list[dict]]:
    """The script run by bash as sbatch would start it (an allocation of 3 nodes), every command stubbed."""
    log = tmp_path / "calls.jsonl"
    log.unlink(missing_ok=True)
    stubs = tmp_path / "stubs" if (tmp_path / "stubs").is_dir() else stub_path(tmp_path)
    run = subprocess.run(
        ["bash", str(script), *sbatch_args],
        cwd=script.parent,
        env={
            "PATH": f"{stubs}:{os.environ['PATH']}",
            "HOME": str(tmp_path),
            "STUB_LOG": str(log),
            "SLURM_JOB_NODELIST": NODES,
            "SLURM_NNODES": "3",
            "SLURM_JOB_ID": "77",
            "DSPARK_LOGS": str(tmp_path / "logs"),
            **env,
        },
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.is_file() else []
    return run, calls


def intended(recipe: str, fixed: list[str], extra: list[str]) -> list[tuple[str, list[str], str | None]]:
    """(command, argv, SLURM_NODEID) of every call the script should make, in order."""
    shape, rdzv = [*SHAPE, *fixed], "train.rdzv_endpoint=n1:29400"
    hosts = ("scontrol", ["show", "hostnames", NODES])
    calls = [
        (*hosts, None),
        ("srun", ["--nodes=1", "--ntasks=1", "dspark", "datagen", recipe, *shape, rdzv, *extra], None),
        ("dspark", ["datagen", recipe, *shape, rdzv, *extra], "0"),
        (
            "srun",
            ["--ntasks-per-node=1", "--kill-on-bad-exit=1", "bash", "-c", "TEXT", "SCRIPT", "--node", *extra],
            None,
        ),
        (*hosts, "0"),
        ("dspark", ["produce", recipe, "--only", "0,1", *shape, rdzv, *extra], "0"),
    ]
    for node in ("1", "2"):
        train = ["train", recipe, *shape, rdzv, "capture.external_producers=true", "--resume=auto", *extra]
        calls += [(*hosts, node), ("dspark", train, node)]
    return calls


def assert_intended(script: Path, calls: list[dict], recipe: str, fixed: list[str], extra: list[str]) -> None:
    text = script.read_text().rstrip("\n")  # srun gets the script's text (no copy of the file on other nodes)
    named = {str(script): "SCRIPT", text: "TEXT"}
    got = [(c["cmd"], [named.get(a, a) for a in c["argv"]], c["node"]) for c in calls]
    assert got == intended(recipe, fixed, extra)
    assert not list(script.parent.parent.rglob("PWNED")), "an injected command ran"


@pytest.mark.parametrize("name", NAMES)
def test_a_hostile_recipe_name_is_one_quoted_argument(tmp_path, monkeypatch, name):
    script = write_script(monkeypatch, tmp_path / "job", name)
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True, check=False).returncode == 0
    assert directives(script) == [
        "#SBATCH --job-name=dspark-tiny",
        "#SBATCH --nodes=3",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --gpus-per-node=2",
        "#SBATCH --exclusive",
        "#SBATCH --output=dspark-%x-%j.out",
    ]
    extra = ["publish.license=$(touch PWNED)"]  # what `sbatch SCRIPT key=value` passes: every node gets it intact
    run, calls = dry_run(script, tmp_path, *extra)
    assert run.returncode == 0, run.stderr
    assert_intended(script, calls, f"./{name}" if name.startswith("-") else name, [], extra)


@pytest.mark.parametrize("override", OVERRIDES)
def test_a_hostile_override_is_one_quoted_argument(tmp_path, monkeypatch, override):
    script = write_script(monkeypatch, tmp_path / "job", "job.yaml", override)
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True, check=False).returncode == 0
    assert len(directives(script)) == 6 and not any("wrap" in line for line in directives(script))
    run, calls = dry_run(script, tmp_path)
    assert run.returncode == 0, run.stderr
    assert_intended(script, calls, "job.yaml", [override], [])


def test_a_name_with_a_newline_is_refused_and_nothing_is_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in ("k3\ntouch PWNED\n.yaml", "k3\rx.yaml", "k3\x1b[2Jx.yaml"):
        assert_user_error(invoke("init", "tiny", "-o", name, "--slurm", "capture.workers=2"), "-o", "control character")
        assert_user_error(invoke("init", "tiny", "-o", name), "-o", "control character")
    result = invoke("init", "tiny", "-o", "k.yaml", "--slurm", "publish.license=a\r\nb")  # sbatch refuses \r\n
    assert_user_error(result, "override", "control character")
    assert list(tmp_path.iterdir()) == []


def test_hostile_slurm_variables_run_nothing(tmp_path, monkeypatch):
    """The script indexes an array with SLURM_NODEID, and bash runs the `$(cmd)` of a value `WORKERS[$(cmd)]`
    used as an index: it is checked to be a number first, SLURM_NNODES too.
    DSPARK_LOGS and DSPARK_RDZV_PORT reach the commands as text."""
    script = write_script(monkeypatch, tmp_path / "job", "job.yaml")
    run, calls = dry_run(script, tmp_path, "--node", SLURM_NODEID="WORKERS[$(touch PWNED)]")
    assert run.returncode == 2 and "is not a node number" in run.stderr, run.stderr
    assert [c["cmd"] for c in calls] == []
    run, calls = dry_run(script, tmp_path, SLURM_NNODES="WORKERS[$(touch PWNED)]")
    assert run.returncode == 2 and "this job needs 3 nodes" in run.stderr, run.stderr
    assert [c["cmd"] for c in calls] == ["scontrol"]
    logs, port = str(tmp_path / "$(touch PWNED)"), "29400`touch PWNED`"
    run, calls = dry_run(script, tmp_path, "--node", SLURM_NODEID="1", DSPARK_LOGS=logs, DSPARK_RDZV_PORT=port)
    assert run.returncode == 0, run.stderr
    assert [c["cmd"] for c in calls] == ["scontrol", "dspark"]
    assert f"train.rdzv_endpoint=n1:{port}" in calls[1]["argv"] and Path(logs, "node-1.log").is_file()
    assert not list(tmp_path.rglob("PWNED"))
