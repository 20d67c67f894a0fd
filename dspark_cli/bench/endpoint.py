"""`dspark bench --endpoint URL`: serving speed and acceptance of a running OpenAI-compatible server (vLLM).

    dspark bench --endpoint http://127.0.0.1:8000 --recipe my.yaml bench.concurrency=[1,8,32]
    dspark bench --endpoint http://127.0.0.1:8000 bench.baseline_endpoint=http://127.0.0.1:8001
    dspark bench --endpoint http://127.0.0.1:8000 bench.baseline_report=runs/x/bench-baseline/bench.json

For every temperature and concurrency level, `concurrency` workers answer the bench conversations
through streaming `/v1/chat/completions` (turn by turn, each turn with the server's own earlier
answers; `target.chat_template_kwargs` are sent, so the server renders prompts as datagen did). Per
request: time to first token (TTFT), time per output token after the first (TPOT), gaps between
streamed chunks (ITL; with speculation a chunk may hold several tokens), output tokens from the
`usage` record. Per level: output tokens/s over the wall time, requests/s, and the deltas of vLLM's
`/metrics` counters `vllm:spec_decode_num_drafts`, `_num_draft_tokens`, `_num_accepted_tokens`,
`_num_accepted_tokens_per_pos`: tau = 1 + accepted / drafts (tokens per drafting step, bonus
included), per-position acceptance = accepted_per_pos[i] / drafts. Counters are server-wide: run
the benchmark on a server nobody else is using. The baseline (the same target without speculation)
is another endpoint measured the same way, or the online runs of a saved report.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
import urllib.error
import urllib.request
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dspark_cli.bench.datasets import BenchDataset, load_datasets
from dspark_cli.bench.stats import mean, percentile
from dspark_cli.errors import DataError, DsparkError, UsageError
from dspark_cli.network import (
    MAX_JSON_BYTES,
    MAX_LINE_BYTES,
    MAX_STREAM_BYTES,
    Stalled,
    Timeouts,
    exchange,
    read_limited,
    too_large,
)
from dspark_cli.recipe import Recipe
from dspark_cli.recipe.bounded import loads_json

log = logging.getLogger(__name__)
Progress = Callable[[int, int, int], None]
SPEC_COUNTERS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")
_WARNED: set[tuple[str, str]] = set()  # (/metrics address, counter) already warned about


@dataclass
class RequestResult:
    ok: bool
    ttft: float | None = None  # seconds to the first content chunk
    latency: float = 0.0
    output_tokens: int = 0
    chunk_gaps: list[float] = field(default_factory=list)
    text: str = ""
    error: str | None = None
    stalled: Stalled | None = None  # the server did not finish in time (bench stops: see measure_level)

    @property
    def tpot(self) -> float | None:
        if self.ttft is None or self.output_tokens < 2:
            return None
        return (self.latency - self.ttft) / (self.output_tokens - 1)


class Client:
    """A minimal OpenAI-compatible client (standard library only): models, streaming chat, /metrics.

    Every exchange waits at most `timeouts` (`bench_timeouts`: per read and for the whole request) and
    reads at most `dspark_cli.network`'s bounds; an answer that is not what an OpenAI-compatible server
    sends is a failed request (or, for /v1/models, a one-line DataError)."""

    def __init__(self, base_url: str, timeouts: Timeouts | None = None) -> None:
        self.base = base_url.rstrip("/").removesuffix("/v1")
        self.timeouts = timeouts or Timeouts.from_env()
        try:
            models = loads_json(self._get("/v1/models", "model list")).get("data")
            self.model = str(models[0]["id"]) if models else None
        except (ValueError, AttributeError, TypeError, KeyError, IndexError):
            raise DataError(
                f"{self.base}/v1/models: not an OpenAI-compatible model list",
                "is bench.endpoint the base URL of a vLLM (OpenAI-compatible) server?",
            ) from None
        if not self.model:
            raise DsparkError(f"{self.base} serves no model", "start the server with the target model")

    def _get(self, path: str, waiting_for: str) -> str:
        try:
            with exchange(self.base + path, self.timeouts, waiting_for=waiting_for) as (response, _):
                return read_limited(response, MAX_JSON_BYTES, self.base + path).decode("utf-8", errors="replace")
        except urllib.error.HTTPError as exc:
            raise DsparkError(f"{self.base}{path}: HTTP {exc.code}") from None
        except (urllib.error.URLError, ConnectionError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise UsageError(
                f"cannot reach {self.base}: {reason or type(exc).__name__}",
                "is the server running? check bench.endpoint",
            ) from None

    def metrics(self) -> str:
        return self._get("/metrics", "metrics")

    def chat(
        self,
        messages: list[dict[str, str]],
        *,
        max_tokens: int,
        temperature: float,
        top_p: float,
        seed: int | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        stop: threading.Event | None = None,
    ) -> RequestResult:
        """One streaming chat completion, timed chunk by chunk (given up between two lines once `stop` is set)."""
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "max_tokens": max_tokens,
            "temperature": temperature,
            "top_p": top_p,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if seed is not None:
            body["seed"] = seed
        if chat_template_kwargs:
            body["chat_template_kwargs"] = chat_template_kwargs
        request = urllib.request.Request(
            self.base + "/v1/chat/completions",
            data=json.dumps(body).encode(),
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        result = RequestResult(ok=False)
        parts: list[str] = []
        chunks = 0
        start = last = time.perf_counter()
        try:
            with exchange(request, self.timeouts, waiting_for="[DONE]") as (response, deadline):
                if too_large(response.headers.get("Content-Length"), MAX_STREAM_BYTES):
                    raise ValueError(f"the server announces {response.headers['Content-Length']} bytes")
                received = 0
                while raw := response.readline(MAX_LINE_BYTES + 1):
                    received += len(raw)
                    if len(raw) > MAX_LINE_BYTES or received > MAX_STREAM_BYTES:
                        raise ValueError(
                            f"an answer longer than dspark reads ({MAX_STREAM_BYTES:,} bytes, "
                            f"{MAX_LINE_BYTES:,} per line)"
                        )
                    if stop is not None and stop.is_set():
                        raise ValueError("given up: another request ran out of time")
                    line = raw.decode("utf-8", errors="replace").strip()
                    if line.startswith(":"):  # an SSE comment: a keep-alive
                        deadline.note = "it kept the connection open with keep-alives" + (
                            f" after {_chunks(chunks)}" if chunks else ""
                        )
                    if not line.startswith("data:"):
                        continue
                    payload = line[5:].strip()
                    if payload == "[DONE]":
                        break
                    chunk = loads_json(payload)
                    if not isinstance(chunk, dict) or not isinstance(chunk.get("choices", []), list):
                        raise TypeError(f"a stream chunk that is not a chat completion chunk: {payload[:80]!r}")
                    chunks += "choices" in chunk
                    deadline.note = f"it was still streaming: {_chunks(chunks)} so far"
                    if isinstance(chunk.get("usage"), dict):
                        result.output_tokens = int(chunk["usage"].get("completion_tokens") or 0)
                    choices = chunk.get("choices") or []
                    first = choices[0] if choices else None
                    delta = first.get("delta") if isinstance(first, dict) else None
                    content = delta.get("content") if isinstance(delta, dict) else None
                    if content:
                        now = time.perf_counter()
                        if result.ttft is None:
                            result.ttft = now - start
                        else:
                            result.chunk_gaps.append(now - last)
                        last = now
                        parts.append(str(content))
            if not chunks:
                raise ValueError("no chat completion chunk in the answer (not an OpenAI-compatible stream)")
        except Stalled as exc:
            result.error, result.stalled = exc.message, exc
            return result
        except urllib.error.HTTPError as exc:
            result.error = f"HTTP {exc.code}: {_error_body(exc)}"
            return result
        except (urllib.error.URLError, OSError, ValueError, TypeError, AttributeError) as exc:
            result.error = f"{type(exc).__name__}: {exc}"  # JSONDecodeError is a ValueError
            return result
        result.latency = time.perf_counter() - start
        result.text = "".join(parts)
        if not result.output_tokens:  # a server without usage records: one token per streamed chunk
            result.output_tokens = len(parts)
        result.ok = True
        return result


def _chunks(count: int) -> str:
    return f"{count} chunk" + ("" if count == 1 else "s")


def _error_body(exc: urllib.error.HTTPError) -> str:
    """The first 200 bytes of an HTTP error's body (under the exchange's deadline; none if it stalls)."""
    try:
        return exc.read(200).decode(errors="replace")
    except (Stalled, OSError):
        return ""


def parse_prometheus(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Prometheus text exposition -> {metric name: [(labels, value), ...]} (comments skipped)."""
    out: dict[str, list[tuple[dict[str, str], float]]] = defaultdict(list)
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name_part, _, value_part = line.rpartition(" ")
        labels: dict[str, str] = {}
        name = name_part
        if "{" in name_part:
            name, _, rest = name_part.partition("{")
            for item in _split_labels(rest.rstrip("}")):
                key, _, raw = item.partition("=")
                labels[key.strip()] = raw.strip().strip('"')
        try:
            out[name.strip()].append((labels, float(value_part)))
        except ValueError:
            continue
    return out


def _split_labels(text: str) -> list[str]:
    items, current, quoted = [], "", False
    for char in text:
        if char == '"':
            quoted = not quoted
        if char == "," and not quoted:
            items.append(current)
            current = ""
        else:
            current += char
    if current.strip():
        items.append(current)
    return items


def spec_counters(text: str, source: str = "/metrics") -> dict[str, Any] | None:
    """vLLM's speculative-decoding counters (summed over engines); None when the server has none, or when
    one of them is not a finite number or has a position label that is not one (a warning naming `source`)."""
    metrics = parse_prometheus(text)
    for name, rows in metrics.items():
        if not name.startswith("vllm:spec_decode_"):
            continue
        bad = next((value for _, value in rows if not math.isfinite(value)), None)
        position = next((row["position"] for row, _ in rows if not row.get("position", "0").isdigit()), None)
        if bad is not None or position is not None:
            if (source, name) not in _WARNED:  # once: every level scrapes before and after
                _WARNED.add((source, name))
                what = f"a value of {bad}" if bad is not None else f"position {position!r}"
                log.warning("%s: %s has %s; speculation counters ignored (no tau)", source, name, what)
            return None

    def total(name: str) -> tuple[float, list[tuple[dict[str, str], float]]] | None:
        for candidate in (f"vllm:spec_decode_{name}_total", f"vllm:spec_decode_{name}"):
            if candidate in metrics:
                rows = metrics[candidate]
                return sum(v for _, v in rows), rows
        return None

    found = {name: total(name) for name in SPEC_COUNTERS}
    if any(v is None for v in found.values()):
        return None
    counters: dict[str, Any] = {name: value[0] for name, value in found.items()}  # type: ignore[index]
    per_pos = total("num_accepted_tokens_per_pos")
    positions: dict[int, float] = defaultdict(float)
    for labels, value in per_pos[1] if per_pos else []:
        if "position" in labels:
            positions[int(labels["position"])] += value
    counters["num_accepted_tokens_per_pos"] = [positions[i] for i in sorted(positions)]
    return counters


def counter_delta(before: dict[str, Any] | None, after: dict[str, Any] | None) -> dict[str, Any] | None:
    """tau and per-position acceptance over the counters' change between two scrapes."""
    if before is None or after is None:
        return None
    delta = {name: after[name] - before[name] for name in SPEC_COUNTERS}
    after_pos, before_pos = after["num_accepted_tokens_per_pos"], before["num_accepted_tokens_per_pos"]
    before_pos = before_pos + [0.0] * (len(after_pos) - len(before_pos))
    per_pos = [a - b for a, b in zip(after_pos, before_pos, strict=False)]
    drafts = delta["num_drafts"]
    return {
        **{k: int(v) for k, v in delta.items()},
        "num_accepted_tokens_per_pos": [int(v) for v in per_pos],
        "tau": 1.0 + delta["num_accepted_tokens"] / drafts if drafts > 0 else None,
        "acceptance_rate": delta["num_accepted_tokens"] / delta["num_draft_tokens"]
        if delta["num_draft_tokens"]
        else None,
        "acceptance_per_position": [v / drafts for v in per_pos] if drafts > 0 else [],
    }


def _seed(base: int, *parts: object) -> int:
    import hashlib

    return int(hashlib.sha256(":".join(map(str, (base, *parts))).encode()).hexdigest()[:8], 16)


def measure_level(
    client: Client,
    conversations: list[Any],
    *,
    concurrency: int,
    temperature: float,
    recipe: Recipe,
    on_request: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """All conversations at one concurrency level: speed, latency percentiles and counter deltas.

    A failed request is counted (`num_failed`, `errors`) and its conversation ends there; a request the
    server does not finish in time (`Stalled`) stops the level and the bench with that one line: the
    level's wall time and tokens/s would be the stall's, and a server stalling on every request would
    otherwise cost a deadline per request. No request starts after it; those in flight are given up at
    their next line or end by their own deadline."""
    bench = recipe.bench
    kwargs = recipe.target.chat_template_kwargs or None
    results: list[RequestResult] = []
    lock = threading.Lock()
    stop = threading.Event()

    def converse(conv: Any) -> None:
        history = [m for m in conv.messages if m["role"] == "system"][:1]
        for index, text in enumerate(conv.user_turns):
            if stop.is_set():
                return
            messages = [*history, {"role": "user", "content": text}]
            seed = _seed(recipe.seed, conv.id, index, temperature) if temperature > 0 else None
            result = client.chat(
                messages,
                max_tokens=bench.max_tokens,
                temperature=temperature,
                top_p=bench.top_p,
                seed=seed,
                chat_template_kwargs=kwargs,
                stop=stop,
            )
            if result.stalled is not None:
                stop.set()
            with lock:
                results.append(result)
            if on_request is not None:
                on_request(result.output_tokens)
            if not result.ok:
                return
            history = [*messages, {"role": "assistant", "content": result.text}]

    before = spec_counters(client.metrics(), f"{client.base}/metrics")
    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        list(pool.map(converse, conversations))
    wall = time.perf_counter() - started
    stalled = next((r.stalled for r in results if r.stalled is not None), None)
    if stalled is not None:
        raise stalled
    after = spec_counters(client.metrics(), f"{client.base}/metrics")
    good = [r for r in results if r.ok]
    failed = [r for r in results if not r.ok]
    if failed and not good:
        raise DsparkError(f"{client.base}: every request failed ({failed[0].error})", "check the server log")
    tokens = sum(r.output_tokens for r in good)
    ttft = [r.ttft for r in good if r.ttft is not None]
    tpot = [r.tpot for r in good if r.tpot is not None]
    gaps = [g for r in good for g in r.chunk_gaps]
    return {
        "concurrency": concurrency,
        "temperature": temperature,
        "num_requests": len(good),
        "num_failed": len(failed),
        "errors": sorted({r.error for r in failed if r.error})[:3],
        "output_tokens": tokens,
        "seconds": wall,
        "output_tokens_per_second": tokens / wall if wall > 0 else None,
        "requests_per_second": len(good) / wall if wall > 0 else None,
        "ttft_mean": mean(ttft),
        "ttft_p50": percentile(ttft, 50),
        "ttft_p99": percentile(ttft, 99),
        "tpot_mean": mean(tpot),
        "tpot_p50": percentile(tpot, 50),
        "tpot_p99": percentile(tpot, 99),
        "itl_mean": mean(gaps),
        "itl_p50": percentile(gaps, 50),
        "itl_p99": percentile(gaps, 99),
        "spec_decode": counter_delta(before, after),
    }


def bench_timeouts(recipe: Recipe) -> Timeouts:
    """How long bench waits on its endpoints: `bench.request_timeout` / `bench.read_timeout`, else the
    environment's DSPARK_HTTP_REQUEST_TIMEOUT / DSPARK_HTTP_TIMEOUT, else 1800 / 300 s."""
    bench = recipe.bench
    return Timeouts.from_env(
        bench.request_timeout,
        bench.read_timeout,
        request_setting="bench.request_timeout",
        read_setting="bench.read_timeout",
    )


def sweep(
    base_url: str,
    datasets: list[BenchDataset],
    recipe: Recipe,
    *,
    on_request: Callable[[int], None] | None = None,
    on_level: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Every temperature x concurrency level against one endpoint (after one warm-up request)."""
    client = Client(base_url, bench_timeouts(recipe))
    warm = client.chat(
        [{"role": "user", "content": "Hello"}],
        max_tokens=8,
        temperature=0.0,
        top_p=1.0,
        chat_template_kwargs=recipe.target.chat_template_kwargs or None,
    )
    if warm.stalled is not None:
        raise warm.stalled
    if not warm.ok:
        raise DsparkError(f"{client.base}: the warm-up request failed ({warm.error})", "check the server log")
    conversations = [c for d in datasets for c in d.conversations]
    levels: list[dict[str, Any]] = []
    done = {"endpoint": client.base, "model": client.model, "datasets": [d.name for d in datasets], "levels": levels}
    for temperature in recipe.bench.temperatures:
        for concurrency in recipe.bench.concurrency:
            level = measure_level(
                client,
                conversations,
                concurrency=concurrency,
                temperature=temperature,
                recipe=recipe,
                on_request=on_request,
            )
            log.info(
                "online %s T=%g c=%d: %.1f output tok/s",
                client.base,
                temperature,
                concurrency,
                level["output_tokens_per_second"] or 0.0,
            )
            levels.append(level)
            if on_level is not None:
                on_level(done)
    return done


def load_baseline_report(path: str) -> dict[str, Any]:
    """The endpoint runs of a saved bench.json, as this run's baseline runs (`source`: that file)."""
    from dspark_cli.artifacts.bench import read_bench_report

    file = Path(path)
    if not file.is_file():
        raise UsageError(f"bench.baseline_report not found: {path}", "point it at a bench.json written by dspark bench")
    online = read_bench_report(file).online
    runs = online.endpoint_runs.to_dict() if online and online.endpoint_runs else {}
    if not runs:
        raise DataError(
            f"{path} has no online runs to use as a baseline", "run dspark bench --endpoint on the baseline"
        )
    return {**runs, "source": str(file)}


def speedups(measured: dict[str, Any], baseline: dict[str, Any]) -> list[dict[str, Any]]:
    """Per (temperature, concurrency) present in both: throughput and TPOT ratios."""
    by_key = {(b["temperature"], b["concurrency"]): b for b in baseline["levels"]}
    out = []
    for level in measured["levels"]:
        base = by_key.get((level["temperature"], level["concurrency"]))
        if base is None:
            continue
        spec_tps, base_tps = level["output_tokens_per_second"], base["output_tokens_per_second"]
        out.append(
            {
                "temperature": level["temperature"],
                "concurrency": level["concurrency"],
                "output_tokens_per_second": spec_tps,
                "baseline_output_tokens_per_second": base_tps,
                "speedup": spec_tps / base_tps if spec_tps and base_tps else None,
                "tpot_speedup": base["tpot_mean"] / level["tpot_mean"]
                if base.get("tpot_mean") and level.get("tpot_mean")
                else None,
            }
        )
    return out


def run_online(
    recipe: Recipe,
    endpoint: str,
    *,
    on_progress: Progress | None = None,
    baseline: dict[str, Any] | None = None,
    on_level: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Measure `endpoint` (and the baseline endpoint, when set); speedups against the baseline (`baseline`:
    a report's online runs already read, else `bench.baseline_report`). `on_level(online so far)` after
    every level measured, to keep results as they come."""
    bench = recipe.bench
    datasets = load_datasets(bench)
    turns = sum(len(c.user_turns) for d in datasets for c in d.conversations)
    passes = len(bench.temperatures) * len(bench.concurrency) * (2 if bench.baseline_endpoint else 1)
    total, progress = turns * passes, {"done": 0, "tokens": 0}

    def on_request(tokens: int) -> None:
        progress["done"] += 1
        progress["tokens"] += tokens
        if on_progress is not None:
            on_progress(progress["done"], total, progress["tokens"])

    result: dict[str, Any] = {}

    def measured(name: str) -> Callable[[dict[str, Any]], None]:
        def keep(runs: dict[str, Any]) -> None:
            result[name] = runs
            if on_level is not None:
                on_level(result)

        return keep

    result["endpoint_runs"] = sweep(
        endpoint, datasets, recipe, on_request=on_request, on_level=measured("endpoint_runs")
    )
    if bench.baseline_endpoint:
        baseline = sweep(
            bench.baseline_endpoint, datasets, recipe, on_request=on_request, on_level=measured("baseline_runs")
        )
    elif bench.baseline_report and baseline is None:
        baseline = load_baseline_report(bench.baseline_report)
    if baseline is not None:
        result["baseline_runs"] = baseline
        result["speedup"] = speedups(result["endpoint_runs"], baseline)
    return result
