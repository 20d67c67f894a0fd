"""The prepared GPU check (benchmarks/gpu/): its preparation and its control flow, run on this CPU machine.

    .venv/bin/python -m pytest tests/benchmarks/test_gpu_check.py -q

The CUDA parts themselves need the GPU machine (the device tool); here the script must skip each of
them with one line and still write every section, `--smoke` must run every section's code at toy
sizes, and its time limit must stop it cleanly. The install is tested in a clean venv with wheels
downloaded for this machine's Python (the GPU machine's are for 3.12): the packages the GPU image
already has (rich, pyyaml, ...) are installed into that venv first from PyPI, as stand-ins.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHECK = ROOT / "benchmarks" / "gpu" / "check.py"
SECTIONS = ("throughput", "numerics", "pipeline", "fsdp")  # the most valuable first
# What the GPU image has that a clean venv lacks and `dspark --help` / a recipe load need.
IMAGE_STAND_INS = ["rich", "pyyaml", "annotated-doc", "shellingham"]


def _check(tmp_path: Path, *args: str, timeout: float = 900) -> tuple[dict, str]:
    out = tmp_path / "gpu_check.json"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run(
        [sys.executable, str(CHECK), "--out", str(out), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text()), proc.stderr


@pytest.mark.slow  # pip installs into a fresh venv
def test_prepare_and_install_into_a_clean_venv(tmp_path):
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    wheels = tmp_path / "wheels"
    prep = subprocess.run(
        ["bash", "benchmarks/gpu/prepare.sh", "--python-version", version, "--dest", str(wheels)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert prep.returncode == 0, prep.stderr[-2000:]
    names = {p.name.split("-")[0].lower() for p in wheels.glob("*.whl")}
    assert {"pydantic", "pydantic_core", "typer", "setuptools", "wheel"} <= names

    clean = tmp_path / "venv"
    venv.create(clean, with_pip=True)
    python = clean / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", *IMAGE_STAND_INS], check=True, timeout=300)
    site = tmp_path / "site"
    inst = subprocess.run(
        ["bash", "benchmarks/gpu/install.sh", str(site), str(wheels)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHON": str(python)},
    )
    assert inst.returncode == 0, inst.stderr[-2000:]
    assert (site / "dspark_cli" / "targets" / "tiny").is_dir()  # package data came along
    env = {**os.environ, "PYTHONPATH": str(site)}
    env.pop("VIRTUAL_ENV", None)
    code = (
        "import dspark_cli, pydantic; from dspark_cli.recipe import load_recipe, template_names; "
        "print(dspark_cli.__file__); print(pydantic.__file__); print(template_names()); "
        "print(load_recipe('kimi-k3').draft.num_layers)"
    )
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert lines[0].startswith(str(site)) and lines[1].startswith(str(site))  # the installed copies, not ours
    assert "kimi-k3" in lines[2] and lines[3] == "5"
    cli = subprocess.run([str(site / "bin" / "dspark"), "--help"], capture_output=True, text=True, env=env, timeout=120)
    assert cli.returncode == 0 and "Train, export, serve" in cli.stdout, cli.stderr[-2000:]


@pytest.mark.slow  # the whole check script in a child process: ~90 s loaded
def test_cpu_run_skips_each_cuda_part_with_one_line(tmp_path):
    results, stderr = _check(tmp_path)
    assert list(results["sections"]) == list(SECTIONS)  # run in this order
    assert results["environment"]["device"] == "cpu"
    numerics = results["sections"]["numerics"]
    for arch in ("mla", "gqa"):
        rows = numerics["drafts"][arch]
        # the CPU reference and the bf16 calibration ran and are small but non-zero errors
        assert 0 < rows["bf16_cpu"]["logits_rel"] < 0.05 and rows["bf16_cpu"]["grad_cos_min"] > 0.99
        # flex attention's forward, compiled, runs on the CPU too (its backward does not: CUDA rows)
        assert rows["fp32_cpu_flex_forward"]["status"] == "ok", rows["fp32_cpu_flex_forward"]
        assert rows["fp32_cpu_flex_forward"]["logits_rel"] < 1e-3
        for variant in ("fp32_cuda_flex", "bf16_cuda_flex", "bf16_cuda_flex_compiled"):
            assert rows[variant]["status"] == "skipped: no CUDA device"
    for name in ("pipeline", "throughput", "fsdp"):
        assert results["sections"][name]["status"] == "skipped: no CUDA device"
        assert sum(f"gpu-check: {name}: no CUDA device" in line for line in stderr.splitlines()) == 1


@pytest.mark.slow
def test_smoke_runs_every_section_on_cpu(tmp_path):
    # numerics' CPU rows are test_cpu_run_skips_each_cuda_part_with_one_line's; here the sections that need CUDA
    results, _ = _check(tmp_path, "--smoke", "--sections", "pipeline,throughput,fsdp", "--time-limit", "900")
    sections = results["sections"]
    assert sections["numerics"]["status"] == "not asked for"
    assert sections["pipeline"]["status"] == "ok", sections["pipeline"]
    assert set(sections["pipeline"]["stages"]) == {"datagen", "capture", "train", "export", "bench"}
    assert sections["pipeline"]["tau"][0]["tau"] >= 1.0
    assert sections["throughput"]["status"] == "ok", sections["throughput"]
    assert list(sections["throughput"]["drafts"]) == ["kimi-k3", "qwen3-8b"]  # the flagship first
    for template in ("qwen3-8b", "kimi-k3"):
        row = sections["throughput"]["drafts"][template]
        assert row["warmup_steps"] == 2 and row["peak_memory_gib"] is None  # (CUDA memory only)
        assert row["tokens_per_s"] > 0 and row["flops_per_token"] > 0 and row["distinct_shapes"] == 3
    fsdp = sections["fsdp"]
    assert fsdp["status"] == "ok", fsdp
    assert fsdp["backend"] == "gloo" and fsdp["resumed_from"].endswith("step-000004")
    assert fsdp["max_rel_loss_diff_after_resume"] < 1e-5


@pytest.mark.slow  # the check script in a child process: ~20 s loaded
def test_time_limit_stops_a_section_and_keeps_the_results(tmp_path):
    # fsdp, the only section asked for, gets what is left of 20 s after start-up; its three torchrun
    # launches take longer: killed, group and all
    results, stderr = _check(tmp_path, "--smoke", "--sections", "fsdp", "--time-limit", "20", timeout=120)
    assert results["sections"]["fsdp"]["status"].startswith("timed out after 1"), results["sections"]["fsdp"]
    assert all(results["sections"][s]["status"] == "not asked for" for s in ("numerics", "pipeline", "throughput"))
    for _ in range(50):  # SIGKILL is delivered at once; the ranks are reaped within moments
        leftover = subprocess.run(["pgrep", "-f", "gpu/check.py --fsdp-worker"], capture_output=True, text=True)
        if not leftover.stdout.strip():
            break
        time.sleep(0.1)
    assert leftover.stdout.strip() == "", "torchrun or a rank outlived the time limit"


@pytest.mark.slow  # the check script in a child process: 14 s loaded
def test_an_unknown_section_is_refused_before_anything_runs(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(CHECK), "--out", str(tmp_path / "x.json"), "--sections", "throughput,numerix"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        check=False,
    )
    assert proc.returncode == 2 and "unknown section(s) numerix" in proc.stderr
    assert not (tmp_path / "x.json").exists()
