"""Hostile servers: every HTTP wait dspark starts ends, in one `error:` line and one `hint:` line, within its
deadline and a small margin; and what a server says cannot become an internal error.

    .venv/bin/python -m pytest tests/cli/test_hostile_network.py -q

The servers are loopback HTTP servers (http.server in a thread) that keep a stream alive with SSE
keep-alive pings and never send `[DONE]`, trickle a token every 2 s, trickle bytes without a line end,
accept a connection and say nothing, or stall every request after the first. Each case sets a deadline
of 2-3 s (`bench.request_timeout`, `datagen.request_timeout`, DSPARK_HTTP_REQUEST_TIMEOUT) and checks
the time it took. The dspark run is in this process, on a thread the test stops waiting for at 30 s, so
a hang fails the test instead of hanging the run.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Self

import pytest
from cli_support import assert_user_error, invoke

FAST = ["bench.num_prompts=1", "bench.max_tokens=8", "bench.temperatures=[0.0]", "bench.concurrency=[1]"]
MODELS = json.dumps({"object": "list", "data": [{"id": "tiny-mla", "object": "model"}]}).encode()
GOOD_METRICS = b"vllm:spec_decode_num_drafts_total 10\nvllm:spec_decode_num_draft_tokens_total 30\n"
MARGIN_S = 2.5  # start-up and scheduling on a busy 2-core machine; the cut itself is within a few ms


def chunk(text: str) -> bytes:
    return b"data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": text}}]}).encode() + b"\n\n"


def good_answer() -> bytes:
    usage = {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}
    return chunk("hello") + chunk(" there") + b"data: " + json.dumps(usage).encode() + b"\n\ndata: [DONE]\n\n"


class Server:
    """A loopback OpenAI-compatible server: /v1/models answers, /metrics answers `metrics`, and a POST is
    answered by `answer(handler, number)` (`number` counts the POSTs from 0; the handler's wfile is open)."""

    def __init__(self, answer: Callable[[BaseHTTPRequestHandler, int], None], metrics: bytes = GOOD_METRICS) -> None:
        self.posts, self.first_post = 0, 0.0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                body = MODELS if self.path == "/v1/models" else metrics if self.path == "/metrics" else None
                if body is None:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:  # noqa: N802
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                number, server.posts = server.posts, server.posts + 1
                server.first_post = server.first_post or time.monotonic()
                try:
                    answer(self, number)
                except OSError:  # dspark hung up: what these servers are for
                    pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self) -> Self:
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def stream_headers(handler: BaseHTTPRequestHandler) -> None:
    handler.send_response(200)
    handler.send_header("Content-Type", "text/event-stream")
    handler.end_headers()


def keep_alive_forever(handler: BaseHTTPRequestHandler, number: int) -> None:
    stream_headers(handler)
    handler.wfile.write(chunk("hi"))
    for _ in range(3000):  # 10 minutes of pings, never [DONE]
        handler.wfile.write(b": ping\n\n")
        handler.wfile.flush()
        time.sleep(0.2)


def token_every_2s(handler: BaseHTTPRequestHandler, number: int) -> None:
    stream_headers(handler)
    for n in range(300):
        handler.wfile.write(chunk(f"t{n}"))
        handler.wfile.flush()
        time.sleep(2)


def bytes_without_line_end(handler: BaseHTTPRequestHandler, number: int) -> None:
    stream_headers(handler)
    handler.wfile.write(b"data: ")
    for _ in range(1200):  # a byte every 0.5 s, never a line end
        handler.wfile.write(b"x")
        handler.wfile.flush()
        time.sleep(0.5)


def silent(handler: BaseHTTPRequestHandler, number: int) -> None:
    time.sleep(600)


def stall_after_first(handler: BaseHTTPRequestHandler, number: int) -> None:
    if number == 0:  # the warm-up request is answered
        handler.send_response(200)
        handler.end_headers()
        handler.wfile.write(good_answer())
        return
    keep_alive_forever(handler, number)


def run_within(limit_s: float, *args: str):
    """`dspark ARGS` in this process on a thread; the result and the seconds it took (fails at `limit_s`)."""
    box = {}
    started = time.monotonic()
    thread = threading.Thread(target=lambda: box.setdefault("result", invoke(*args)), daemon=True)
    thread.start()
    thread.join(limit_s)
    elapsed = time.monotonic() - started
    assert not thread.is_alive(), f"dspark {' '.join(args)} was still running after {limit_s} s"
    return box["result"], elapsed


def bench(tmp_path: Path, url: str, *extra: str) -> list[str]:
    return ["bench", "--recipe", "tiny", f"output_dir={tmp_path}", "--endpoint", url, *FAST, *extra]


def finished_report(tmp_path: Path) -> bool:
    report = tmp_path / "bench" / "bench.json"
    return report.is_file() and json.loads(report.read_text()).get("complete", True)


# --- bench: a request that never ends is cut at bench.request_timeout --------------------------------------


@pytest.mark.parametrize(
    ("answer", "deadline", "expected"),
    [
        (keep_alive_forever, 2, "(it kept the connection open with keep-alives after 1 chunk)"),
        (token_every_2s, 3, "(it was still streaming: 2 chunks so far)"),
        (bytes_without_line_end, 2, "bytes received, then nothing)"),  # cut inside one line's read
        (silent, 2, "(it accepted the connection and sent nothing)"),
    ],
    ids=["keep-alive-pings", "token-every-2s", "bytes-without-line-end", "silent"],
)
def test_a_stream_without_done_is_cut_at_the_request_deadline(tmp_path, answer, deadline, expected):
    # b144f5b: each ran until DSPARK_HTTP_TIMEOUT of *silence* (never, for the first three): a hang
    with Server(answer) as server:
        result, elapsed = run_within(30, *bench(tmp_path, server.url, f"bench.request_timeout={deadline}"))
    assert_user_error(result, f"{server.url}/v1/chat/completions: no [DONE] within {deadline} s", expected, exit_code=1)
    assert "bench.request_timeout (now" in result.output.splitlines()[1]
    assert deadline <= elapsed < deadline + MARGIN_S, elapsed
    assert not finished_report(tmp_path)


def test_a_server_that_accepts_and_never_answers_is_cut_at_the_deadline(tmp_path):
    # a listening socket nobody accepts on: the kernel completes the connection, nothing is ever read or sent
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        result, elapsed = run_within(30, *bench(tmp_path, url, "bench.request_timeout=2", "bench.read_timeout=60"))
    assert_user_error(result, f"{url}/v1/models: no model list within 2 s", "sent nothing", exit_code=1)
    assert 2 <= elapsed < 2 + MARGIN_S, elapsed


def test_the_per_read_timeout_is_a_recipe_key_too(tmp_path):
    with Server(silent) as server:
        result, elapsed = run_within(30, *bench(tmp_path, server.url, "bench.read_timeout=2"))
    assert_user_error(result, f"{server.url}/v1/chat/completions: silent for 2 s, no [DONE] yet", exit_code=1)
    assert "bench.read_timeout (now 2 s)" in result.output
    assert 2 <= elapsed < 2 + MARGIN_S, elapsed


def test_a_server_stalling_every_request_costs_one_deadline_not_one_per_request(tmp_path):
    # 8 conversations (16 turns), 2 at a time: a request that runs out stops the bench, none starts after it
    with Server(stall_after_first) as server:
        result, elapsed = run_within(
            60,
            *bench(tmp_path, server.url, "bench.request_timeout=2", "bench.num_prompts=8", "bench.concurrency=[2]"),
        )
        posts = server.posts
    progress, error = result.output.splitlines()[:-2], result.output.splitlines()[-2:]
    assert all(line.startswith("bench: ") for line in progress), result.output  # turns done before the stall
    assert_user_error(
        SimpleNamespace(exit_code=result.exit_code, output="\n".join(error)), "no [DONE] within 2 s", exit_code=1
    )
    assert 2 <= elapsed < 2 + MARGIN_S, elapsed
    assert posts == 3, posts  # the warm-up, then the two requests in flight when the first ran out


def test_the_request_deadline_comes_from_the_environment_without_a_recipe_key(tmp_path, monkeypatch):
    monkeypatch.setenv("DSPARK_HTTP_REQUEST_TIMEOUT", "2")
    with Server(keep_alive_forever) as server:
        result, elapsed = run_within(30, *bench(tmp_path, server.url))
    assert_user_error(result, "no [DONE] within 2 s", exit_code=1)
    assert 2 <= elapsed < 2 + MARGIN_S, elapsed


@pytest.mark.parametrize("value", ["0", "-1", "nan", "1e9"])
def test_a_timeout_out_of_range_is_refused(value):
    assert_user_error(invoke("validate", "tiny", f"bench.request_timeout={value}"), "bench.request_timeout")


# --- bench: what /metrics and a baseline report say ------------------------------------------------------------


@pytest.mark.parametrize("value", ["NaN", "+Inf", "-Inf"])
def test_non_finite_speculation_counters_are_no_counters_with_a_warning(tmp_path, value, caplog):
    # b144f5b: internal error, ValueError: cannot convert float NaN to integer
    metrics = (
        f"vllm:spec_decode_num_drafts_total {value}\nvllm:spec_decode_num_draft_tokens_total 30\n"
        "vllm:spec_decode_num_accepted_tokens_total 12\n"
    ).encode()
    with Server(lambda handler, number: stall_after_first(handler, 0), metrics=metrics) as server:
        result, _ = run_within(30, *bench(tmp_path, server.url))
    assert result.exit_code == 0, result.output
    assert "vllm:spec_decode_num_drafts_total has a value of" in caplog.text, caplog.text  # stderr, outside pytest
    level = json.loads((tmp_path / "bench" / "bench.json").read_text())["online"]["endpoint_runs"]["levels"][0]
    assert level["spec_decode"] is None and level["num_requests"] == 2


def test_spec_counters_refuses_positions_that_are_not_numbers():
    from dspark_cli.bench.endpoint import spec_counters

    ok = (
        "vllm:spec_decode_num_drafts_total 10\nvllm:spec_decode_num_draft_tokens_total 30\n"
        "vllm:spec_decode_num_accepted_tokens_total 12\n"
    )
    per_pos = 'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="%s"} 4\n'
    assert spec_counters(ok + per_pos % "0")["num_accepted_tokens_per_pos"] == [4.0]
    assert spec_counters(ok + per_pos % "first") is None
    assert spec_counters(ok.replace("10", "nan")) is None


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (bytes(range(256)) * 4, "invalid JSON"),
        ('{"kind": "dspark.bench", "note": "caf\u00e9"}'.encode("latin-1"), "not UTF-8"),
    ],
    ids=["binary", "latin-1"],
)
def test_a_baseline_report_that_is_not_utf8_json_is_one_line_naming_it(tmp_path, content, expected):
    # b144f5b: internal error, UnicodeDecodeError
    baseline = tmp_path / "baseline.json"
    baseline.write_bytes(content)
    with Server(stall_after_first) as server:
        result, _ = run_within(30, *bench(tmp_path, server.url, f"bench.baseline_report={baseline}"))
        posts = server.posts
    assert_user_error(result, str(baseline), expected, exit_code=1)
    assert posts == 0 and baseline.read_bytes() == content


# --- datagen's endpoint, vLLM's probes, the hub clients -------------------------------------------------------


def datagen_against(url: str, tmp_path: Path, *extra: str) -> list[str]:
    """A two-sample datagen of tiny-mla through the OpenAI endpoint at `url`."""
    return [
        "datagen",
        "tiny",
        "target.model=tiny-mla",
        f"output_dir={tmp_path / 'run'}",
        f"datagen.endpoint={url}",
        *extra,
        "datagen.num_samples=2",
        "datagen.batch_size=2",
        "datagen.max_tokens=4",
    ]


def test_datagen_endpoint_completion_is_cut_at_datagen_request_timeout(tmp_path):
    # b144f5b: a completion that never ends (here: bytes trickled after the headers) waited for good
    with Server(bytes_without_line_end) as server:
        result, _ = run_within(60, *datagen_against(server.url, tmp_path, "datagen.request_timeout=2"))
    assert_user_error(result, f"{server.url}/v1/completions: no completion within 2 s", exit_code=1)
    assert "datagen.request_timeout (now 2 s)" in result.output
    cut = time.monotonic() - server.first_post  # datagen loads the tokenizer and the prompts first
    assert 2 <= cut < 2 + MARGIN_S, cut


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ({"choices": [{"text": "hi", "finish_reason": "stop"}]}, "a completion with no token_ids"),
        ({"choices": []}, "a completion with no choices"),
        (
            {"choices": [{"token_ids": [1, "2"], "finish_reason": "stop"}]},
            "a completion with token_ids that are not ids",
        ),
    ],
    ids=["text-only", "no-choices", "not-ids"],
)
def test_datagen_endpoint_completion_without_token_ids_is_one_line(tmp_path, completion, expected):
    # an OpenAI-compatible server that is not vLLM answers without `token_ids` (before: internal KeyError)
    def answer(handler: BaseHTTPRequestHandler, number: int) -> None:
        body = json.dumps(completion).encode()
        handler.send_response(200)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    with Server(answer) as server:
        result, _ = run_within(60, *datagen_against(server.url, tmp_path))
    assert_user_error(result, f"{server.url}/v1/completions: {expected}", exit_code=1)
    assert "is datagen.endpoint a vLLM server?" in result.output
    assert not (tmp_path / "run" / "data").exists() or not any((tmp_path / "run" / "data").glob("*.jsonl"))


def test_the_vllm_health_probe_is_bounded_in_all():
    from dspark_cli.serving.launcher import HEALTH_TIMEOUT_S, _health

    class Trickle(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802 - a status line a byte at a time: each read comes in time
            try:
                for byte in b"HTTP/1.0 200 OK\r\nX-Slow: " + b"y" * 1000:
                    self.wfile.write(bytes([byte]))
                    self.wfile.flush()
                    time.sleep(0.3)
            except OSError:
                pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Trickle)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        started = time.monotonic()
        assert _health(f"http://127.0.0.1:{httpd.server_address[1]}") is False
        assert time.monotonic() - started < HEALTH_TIMEOUT_S + 1
    finally:
        httpd.shutdown()
        httpd.server_close()


def trickled_json(handler: BaseHTTPRequestHandler, number: int) -> None:
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.end_headers()
    for _ in range(1200):
        handler.wfile.write(b" ")
        handler.wfile.flush()
        time.sleep(0.5)


def test_huggingface_hub_client_calls_have_a_whole_request_deadline(monkeypatch):
    import huggingface_hub.constants
    from huggingface_hub import get_session

    from dspark_cli.publish.hubhttp import stalled_cause, use_for_hubs

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)  # the suite runs offline: not here
    monkeypatch.setenv("DSPARK_HTTP_REQUEST_TIMEOUT", "2")
    for name in ("MODELSCOPE_API_TIMEOUT", "MODELSCOPE_API_CONNECT_TIMEOUT"):  # use_for_hubs sets them
        monkeypatch.delenv(name, raising=False)
    use_for_hubs()
    try:
        with Server(trickled_json) as server:
            started = time.monotonic()
            with pytest.raises(Exception) as caught:
                get_session().post(server.url + "/api/repos/create", json={"name": "x"})
            elapsed = time.monotonic() - started
    finally:  # huggingface_hub's own client again, for the tests after this one
        from huggingface_hub import set_client_factory
        from huggingface_hub.utils._http import default_client_factory

        set_client_factory(default_client_factory)
    stalled = stalled_cause(caught.value)
    assert stalled is not None and stalled.message.startswith(f"{server.url}/api/repos/create: no answer within 2 s")
    assert "DSPARK_HTTP_REQUEST_TIMEOUT" in stalled.hint
    assert 2 <= elapsed < 2 + 1.5, elapsed


def test_modelscope_requests_have_a_whole_request_deadline(monkeypatch):
    import requests

    from dspark_cli.publish.hubhttp import requests_bounded, stalled_cause

    monkeypatch.setenv("DSPARK_HTTP_REQUEST_TIMEOUT", "2")
    with Server(trickled_json) as server, requests_bounded():
        started = time.monotonic()
        with pytest.raises(requests.exceptions.RequestException) as caught:
            requests.post(server.url + "/api/v1/models", json={"name": "x"}, timeout=(5, 60))
        elapsed = time.monotonic() - started
    stalled = stalled_cause(caught.value)
    assert stalled is not None and "no answer within 2 s" in stalled.message
    assert 2 <= elapsed < 2 + 1.5, elapsed


def test_a_hub_upload_gets_time_for_its_bytes():
    from dspark_cli.publish.hubhttp import MIN_TRANSFER_RATE, _allowance

    assert _allowance(2_000) == 0  # an API call: the request deadline alone
    assert _allowance(1024 * MIN_TRANSFER_RATE) == 1024  # a large upload: a second per 128 KiB
