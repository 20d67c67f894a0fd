"""Hidden-state capture on the bundled tiny targets: numerics against a plain transformers forward, the
vLLM translation and post-processing (CPU, with a fake engine), shard integrity, resume, plans.

    .venv/bin/python -m pytest tests/capture/test_capture.py -q
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from capture_support import DATAGEN_OVERRIDES, capture_recipe
from procs_support import children, hold_lock, wait_gone
from safetensors.torch import save_file

from dspark_cli.capture import contract_for_recipe, iter_captured, plan_capture, run_capture, verify_captured
from dspark_cli.capture.plan import build_plan
from dspark_cli.capture.vllm import VLLMCapturer, engine_kwargs, k3_environment, vllm_layout
from dspark_cli.errors import ContractError, DataError, DsparkError, UsageError
from dspark_cli.recipe import load_recipe
from dspark_cli.targets import Target

TARGETS = ("tiny-mla", "tiny-gqa")
BF16_RTOL = 2.0**-8  # one bf16 rounding step


def reference_forward(
    model_dir: str, ids: torch.Tensor
) -> tuple[tuple[torch.Tensor, ...], torch.Tensor, torch.nn.Module]:
    """A plain, unbatched fp32 transformers forward: (hidden_states tuple, raw output of the last layer, model)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    raw_last = {}
    handle = model.model.layers[-1].register_forward_hook(lambda m, a, out: raw_last.setdefault("x", out))
    with torch.no_grad():
        out = model(ids[None], output_hidden_states=True)
    handle.remove()
    raw = raw_last["x"][0] if isinstance(raw_last["x"], tuple) else raw_last["x"]
    return tuple(h[0] for h in out.hidden_states), raw[0], model


def close(a: torch.Tensor, b: torch.Tensor, steps: int = 1) -> bool:
    """Equal up to `steps` bf16 roundings (neighbouring layers and pre/post-norm states differ far more)."""
    return torch.allclose(a.float(), b.float(), rtol=steps * BF16_RTOL, atol=1e-4)


@pytest.fixture(scope="module", params=TARGETS)
def captured(request, tmp_path_factory):
    """Offline capture of the shared datagen output, default layer ids (they include the last layer)."""
    tmp = tmp_path_factory.mktemp(request.param)
    recipe = capture_recipe(request.param, tmp, "capture.batch_size=3", "capture.shard_tokens=200")
    summary = run_capture(recipe)
    return recipe, summary, list(iter_captured(recipe.stage_dir("capture"), expect=contract_for_recipe(recipe)))


@pytest.mark.slow  # a real capture per target (the `captured` fixture): ~40 s each loaded
def test_layers_and_last_state_equal_a_plain_transformers_forward(captured):
    recipe, summary, sequences = captured
    geometry = Target.of(recipe).geometry()
    ids = list(contract_for_recipe(recipe).target_layer_ids)
    depth, hidden = geometry.num_hidden_layers, geometry.hidden_size
    assert ids[-1] == depth - 1 and len(ids) == 5  # the default spread reads the last layer: the hard case
    assert summary.shards >= 2 and len(sequences) == summary.sequences == 6
    for seq in sequences[:3]:
        states, raw_last, model = reference_forward(geometry.location, seq.input_ids)
        assert seq.aux_hidden.dtype == seq.last_hidden.dtype == torch.bfloat16
        assert seq.aux_hidden.shape == (seq.num_tokens, len(ids) * hidden)
        for slot, k in enumerate(ids):
            got = seq.aux_hidden[:, slot * hidden : (slot + 1) * hidden]
            want = raw_last if k == depth - 1 else states[k + 1]  # transformers returns the last layer post-norm
            assert close(got, want), f"layer {k}"
            assert not close(got, states[k]), f"layer {k} equals hidden_states[{k}]: off by one"
            if k + 2 < len(states):
                assert not close(got, states[k + 2]), f"layer {k} equals hidden_states[{k + 2}]: off by one"
        mask = seq.loss_mask
        assert close(seq.last_hidden[mask], states[-1][mask])  # post-final-norm == transformers hidden_states[-1]
        assert close(model.model.norm(raw_last)[mask], states[-1][mask])  # ... which is norm(raw last output)
        assert not close(seq.last_hidden[mask], raw_last[mask]), "pre-norm last state stored"
        assert torch.count_nonzero(seq.last_hidden[~mask]) == 0


@pytest.mark.slow  # uses the `captured` fixture (a real capture per target)
def test_shards_are_small_and_exactly_planned(captured):
    recipe, summary, sequences = captured
    geometry = Target.of(recipe).geometry()
    manifest = json.loads((Path(recipe.stage_dir("capture")) / "manifest.json").read_text())
    plan = plan_capture(recipe)
    n, hidden = 5, geometry.hidden_size
    tokens, loss = manifest["num_tokens"], manifest["num_loss_tokens"]
    tensor_bytes = 2 * hidden * (n * tokens + loss) + 5 * tokens + 4 * manifest["num_sequences"]
    header = manifest["bytes"] - tensor_bytes
    assert plan["total_bytes"] == tensor_bytes and 0 < header < 2048 * len(manifest["shards"])
    assert manifest["bytes_per_token"] < plan["goal_bytes_per_token"] == 2 * (n + 1) * hidden + 5
    assert manifest["contract"]["layer_convention"].startswith("output_of_layer_k")
    assert manifest["contract"]["last_hidden"] == "post_final_norm" and manifest["layout"]["dtype"] == "bfloat16"
    assert (
        plan["already_done"] == len(manifest["shards"])
        and (Path(recipe.stage_dir("capture")) / "recipe.yaml").is_file()
    )
    assert [s.id for s in sequences] == [i for s in build_plan(recipe).shards for i in s.ids]


class FakeOutput:
    def __init__(self, path: str) -> None:
        self.kv_transfer_params = {"hidden_states_path": path}


class FakeConnectorLLM:
    """Stands in for `vllm.LLM` with the hidden-states connector: writes what the connector writes, taken
    from an independent transformers forward (aux id a = input of layer a; a == depth: pre-norm output)."""

    def __init__(self, model_dir: str, aux_ids: list[int], storage: Path) -> None:
        self.model_dir, self.aux_ids, self.storage, self.calls = model_dir, aux_ids, storage, []
        self.keep = None  # set to n: the engine only saw the first n tokens (a silently cut prompt)

    def generate(self, prompts, sampling_params, use_tqdm=False):
        outs = []
        for number, prompt in enumerate(prompts):
            ids = torch.tensor(prompt["prompt_token_ids"][: self.keep])
            states, raw_last, _ = reference_forward(self.model_dir, ids)
            depth = len(states) - 1
            stacked = torch.stack([raw_last if a == depth else states[a] for a in self.aux_ids], dim=1)
            path = self.storage / f"req-{len(self.calls)}-{number}.safetensors"
            save_file({"hidden_states": stacked.to(torch.bfloat16), "token_ids": ids}, str(path))
            Path(str(path) + ".lock").touch()
            outs.append(FakeOutput(str(path)))
        self.calls.append((prompts, sampling_params))
        return outs


@pytest.mark.slow  # uses the `captured` fixture (a real capture per target)
def test_vllm_translation_and_postprocessing_match_hf_capture(captured, tmp_path):
    """The translation on a stand-in engine: engine arguments (GPU and CPU), aux ids, and the final norm
    applied to vLLM's pre-norm state (the real engine: tests/capture/test_capture_vllm.py)."""
    recipe, _, sequences = captured
    geometry = Target.of(recipe).geometry()
    ids = list(contract_for_recipe(recipe).target_layer_ids)
    depth = geometry.num_hidden_layers
    layout = vllm_layout(ids, depth)
    assert layout.aux_ids == sorted({k + 1 for k in ids} | {depth})  # last layer once, even if already listed
    kwargs = engine_kwargs(recipe, geometry.location, layout, str(tmp_path), on_cpu=False)
    assert "kv_connector_module_path" not in kwargs["kv_transfer_config"]  # vLLM's own connector on GPUs
    on_cpu = engine_kwargs(recipe, geometry.location, layout, str(tmp_path), on_cpu=True)
    assert on_cpu["kv_transfer_config"]["kv_connector"] == "HostHiddenStatesConnector"
    assert on_cpu["kv_transfer_config"]["kv_connector_module_path"] == "dspark_cli.capture.vllm_connector"
    if not torch.cuda.is_available():
        assert on_cpu["enforce_eager"] and on_cpu["kv_cache_memory_bytes"]  # datagen's CPU engine settings
        assert on_cpu["dtype"] == "float32" or recipe.target.dtype != "auto"
    spec = kwargs["speculative_config"]
    assert spec["method"] == "extract_hidden_states" and spec["num_speculative_tokens"] == 1
    assert spec["draft_model_config"]["hf_config"]["eagle_aux_hidden_state_layer_ids"] == [k + 1 for k in ids]
    assert kwargs["enable_chunked_prefill"] is False and kwargs["enable_prefix_caching"] is False
    assert kwargs["kv_transfer_config"]["kv_connector"] == "ExampleHiddenStatesConnector"
    assert kwargs["kv_transfer_config"]["kv_connector_extra_config"]["shared_storage_path"] == str(tmp_path)
    fake = FakeConnectorLLM(geometry.location, layout.aux_ids, tmp_path)
    capturer = VLLMCapturer(recipe, geometry, ids, storage_dir=str(tmp_path), llm=fake, sampling_params="greedy-1")
    samples = [(s.id, s.input_ids.tolist(), s.loss_mask.int().tolist()) for s in sequences[:2]]
    got = capturer.capture(samples)
    assert fake.calls[0][1] == "greedy-1" and not list(tmp_path.glob("req-*"))  # connector files consumed
    for mine, hf in zip(got, sequences[:2], strict=True):
        assert close(mine.aux_hidden, hf.aux_hidden)
        # vLLM hands over the pre-norm state in bf16; normalised and rounded again: two roundings.
        assert close(mine.last_hidden, hf.last_hidden, steps=2)
        assert not close(mine.last_hidden[hf.loss_mask], hf.aux_hidden[hf.loss_mask, -geometry.hidden_size :], steps=2)
    fake.keep = 8
    with pytest.raises(DataError, match="differ from the sample"):
        capturer.capture(samples[:1])


def _fake_k3(tmp_path: Path) -> Path:
    target = tmp_path / "Kimi-K3-mini"
    target.mkdir()
    (target / "config.json").write_text(
        json.dumps({"model_type": "kimi_k3", "num_hidden_layers": 12, "hidden_size": 64, "rms_norm_eps": 1e-5})
    )
    return target


def test_kimi_k3_stream_is_part_of_the_contract(tmp_path, monkeypatch):
    target = _fake_k3(tmp_path)
    recipe = load_recipe(
        "tiny",
        [
            f"target.model={target}",
            f"output_dir={tmp_path}/run",
            "capture.backend=vllm",
            "capture.aux_attn_res_stream=true",
            "draft.target_layer_ids=[1, 5, 11]",
        ],
    )
    contract = contract_for_recipe(recipe)
    assert contract.extra == {"aux_attn_res_stream": True}
    plan = plan_capture(recipe)
    assert plan["vllm_aux_layer_ids"] == [2, 6, 12] and plan["datagen_ready"] is False
    monkeypatch.delenv("VLLM_KIMI_K3_AUX_ATTN_RES_STREAM", raising=False)
    assert k3_environment(recipe, True) == {"VLLM_KIMI_K3_AUX_ATTN_RES_STREAM": "1"}
    monkeypatch.setenv("VLLM_KIMI_K3_AUX_ATTN_RES_STREAM", "0")
    with pytest.raises(UsageError, match="VLLM_KIMI_K3_AUX_ATTN_RES_STREAM=0"):
        k3_environment(recipe, True)
    off = load_recipe("tiny", [f"target.model={target}", "draft.target_layer_ids=[1, 5, 11]"])
    with pytest.raises(ContractError, match="aux_attn_res_stream: True here vs False"):
        contract.check_against(contract_for_recipe(off), "runs/k3/hidden")
    assert k3_environment(off, False) == {}


def test_published_k3_recipe_plans_without_the_model():
    plan = plan_capture(load_recipe("kimi-k3", ["capture.backend=vllm"]))
    assert plan["num_hidden_layers"] == 93 and plan["hidden_size"] == 7168
    assert plan["vllm_aux_layer_ids"] == [k + 1 for k in plan["target_layer_ids"]] + [93]
    assert plan["goal_bytes_per_token"] == 2 * (len(plan["target_layer_ids"]) + 1) * 7168 + 5


def one_line(exc: DsparkError) -> bool:
    return "\n" not in str(exc) and len(str(exc)) < 400


@pytest.mark.slow  # makes the session's tiny datagen output first: ~20 s loaded
def test_layer_ids_beyond_the_target_are_refused_before_any_work(tmp_path):
    recipe = capture_recipe("tiny-gqa", tmp_path, "draft.target_layer_ids=[1, 3, 6]")
    for call in (run_capture, plan_capture):
        with pytest.raises(ContractError, match="layer 6 is beyond the target's 6 layers") as info:
            call(recipe)
        assert one_line(info.value)
    assert not Path(recipe.stage_dir("capture")).exists()
    with pytest.raises(ContractError):
        vllm_layout([1, 6], 6)


def _corrupt(path: Path, how: str) -> None:
    data = bytearray(path.read_bytes())
    if how == "flip":
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))
    else:
        path.write_bytes(bytes(data[: len(data) - 100]))


@pytest.mark.slow  # uses the `captured` fixture (a real capture per target)
@pytest.mark.parametrize("how", ["flip", "truncate", "manifest"])
def test_damaged_shards_yield_nothing_from_them(captured, tmp_path, how):
    recipe, _, _ = captured
    out = tmp_path / "hidden"
    import shutil

    shutil.copytree(recipe.stage_dir("capture"), out)
    manifest = json.loads((out / "manifest.json").read_text())
    victim = out / manifest["shards"][0]["file"]
    if how == "manifest":
        manifest["shards"][0]["sha256"] = "0" * 64
        (out / "manifest.json").write_text(json.dumps(manifest))
    else:
        _corrupt(victim, how)
    seen = []
    with pytest.raises(DataError, match="checksum mismatch|truncated") as info:
        for seq in iter_captured(out):
            seen.append(seq)
    assert seen == [] and one_line(info.value)
    with pytest.raises(DataError):
        verify_captured(out)


@pytest.mark.slow  # uses the `captured` fixture (a real capture per target)
def test_another_contract_is_refused_in_one_line(captured):
    recipe, _, _ = captured
    other = recipe.model_copy(update={"draft": recipe.draft.model_copy(update={"target_layer_ids": [0, 2, 4]})})
    with pytest.raises(ContractError, match="target_layer_ids") as info:
        next(iter_captured(recipe.stage_dir("capture"), expect=contract_for_recipe(other)))
    assert one_line(info.value)


class Crash(Exception):
    pass


class CrashingCapturer:
    """The real hf capturer, which 'dies' at its n-th batch (the process is killed mid-capture)."""

    def __init__(self, inner, crash_at: int) -> None:
        self.inner, self.crash_at, self.batches = inner, crash_at, 0

    def describe(self):
        return self.inner.describe()

    def capture(self, samples):
        self.batches += 1
        if self.batches == self.crash_at:
            raise Crash
        return self.inner.capture(samples)


@pytest.mark.slow  # a capture killed and resumed: ~10 s loaded
def test_killed_capture_resumes_without_missing_or_duplicated_shards(tmp_path):
    from dspark_cli.capture.hf import HFCapturer

    recipe = capture_recipe("tiny-mla", tmp_path, "capture.batch_size=2", "capture.shard_tokens=150")
    plan = build_plan(recipe)
    assert len(plan.shards) >= 3
    inner = HFCapturer(plan.geometry.location, plan.layer_ids, dtype="float32")
    batches_per_shard = [-(-len(s.ids) // 2) for s in plan.shards]
    with pytest.raises(Crash):  # dies inside shard 1, after shard 0 was listed
        run_capture(recipe, capturer=CrashingCapturer(inner, batches_per_shard[0] + 1))
    out = Path(recipe.stage_dir("capture"))
    first = out / "shard-00000.safetensors"
    first_mtime = first.stat().st_mtime_ns
    (tmp_path / "plain").touch()  # the mode open() gives under this umask; safetensors alone would give 0600
    assert first.stat().st_mode == (tmp_path / "plain").stat().st_mode
    manifest = json.loads((out / "manifest.json").read_text())
    assert not manifest["complete"] and [s["file"] for s in manifest["shards"]] == [first.name]
    # The other two kill points: a shard renamed into place but not yet listed, and a half-written temp file.
    (out / "shard-00001.safetensors").write_bytes(b"half a shard from a run killed before its manifest update")
    (out / ".shard-00002.safetensors.tmp").write_bytes(b"torn")
    with pytest.raises(DataError, match="not finish"):
        next(iter_captured(out))
    summary = run_capture(recipe, capturer=inner)
    assert first.stat().st_mtime_ns == first_mtime  # finished work is kept, not redone
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["complete"] and len(manifest["shards"]) == len(plan.shards) == summary.shards
    assert sorted(p.name for p in out.glob("*.safetensors")) == [s["file"] for s in manifest["shards"]]
    assert not list(out.glob(".*.tmp"))
    names = [s.id for s in iter_captured(out)]
    assert names == [i for s in plan.shards for i in s.ids] and len(set(names)) == len(names)
    with pytest.raises(UsageError, match="different plan"):  # same directory, another plan
        run_capture(capture_recipe("tiny-mla", tmp_path, "capture.shard_tokens=151"), capturer=inner)


def test_plan_before_datagen_and_dry_run_sizes(tmp_path):
    recipe = load_recipe("tiny", [f"output_dir={tmp_path}/run"])
    plan = plan_capture(recipe)
    assert plan["datagen_ready"] is False and plan["total_bytes"] is None and plan["target_layer_ids"]
    with pytest.raises(UsageError, match="dspark datagen"):
        run_capture(recipe)


def test_package_import_does_not_import_torch():
    code = "import sys, dspark_cli.capture as c; c.__all__; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run(
        [sys.executable, "-c", code],
        check=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )


@pytest.mark.slow  # two captures, one by two worker processes: ~35 s loaded
def test_two_workers_write_what_one_process_writes_and_keep_a_killed_workers_shards(tmp_path):
    """capture.workers=2: the same shard files and fingerprint as one process; a shard a killed worker
    finished (listed in its worker file, not yet in the manifest) is kept, not captured again."""
    import shutil

    from dspark_cli.artifacts.files import write_json_atomic
    from dspark_cli.capture.sinks import capture_manifest

    one = capture_recipe("tiny-mla", tmp_path / "one", "capture.shard_tokens=150")
    run_capture(one)
    one_manifest = json.loads((Path(one.stage_dir("capture")) / "manifest.json").read_text())
    two = capture_recipe("tiny-mla", tmp_path / "two", "capture.shard_tokens=150", "capture.workers=2")
    plan = build_plan(two)
    assert len(plan.shards) >= 3
    out = Path(two.stage_dir("capture"))
    out.mkdir(parents=True)
    write_json_atomic(
        out / "manifest.json", capture_manifest(plan, {}, [], complete=False)
    )  # as the killed run left it
    kept = one_manifest["shards"][1]
    shutil.copy(Path(one.stage_dir("capture")) / kept["file"], out / kept["file"])
    write_json_atomic(
        out / ".worker-1.json",
        {"fingerprint": plan.fingerprint, "worker": 1, "workers": 2, "backend": {}, "shards": [kept]},
    )
    mtime = (out / kept["file"]).stat().st_mtime_ns
    summary = run_capture(two)
    assert summary.workers == 2 and summary.shards == len(plan.shards)
    assert (out / kept["file"]).stat().st_mtime_ns == mtime
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["complete"] and manifest["fingerprint"] == one_manifest["fingerprint"]
    # Names, sizes and counts; not sha256: safetensors writes the header's metadata in hash-map order, so a
    # shard's bytes differ from run to run even in one process (its tensors and metadata do not).
    strip = lambda entries: [{k: v for k, v in e.items() if k != "sha256"} for e in entries]  # noqa: E731
    assert strip(manifest["shards"]) == strip(one_manifest["shards"])
    from safetensors import safe_open
    from safetensors.torch import load_file

    for entry in manifest["shards"]:
        mine, theirs = out / entry["file"], Path(one.stage_dir("capture")) / entry["file"]
        a, b = load_file(mine), load_file(theirs)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), entry["file"]
        assert safe_open(str(mine), "pt").metadata() == safe_open(str(theirs), "pt").metadata()
    assert not list(out.glob(".worker-*")) and not list(out.glob(".*.tmp"))
    assert [s.id for s in iter_captured(out)] == [s.id for s in iter_captured(Path(one.stage_dir("capture")))]


@pytest.mark.slow  # a capture stage with worker processes, killed
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_workers_of_a_killed_capture_stage_die_with_it(tmp_path):
    """SIGKILL of the process running the capture stage (it cannot stop its workers itself): the kernel
    kills the workers too (procs.dies_with_parent), instead of leaving them capturing unsupervised."""
    import signal
    import time

    recipe = capture_recipe("tiny-mla", tmp_path, "capture.shard_tokens=150", "capture.workers=2")
    overrides = [
        "target.model=tiny-mla",
        f"output_dir={tmp_path / 'run'}",
        "capture.shard_tokens=150",
        "capture.workers=2",
        *DATAGEN_OVERRIDES,
    ]
    code = (
        "import sys; from dspark_cli.recipe import load_recipe; from dspark_cli.capture import run_capture; "
        "run_capture(load_recipe('tiny', sys.argv[1:]))"
    )
    stage = subprocess.Popen([sys.executable, "-c", code, *overrides], env={**os.environ, "HF_HUB_OFFLINE": "1"})
    deadline = time.time() + 120
    while len(workers := children(stage.pid)) < 2 and time.time() < deadline and stage.poll() is None:
        time.sleep(0.1)
    assert len(workers) == 2, f"the stage never started its 2 workers (exit {stage.poll()})"
    stage.send_signal(signal.SIGKILL)
    stage.wait()
    # at once (a worker alone needs longer than this to load torch and its target, let alone capture)
    left = wait_gone(workers, 3)
    assert left == [], f"capture workers {left} outlived the killed stage"
    assert (
        not (Path(recipe.stage_dir("capture")) / "manifest.json").is_file()
        or not json.loads((Path(recipe.stage_dir("capture")) / "manifest.json").read_text())["complete"]
    )


@pytest.mark.slow  # a capture in a child process: ~45 s loaded
def test_a_second_capture_into_a_directory_being_captured_is_refused(tmp_path):
    recipe = capture_recipe("tiny-mla", tmp_path)
    out = Path(recipe.stage_dir("capture"))
    holder = hold_lock(out)
    try:
        with pytest.raises(UsageError, match=r"capture.output_dir: .* is being written by another dspark process"):
            run_capture(recipe)
    finally:
        holder.kill()
        holder.wait()
    assert sorted(p.name for p in out.iterdir()) == [".dspark-lock"]  # nothing written beside it
    assert run_capture(recipe).shards >= 1  # the lock went with its holder
