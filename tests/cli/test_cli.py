"""The `dspark` command line, driven as users drive it (typer's CliRunner and a real subprocess)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dspark_cli.cli import app

runner = CliRunner()
COMMANDS = ["datagen", "train", "produce", "export", "serve", "bench", "publish", "run", "validate", "init"]


def invoke(*args: str, env: dict[str, str] | None = None):
    return runner.invoke(app, list(args), env=env)


def test_help_lists_all_ten_commands():
    result = invoke("--help")
    assert result.exit_code == 0
    for command in COMMANDS:
        assert f" {command} " in result.output, command


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help(command):
    result = invoke(command, "--help")
    assert result.exit_code == 0 and "Usage" in result.output


def test_help_and_completion_import_nothing_heavy():
    heavy = ("torch", "transformers", "vllm", "datasets", "huggingface_hub", "modelscope")
    code = (
        "import sys, runpy\n"
        "sys.argv = ['dspark'] + sys.argv[1:]\n"
        "try:\n    runpy.run_module('dspark_cli.cli', run_name='__main__')\n"
        "except SystemExit:\n    pass\n"
        f"print('LOADED', [m for m in {heavy!r} if m in sys.modules])\n"
        "print('SCHEMA', 'pydantic' in sys.modules)\n"
    )
    for args in (["--help"], ["train", "--help"], ["export", "--help"]):
        out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, check=True).stdout
        assert "LOADED []" in out, (args, out[-300:])
        if args == ["--help"]:  # the recipe schema (pydantic, ~0.1 s) waits for a command that reads a recipe
            assert "SCHEMA False" in out, out[-300:]
    # Shell completion runs the program with _DSPARK_COMPLETE set.
    env = dict(os.environ, _DSPARK_COMPLETE="complete_bash", COMP_WORDS="dspark tr", COMP_CWORD="1")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    assert "train" in out and "LOADED []" in out, out[-300:]


def test_each_command_is_a_small_module_of_the_cli_package():
    """One module per command (parse -> one library call -> render), none over ~150 lines."""
    import importlib

    package = Path(__file__).resolve().parents[2] / "dspark_cli" / "cli"
    for command in COMMANDS:
        assert callable(getattr(importlib.import_module(f"dspark_cli.cli.{command}"), command)), command
    for path in package.glob("*.py"):
        assert len(path.read_text().splitlines()) <= 150, path


@pytest.mark.parametrize("name", ["tiny", "qwen3-8b", "llama-3.1-8b", "kimi-k3"])
def test_validate_every_template_passes_as_a_recipe(name):
    """--recipe-only: the templates judged on their own (their GPUs and hub targets are not on this machine)."""
    result = invoke("validate", f"templates/recipes/{name}.yaml", "--recipe-only")
    assert result.exit_code == 0, result.output
    assert "ok (recipe only" in result.output


@pytest.mark.slow  # a `dspark validate` process judging this machine: 14-72 s loaded
def test_validate_judges_this_machine_by_default(tmp_path):
    """Without --recipe-only a GPU template fails here: its hub target is not on this machine (an empty hub cache)."""
    env = dict(os.environ, HF_HOME=str(tmp_path / "hf"), HF_HUB_OFFLINE="1")
    out = subprocess.run(
        [str(Path(sys.executable).with_name("dspark")), "validate", "templates/recipes/qwen3-8b.yaml"],
        capture_output=True,
        text=True,
        env=env,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert out.returncode == 2, out.stderr
    assert "error: target.model: Qwen/Qwen3-8B is not on this machine" in out.stderr
    assert invoke("validate", "tiny").exit_code == 0  # the CPU template runs here


def test_validate_typo_exits_2_with_did_you_mean(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("trian:\n  lr: 1.0\n")
    result = invoke("validate", str(bad))
    assert result.exit_code == 2
    assert "error: trian: unknown section (did you mean 'train'?)" in result.output
    assert "Traceback" not in result.output
    result = invoke("validate", "tiny", "train.lrr=1")
    assert result.exit_code == 2 and "did you mean 'train.lr'?" in result.output


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("draft.block_size=0", "draft.block_size: must be greater than 0"),
        ("train.lr=fast", "train.lr: expected a number"),
    ],
)
def test_validate_bad_values_exit_2_naming_the_path(override, expected):
    result = invoke("validate", "tiny", override)
    assert result.exit_code == 2 and expected in result.output and "Traceback" not in result.output


def test_validate_prints_resolved_recipe_and_json():
    result = invoke("validate", "tiny", "train.lr=3e-4", "--print")
    assert result.exit_code == 0 and "lr: 0.0003" in result.output
    result = invoke("validate", "tiny", "draft.num_layers=3", "--format", "json")
    import json

    assert json.loads(result.output)["draft"]["num_layers"] == 3


def test_overrides_are_accepted_by_every_recipe_command():
    # Each command validates its recipe (overrides included) before doing anything else.
    for args in (
        ["datagen", "tiny", "draft.block_size=0"],
        ["train", "tiny", "draft.block_size=0"],
        ["run", "tiny", "draft.block_size=0"],
        ["export", "--recipe", "tiny", "draft.block_size=0"],
        ["bench", "--recipe", "tiny", "draft.block_size=0"],
        ["publish", "--recipe", "tiny", "draft.block_size=0"],
        ["serve", "--recipe", "tiny", "draft.block_size=0"],
    ):
        result = invoke(*args)
        assert result.exit_code == 2, (args, result.output)
        assert "draft.block_size: must be greater than 0" in result.output, args


def test_speculators_export_of_an_mla_draft_is_refused_and_exit_2(tmp_path):
    from dspark_cli.pipeline import STAGES

    for args in (
        ["export", str(tmp_path), "--recipe", "tiny", "--export-format", "speculators", "-o", str(tmp_path / "out")],
    ):
        result = invoke(*args)
        assert result.exit_code == 2, (args, result.output)
        assert "speculators has no MLA form" in result.output and len(result.output.strip().splitlines()) == 2, (
            result.output
        )
    assert {s.name for s in STAGES} >= {"datagen", "capture", "train", "export", "bench", "publish"}


@pytest.mark.slow  # every stage of `dspark run`, small: ~55 s loaded
def test_run_chains_every_stage_on_the_tiny_target(tmp_path):
    result = invoke(
        "run",
        "tiny",
        f"output_dir={tmp_path}",
        "datagen.sources=[{path: tiny-prompts, max_samples: 4}]",
        "datagen.engine=hf",
        "capture.backend=hf",
        "datagen.max_tokens=12",
        "train.max_steps=2",
        "train.checkpoint_every=2",
        "train.log_every=1",
        "bench.num_prompts=2",
        "bench.max_tokens=8",
        "bench.temperatures=[0.0]",
        "bench.context_sweep=false",
    )
    assert result.exit_code == 0, result.output
    for stage in ("datagen", "capture", "train", "export", "bench"):
        assert f"{stage}: done" in result.output, stage
    assert "publish" not in result.output  # only with --publish
    assert "tau on tiny-eval at T=0:" in result.output and f"draft: {tmp_path / 'draft'}" in result.output
    for artifact in (
        "data/manifest.json",
        "hidden/manifest.json",
        "train/manifest.json",
        "draft/dspark_manifest.json",
        "draft/model.safetensors",
    ):
        assert (tmp_path / artifact).is_file(), artifact


def test_init_copies_a_template_and_refuses_to_overwrite(tmp_path):
    out = tmp_path / "mine.yaml"
    result = invoke("init", "qwen3-8b", "-o", str(out))
    assert result.exit_code == 0 and out.read_text() == Path("templates/recipes/qwen3-8b.yaml").read_text()
    result = invoke("init", "qwen3-8b", "-o", str(out))
    assert result.exit_code == 2 and "already exists" in result.output
    result = invoke("init", "qwen-8b", "-o", str(tmp_path / "x.yaml"))
    assert result.exit_code == 2 and "did you mean the template 'qwen3-8b'" in result.output
    assert not (tmp_path / "x.yaml").exists()


def test_debug_env_shows_traceback():
    result = invoke("validate", "tiny", "train.lr=fast", env={"DSPARK_DEBUG": "1"})
    assert result.exit_code != 0 and result.exception is not None
    assert type(result.exception).__name__ == "RecipeError"


def test_the_installed_console_script_runs():
    script = Path(sys.executable).with_name("dspark")
    proc = subprocess.run([str(script), "validate", "tiny", "trian.lr=1"], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[0] == "error: trian: unknown section (did you mean 'train'?)"
    assert "Traceback" not in proc.stderr and proc.stdout == ""


def test_list_items_take_overrides_by_index():
    # `datagen.sources[0].max_samples=N` used to be refused with a misleading did-you-mean
    import json

    result = invoke(
        "validate", "tiny", "datagen.sources[0].max_samples=8", "bench.temperatures[1]=0.5", "--format", "json"
    )
    assert result.exit_code == 0, result.output
    resolved = json.loads(result.stdout)
    assert resolved["datagen"]["sources"][0] == {
        **resolved["datagen"]["sources"][0],
        "path": "tiny-prompts",
        "max_samples": 8,
    }
    assert resolved["bench"]["temperatures"] == [0.0, 0.5]
    for override, expected in (
        ("datagen.sources[3].max_samples=8", "datagen.sources[3]: out of range, datagen.sources has 1 item(s)"),
        (
            "datagen.sources[0].max_sample=8",
            "datagen.sources[0].max_sample: unknown key (did you mean 'datagen.sources[0].max_samples'?)",
        ),
        ("train.lr[0]=1", "train.lr: is not a list"),
        ("draft.target_layer_ids[0]=1", "draft.target_layer_ids: not set, so it has no item 0"),
    ):
        result = invoke("validate", "tiny", override)
        assert result.exit_code == 2 and f"error: {expected}" in result.output, (override, result.output)


def test_validate_json_reports_problems_on_stdout():
    import json

    result = invoke("validate", "tiny", "train.lr=fast", "--format", "json")
    assert result.exit_code == 2
    report = json.loads(result.stdout)
    assert report["ok"] is False and report["problems"] == ["train.lr: expected a number, got 'fast' (str)"]
    result = invoke("validate", "no-such-recipe.yaml", "--format", "json")
    assert result.exit_code == 2 and json.loads(result.stdout)["problems"] == ["recipe not found: no-such-recipe.yaml"]


def test_validate_checks_across_sections(tmp_path):
    a_file = tmp_path / "passwd"
    a_file.write_text("root:x:0:0::/root:/bin/sh\n")
    result = invoke(
        "validate", "tiny", "capture.max_seq_len=4096", f"output_dir={a_file}", f"bench.output_dir={a_file}/bench"
    )
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert (
        lines[:2]
        == [
            "error: capture.max_seq_len: 4096 exceeds target.max_model_len 1024, the longest sequence the target runs; "
            "lower it or raise max_model_len",
            f"error: output_dir: {a_file} is a file, not a directory; choose another directory",
        ]
        and len(lines) == 3
    ), result.output  # the stage directories under it are not repeated


def test_produce_refuses_an_offline_recipe_and_a_bad_share():
    result = invoke("produce", "tiny")
    assert result.exit_code == 2 and "capture.mode=offline" in result.output, result.output
    result = invoke("produce", "tiny", "capture.mode=online", "--only", "one")
    assert result.exit_code == 2 and "--only one: not a list" in result.output, result.output
    result = invoke("produce", "tiny", "capture.mode=online", "capture.workers=2", "--only", "2")
    assert result.exit_code == 2 and "producers are 0..1" in result.output, result.output


def test_init_slurm_writes_a_job_script_of_the_recipes_shape(tmp_path):
    result = invoke(
        "init",
        "kimi-k3",
        "-o",
        str(tmp_path / "k3.yaml"),
        "--slurm",
        "capture.workers=4",
        "train.nnodes=2",
        "train.nproc_per_node=8",
    )
    assert result.exit_code == 0, result.output
    script = (tmp_path / "k3.sbatch").read_text()
    # four TP8 engines on 8-GPU nodes: four producer nodes, then two torchrun nodes
    assert "#SBATCH --nodes=6" in script and "PRODUCER_NODES=4" in script and "PRODUCERS_PER_NODE=1" in script
    assert "SHAPE=(capture.mode=online capture.workers=4 train.nnodes=2 train.nproc_per_node=8)" in script
    assert (tmp_path / "k3.yaml").is_file() and os.access(tmp_path / "k3.sbatch", os.X_OK)
    result = invoke("init", "tiny", "-o", str(tmp_path / "t.yaml"), "train.lr=1")
    assert result.exit_code == 2 and "only shape the --slurm job script" in result.output
    result = invoke("init", "kimi-k3", "-o", str(tmp_path / "k.yaml"), "--slurm", "--gpus-per-node=4")
    assert result.exit_code == 2 and "takes 8 GPUs" in result.output and not (tmp_path / "k.yaml").exists()
