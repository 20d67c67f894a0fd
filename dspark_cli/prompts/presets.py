"""The public benchmark sets `bench.datasets` names, with their columns (none is bundled: see docs/bench.md).

    PRESETS["gsm8k"].source()      # PromptSource(path="openai/gsm8k", subset="main", split="test", ...)

Columns as each set's dataset card lists them: GSM8K (`question`, `answer`; config `main`), HumanEval
(`task_id`, `prompt`, ...), MATH-500 (`problem`, `subject`, `unique_id`, ...; split `test`), Alpaca
(`instruction`, `input`, `output`; split `train` only, CC BY-NC 4.0). MT-Bench and SPEED-Bench have their own
settings (`bench.mt_bench_path`, `bench.speed_bench_*`) and are resolved by bench/datasets.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dspark_cli.recipe.schema import BENCH_PRESETS, PromptSource


@dataclass(frozen=True)
class Preset:
    path: str  # the Hugging Face dataset
    split: str
    fields: dict[str, str] = field(default_factory=dict)  # the field mapping onto its columns
    subset: str | None = None

    def source(self, *, split: str | None = None, subset: str | None = None, fields: dict[str, str] | None = None):
        """The prompt source, with a split, configuration or columns of the user's over the preset's."""
        mapping = {**self.fields, **(fields or {})}
        return PromptSource(
            path=self.path,
            split=split or self.split,
            subset=subset or self.subset,
            format="turns" if "turns" in mapping else "prompt_response",
            fields=mapping,
        )


PRESETS = {
    "gsm8k": Preset("openai/gsm8k", "test", {"prompt": "question"}, subset="main"),
    "humaneval": Preset("openai/openai_humaneval", "test", {"prompt": "prompt", "id": "task_id"}),
    "math500": Preset(
        "HuggingFaceH4/MATH-500", "test", {"prompt": "problem", "id": "unique_id", "category": "subject"}
    ),
    "alpaca": Preset("tatsu-lab/alpaca", "train", {"prompt": "instruction", "input": "input"}),
}
assert tuple(PRESETS) == BENCH_PRESETS  # the names the recipe knows (recipe/schema.py)
