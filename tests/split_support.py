"""Shared by the validation-split tests: a prompt file with every prompt twice (the copy re-cased and
re-spaced, the same after normalising), recipes on it, and one real datagen run of it per session.

from split_support import split_recipe, split_datagen
recipe = split_recipe(tmp_path / "run", prompts_file)             # tiny-gqa, hf engine, dedup off, 30% held out
data_dir = split_datagen()                                        # a finished datagen output with a split
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from dspark_cli.recipe import Recipe, load_recipe

NUM_DISTINCT = 24  # distinct prompts; each also appears as a variant: 48 conversations
FRACTION = 0.3
_DATAGEN: dict[str, Path] = {}


def prompt_records() -> list[dict]:
    """The first NUM_DISTINCT bundled tiny prompts, each followed by its variant (another case, other
    whitespace: the same normalised prompt). Each has a source answer, for `datagen.regenerate=false`."""
    from dspark_cli.prompts.sources import read_source
    from dspark_cli.recipe.schema import PromptSource

    records = []
    for number, conv in enumerate(read_source(PromptSource(path="tiny-prompts", max_samples=NUM_DISTINCT))):
        text = conv.user_turns[0]
        for suffix, prompt in (("", text), ("-variant", "  " + text.upper().replace(" ", " \t "))):
            records.append(
                {
                    "id": f"p{number:02d}{suffix}",
                    "messages": [
                        {"role": "user", "content": prompt},
                        {"role": "assistant", "content": f"answer {number}"},
                    ],
                }
            )
    return records


def write_prompts(path: Path, records: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def split_recipe(root: Path, prompts: Path, *overrides: str) -> Recipe:
    return load_recipe(
        "tiny",
        [
            "target.model=tiny-gqa",
            "draft.arch=gqa",
            f"output_dir={root}",
            "datagen.engine=hf",
            "capture.backend=hf",
            f"datagen.sources=[{{path: {prompts}}}]",
            "datagen.dedup=false",  # identical prompts stay: the split must keep them on one side
            "datagen.max_tokens=8",
            "datagen.temperature=0.0",
            "datagen.batch_size=16",
            "datagen.shard_size=16",
            f"datagen.validation_fraction={FRACTION}",
            "capture.max_seq_len=256",
            "capture.shard_tokens=600",
            "capture.batch_size=8",
            *overrides,
        ],
    )


def split_datagen() -> Path:
    """The `run/` output root of one finished datagen run (tiny-gqa, hf) with a validation split; made once."""
    if "root" not in _DATAGEN:
        from dspark_cli.datagen.run import run_datagen

        base = Path(tempfile.mkdtemp(prefix="dspark-split-"))
        prompts = write_prompts(base / "prompts" / "prompts.jsonl", prompt_records())
        run_datagen(split_recipe(base / "run", prompts))
        _DATAGEN["root"] = base
    return _DATAGEN["root"]


def split_copy(tmp_path: Path, *overrides: str) -> Recipe:
    """A recipe on a copy of the shared datagen output (its capture goes under tmp_path)."""
    base = split_datagen()
    if not (tmp_path / "run" / "data").exists():
        shutil.copytree(base / "run" / "data", tmp_path / "run" / "data")
    return split_recipe(tmp_path / "run", base / "prompts" / "prompts.jsonl", *overrides)
