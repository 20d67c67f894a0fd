"""`dspark serve`: the vLLM command carries every setting the draft was trained under."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parent))

from test_export import exported  # noqa: E402

from dspark_cli.cli import app  # noqa: E402

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


def test_draft_manifest_settings_reach_the_command(tmp_path):
    draft = exported(tmp_path, "mla")
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
