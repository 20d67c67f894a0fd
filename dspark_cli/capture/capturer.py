"""The capture engine a recipe asks for, and one shard's samples captured in batches.

    capturer = make_capturer(build_plan(recipe), out_dir)        # vLLM or transformers, target loaded
    sequences = capture_shard(capturer, recipe.capture.batch_size, samples)   # CapturedSequence, plan order

Used by every process that captures: the stage itself (run.py), its workers (workers.py) and the
online producers (producers.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dspark_cli.capture.plan import CapturePlan


def make_capturer(plan: CapturePlan, out_dir: Path) -> Any:
    """The backend the recipe asks for, with the target loaded."""
    recipe = plan.recipe
    if recipe.capture.backend_here() == "vllm":
        from dspark_cli.capture.vllm import VLLMCapturer

        return VLLMCapturer(recipe, plan.geometry, plan.layer_ids, storage_dir=str(out_dir / ".vllm"))
    from dspark_cli.capture.hf import HFCapturer

    return HFCapturer(
        plan.geometry.location,
        plan.layer_ids,
        dtype=recipe.target.dtype,
        trust_remote_code=recipe.target.trust_remote_code,
        revision=recipe.target.revision,
    )


def capture_shard(capturer: Any, batch_size: int, samples: list[tuple[str, list[int], list[int]]]) -> list[Any]:
    """Capture one shard's samples in batches of similar length; return them in plan order."""
    order = sorted(range(len(samples)), key=lambda i: len(samples[i][1]))
    results: dict[int, Any] = {}
    for start in range(0, len(order), batch_size):
        rows = order[start : start + batch_size]
        for row, seq in zip(rows, capturer.capture([samples[r] for r in rows]), strict=True):
            results[row] = seq
    return [results[i] for i in range(len(samples))]
