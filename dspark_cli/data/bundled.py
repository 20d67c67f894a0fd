"""Prompt sets shipped with dspark, usable by name wherever a prompt source or bench dataset goes.

    tiny-prompts   2,000 instruction prompts from the tiny targets' *training* split (datagen input)
    tiny-eval      200 prompts from their *held-out* split (bench input; never seen in training)
    mt-bench       MT-Bench's 80 two-turn questions (FastChat's question.jsonl, Apache-2.0: see
                   bundled/MT-BENCH-NOTICE.md), what `bench.datasets: [mt_bench]` reads by default

The tiny sets come from the Python standard library corpus the tiny targets were trained on
(`dspark_cli.targets.corpus`, PSF license), prompts only (the targets regenerate the answers):

    python -m dspark_cli.data.bundled          # rewrites dspark_cli/data/bundled/tiny-*.jsonl
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

BUNDLED_DIR = Path(__file__).with_name("bundled")
BUNDLED_DATASETS = {"tiny-prompts": BUNDLED_DIR / "tiny-prompts.jsonl", "tiny-eval": BUNDLED_DIR / "tiny-eval.jsonl",
                    "mt-bench": BUNDLED_DIR / "mt-bench.jsonl"}
SIZES = {"tiny-prompts": 2000, "tiny-eval": 200}


def bundled_dataset(name: str) -> Path | None:
    """The file behind a bundled prompt-set name, or None if `name` is not one."""
    return BUNDLED_DATASETS.get(name)


def _pick(pairs, count: int, salt: str):
    ranked = sorted(pairs, key=lambda p: hashlib.sha256((salt + p.prompt).encode()).hexdigest())
    return ranked[:count]


def write_bundled() -> None:
    from dspark_cli.targets.corpus import build_corpus, python_version

    corpus = build_corpus()
    for name, pairs in (("tiny-prompts", corpus.train), ("tiny-eval", corpus.held_out)):
        chosen = _pick(pairs, SIZES[name], name)
        with BUNDLED_DATASETS[name].open("w", encoding="utf-8") as handle:
            for pair in chosen:
                record = {"id": hashlib.sha256(pair.prompt.encode()).hexdigest()[:12], "category": pair.task,
                          "prompt": pair.prompt}
                if pair.system:
                    record["system"] = pair.system
                handle.write(json.dumps(record, ensure_ascii=False) + "\n")
        print(f"{name}: {len(chosen)} prompts (Python {python_version()} stdlib) -> {BUNDLED_DATASETS[name]}")


if __name__ == "__main__":
    write_bundled()
