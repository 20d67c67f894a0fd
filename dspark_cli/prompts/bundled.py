"""Prompt sets shipped with dspark, usable by name wherever a prompt source or bench dataset goes.

    tiny-prompts   2,000 instruction prompts from the tiny targets' *training* split (datagen input)
    tiny-eval      200 prompts from their *held-out* split (bench input; never seen in training)
    tiny-requests  60 hand-written requests of the same domain (the standard library) in a user's own words:
                   code, explanations, how-tos; none of the corpus's four prompt templates (a second bench
                   set: does a draft generalise beyond prompts shaped like its training data?)
    mt-bench       MT-Bench's 80 two-turn questions (FastChat's question.jsonl, Apache-2.0: see
                   bundled/MT-BENCH-NOTICE.md), what `bench.datasets: [mt_bench]` reads by default

The tiny sets come from the Python standard library corpus the tiny targets were trained on
(`tools/tiny_targets/corpus.py`, PSF license), prompts only (the targets regenerate the answers):

    python -m tools.tiny_targets.prompt_sets      # rewrites dspark_cli/prompts/bundled/tiny-*.jsonl
"""

from __future__ import annotations

from pathlib import Path

BUNDLED_DIR = Path(__file__).with_name("bundled")
BUNDLED_DATASETS = {
    "tiny-prompts": BUNDLED_DIR / "tiny-prompts.jsonl",
    "tiny-eval": BUNDLED_DIR / "tiny-eval.jsonl",
    "tiny-requests": BUNDLED_DIR / "tiny-requests.jsonl",
    "mt-bench": BUNDLED_DIR / "mt-bench.jsonl",
}


def bundled_dataset(name: str) -> Path | None:
    """The file behind a bundled prompt-set name, or None if `name` is not one."""
    return BUNDLED_DATASETS.get(name)
