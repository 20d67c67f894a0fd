"""Rewrite the bundled tiny prompt sets (tiny-prompts, tiny-eval) from the tiny targets' corpus.

    python -m tools.tiny_targets.prompt_sets      # rewrites dspark_cli/prompts/bundled/tiny-*.jsonl

Prompts only (the targets regenerate the answers), picked by a salted hash so a rebuild is stable.
"""

from __future__ import annotations

import hashlib
import json

from dspark_cli.prompts.bundled import BUNDLED_DATASETS

SIZES = {"tiny-prompts": 2000, "tiny-eval": 200}


def _pick(pairs, count: int, salt: str):
    ranked = sorted(pairs, key=lambda p: hashlib.sha256((salt + p.prompt).encode()).hexdigest())
    return ranked[:count]


def write_bundled() -> None:
    from tools.tiny_targets.corpus import build_corpus, python_version

    corpus = build_corpus()
    for name, pairs in (("tiny-prompts", corpus.train), ("tiny-eval", corpus.held_out)):
        chosen = _pick(pairs, SIZES[name], name)
        with BUNDLED_DATASETS[name].open("w", encoding="utf-8") as handle:
            for pair in chosen:
                record = {
                    "id": hashlib.sha256(pair.prompt.encode()).hexdigest()[:12],
                    "category": pair.task,
                    "prompt": pair.prompt,
                }
                if pair.system:
                    record["system"] = pair.system
                handle.write(json.dumps(record, ensure_ascii=False) + "\n")
        print(f"{name}: {len(chosen)} prompts (Python {python_version()} stdlib) -> {BUNDLED_DATASETS[name]}")


if __name__ == "__main__":
    write_bundled()
