"""How dspark's CPU kernels are built and cached (dspark_cli/kernels/__init__.py), and the CPU refusal of flex.

    .venv/bin/python -m pytest tests/draft/test_kernels_build.py -q

The cache key holds the CPU's feature flags and the compiler's version, so machines that share a
home directory but not an instruction set never load each other's library; a failed build is said
once, in one log line, and the torch code runs.
"""

from __future__ import annotations

import logging

import pytest
import torch
from requirements_support import requires

from dspark_cli import kernels

pytestmark = requires("gcc")  # no gcc: the kernels are never built here


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    monkeypatch.setenv("DSPARK_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("DSPARK_CC", raising=False)
    monkeypatch.setattr(kernels, "_loaded", {})
    return tmp_path


@pytest.mark.slow  # builds the kernels: 10 s loaded
def test_the_cache_key_holds_the_cpu_feature_flags(fresh, monkeypatch):
    real = kernels.cpu_identity()
    assert "flags" in real or "Features" in real  # not only the model name
    first = kernels.build("gcc")
    monkeypatch.setattr(kernels, "cpu_identity", lambda: real.replace("avx512f", "").replace("avx2", "") + " x")
    second = kernels.build("gcc")
    assert first != second and first.exists() and second.exists()
    monkeypatch.setattr(kernels, "cpu_identity", lambda: real)
    assert kernels.build("gcc") == first  # same machine: the cached library, not a rebuild


def test_a_failed_build_is_said_once(fresh, monkeypatch, caplog, tmp_path):
    broken = tmp_path / "cc"
    broken.write_text("#!/bin/sh\necho 'cc: error: no such instruction set' >&2\nexit 1\n")
    broken.chmod(0o755)
    monkeypatch.setenv("DSPARK_CC", str(broken))
    with caplog.at_level(logging.WARNING, logger="dspark_cli.kernels"):
        assert kernels.library() is None and kernels.library() is None
    lines = [r.getMessage() for r in caplog.records if r.name == "dspark_cli.kernels"]
    assert len(lines) == 1 and "did not build" in lines[0] and "no such instruction set" in lines[0], lines


def test_flex_attention_for_cpu_training_is_a_usage_error():
    from dspark_cli.draft.attention import BlockLayout, block_attention
    from dspark_cli.errors import UsageError

    q = torch.randn(1, 2, 8, 16, requires_grad=True)
    k, v = torch.randn(1, 2, 12, 16), torch.randn(1, 2, 12, 16)
    layout = BlockLayout(num_ctx=4, block_size=4, ctx_limit=torch.tensor([[2, 4]]))
    with pytest.raises(UsageError, match="draft.attention=flex has no backward on CPU") as info:
        block_attention(q, k, v, layout, 0.25, "flex")
    assert info.value.exit_code == 2 and "draft.attention=auto" in info.value.hint
