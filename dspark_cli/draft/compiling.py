"""`torch.compile` with a recompile limit, on every torch version dspark supports (2.11 to 2.14).

    from dspark_cli.draft.compiling import compile_fn
    fn = compile_fn(block_states, dynamic=False, recompile_limit=17)   # one compile per shape, 17 shapes

The `recompile_limit=` keyword of `torch.compile` (a limit for that one function) arrived in torch
2.13; on 2.11 and 2.12 it is a TypeError ("compile() got an unexpected keyword argument"), and 2.11 is
what the GPU image runs. Where the keyword is missing, the limit goes to dynamo's process-wide setting
instead (`torch._dynamo.config.recompile_limit`, named `cache_size_limit` before 2.7), raised to it and
never lowered: every other compiled frame of the process may then also compile that many shapes, which
is harmless for dspark (its compiled functions take a bounded set of shapes, `train.length_buckets`).
The test is the keyword itself, not the version number, so a torch whose `compile` lacks it is handled
whatever it calls itself.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch


def compile_takes_recompile_limit() -> bool:
    """Whether this torch's `torch.compile` accepts `recompile_limit=` (torch >= 2.13)."""
    try:
        return "recompile_limit" in inspect.signature(torch.compile).parameters
    except (TypeError, ValueError):  # a signature that cannot be read: take the path that works everywhere
        return False


def raise_recompile_limit(limit: int) -> None:
    """Dynamo's process-wide recompile limit, raised to `limit` where it is lower."""
    from torch._dynamo import config

    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    if getattr(config, name) < limit:
        setattr(config, name, limit)


def compile_fn(
    fn: Callable,
    *,
    recompile_limit: int | None = None,
    dynamic: bool | None = None,
    options: dict[str, Any] | None = None,
) -> Callable:
    """`torch.compile(fn, dynamic=..., options=...)` that may compile `recompile_limit` shapes of `fn` before
    dynamo runs it eagerly (see the module docstring for torch < 2.13)."""
    kwargs: dict[str, Any] = {"dynamic": dynamic}
    if options:
        kwargs["options"] = options
    if recompile_limit is not None:
        if compile_takes_recompile_limit():
            kwargs["recompile_limit"] = recompile_limit
        else:
            raise_recompile_limit(recompile_limit)
    return torch.compile(fn, **kwargs)
