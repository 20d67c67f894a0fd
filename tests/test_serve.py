"""`dspark serve`: the vLLM command carries every setting the draft was trained under."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_support import export_random_draft  # noqa: E402
from test_publish import resign  # noqa: E402

from dspark_cli.cli import app  # noqa: E402
from dspark_cli.recipe import load_recipe  # noqa: E402

runner = CliRunner()


def command(*args: str) -> tuple[dict[str, str], list[str]]:
    result = runner.invoke(app, ["serve", *args, "--dry-run"])
    assert result.exit_code == 0, result.output
    words = shlex.split(result.stdout.strip())
    env = dict(w.split("=", 1) for w in words if "=" in w and not w.startswith("-") and w.isascii() and w[0].isupper())
    return env, [w for w in words if w not in {f"{k}={v}" for k, v in env.items()}]


def spec_of(argv: list[str]) -> dict:
    return json.loads(argv[argv.index("--speculative-config") + 1])


def test_kimi_k3_recipe_gives_the_published_serving_config():
    env, argv = command("--recipe", "kimi-k3")
    assert argv[:3] == ["vllm", "serve", "moonshotai/Kimi-K3"]
    spec = spec_of(argv)
    assert spec["method"] == "dspark" and spec["num_speculative_tokens"] == 7
    assert (spec["attention_backend"], spec["draft_sample_method"], spec["rejection_sample_method"]) == (
        "FLASHINFER_MLA", "probabilistic", "block")
    assert env["VLLM_USE_V2_MODEL_RUNNER"] == "1"
    assert "--trust-remote-code" in argv and argv[argv.index("--tensor-parallel-size") + 1] == "8"


def tiny_draft(tmp_path: Path) -> Path:
    """A random tiny-mla draft of block size 4 (the tiny recipe says 7), exported by `dspark export`."""
    return export_random_draft(load_recipe("tiny", [f"output_dir={tmp_path}", "draft.block_size=4"]), tmp_path / "draft")


def test_draft_manifest_settings_reach_the_command(tmp_path):
    draft = tiny_draft(tmp_path)
    manifest = json.loads((draft / "dspark_manifest.json").read_text())
    manifest["serving"]["chat_template_kwargs"] = {"enable_thinking": False}
    (draft / "dspark_manifest.json").write_text(json.dumps(manifest))
    env, argv = command(str(draft), "--recipe", "tiny", "serve.port=9001")
    spec = spec_of(argv)
    assert spec["model"] == str(draft.resolve()) and spec["num_speculative_tokens"] == 4  # the trained block
    assert env["VLLM_KIMI_K3_AUX_ATTN_RES_STREAM"] == "0"
    assert json.loads(argv[argv.index("--default-chat-template-kwargs") + 1]) == {"enable_thinking": False}
    assert argv[argv.index("--port") + 1] == "9001"


def test_serving_without_a_gpu_is_one_line():
    result = runner.invoke(app, ["serve", "--recipe", "tiny"])
    assert result.exit_code == 1
    assert result.output.strip().splitlines()[0].startswith("error: DSpark serving needs a CUDA GPU")


def test_not_a_draft_dir(tmp_path):
    result = runner.invoke(app, ["serve", str(tmp_path), "--recipe", "tiny", "--dry-run"])
    assert result.exit_code == 2 and "not a dspark draft directory" in result.output


# --- issue 22: serve checks the draft it serves (case 8) and takes trust only from the user (case 4) -------


def refused(*args: str) -> str:
    result = runner.invoke(app, ["serve", *args, "--dry-run"])
    assert result.exit_code != 0, result.output
    assert len(result.output.strip().splitlines()) == 2, result.output  # one line + hint
    return result.output


def test_dry_run_checks_the_draft(tmp_path):
    draft = tiny_draft(tmp_path)
    command(str(draft))  # the intact draft: ok
    assert "trained for target 'tiny-mla'" in refused(str(draft), "target.model=tiny-gqa")
    weights = draft / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    assert "model.safetensors: changed since export" in refused(str(draft))
    weights.unlink()
    assert "model.safetensors: missing" in refused(str(draft))
    weights.write_bytes(data)
    config = json.loads((draft / "config.json").read_text())
    config["num_target_layers"] += 1
    (draft / "config.json").write_text(json.dumps(config))
    resign(draft)
    assert "num_target_layers" in refused(str(draft))


def test_a_drafts_manifest_cannot_set_the_vllm_environment(tmp_path):
    draft = tiny_draft(tmp_path)
    manifest = json.loads((draft / "dspark_manifest.json").read_text())
    manifest["serving"]["env"] = {"LD_PRELOAD": "/tmp/evil.so", "VLLM_KIMI_K3_AUX_ATTN_RES_STREAM": "0"}
    (draft / "dspark_manifest.json").write_text(json.dumps(manifest))
    assert "serving.env: sets LD_PRELOAD" in refused(str(draft))
    assert "serving.env: sets LD_PRELOAD" in refused(str(draft), "--recipe", "tiny")


def test_trust_remote_code_comes_from_the_user_not_the_drafts_recipe(tmp_path):
    draft = tiny_draft(tmp_path)
    text = (draft / "recipe.yaml").read_text()
    assert "trust_remote_code: false" in text
    (draft / "recipe.yaml").write_text(text.replace("trust_remote_code: false", "trust_remote_code: true"))
    resign(draft)  # whoever made the draft can make its checksums match too
    assert "target.trust_remote_code: True" in refused(str(draft))
    _, argv = command(str(draft), "target.trust_remote_code=true")  # the user's own decision
    assert "--trust-remote-code" in argv
    _, argv = command(str(draft), "--recipe", "tiny")
    assert "--trust-remote-code" not in argv
    recipe = (draft / "recipe.yaml").read_text().replace("trust_remote_code: true", "trust_remote_code: false")
    (draft / "recipe.yaml").write_text(recipe.replace("extra_args: []", "extra_args: ['--trust-remote-code']"))
    resign(draft)
    assert "serve.extra_args" in refused(str(draft))
