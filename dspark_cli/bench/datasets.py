"""Benchmark prompt sets: MT-Bench, SPEED-Bench, bundled sets, and any file or dataset of prompts.

    for dataset in load_datasets(recipe.bench):
        dataset.name, len(dataset.conversations), dataset.conversations[0].user_turns

Entries of `bench.datasets`:
- `mt_bench`: MT-Bench's 80 two-turn questions from `bench.mt_bench_path` (default `mt-bench`, the copy
  of FastChat's question.jsonl bundled with dspark; another question.jsonl, or a Hugging Face dataset
  with the same `turns` / `category` columns);
- `speed_bench` or `speed_bench:CONFIG`: NVIDIA's SPEED-Bench (`nvidia/SPEED-Bench`), configuration
  `bench.speed_bench_subset` (default `qualitative`, 11 categories) or CONFIG (e.g. `throughput_1k`),
  split `bench.speed_bench_split`;
- `gsm8k`, `humaneval`, `math500`, `alpaca`: the public sets with their columns (prompts/presets.py);
- a bundled prompt set (`tiny-eval`), a local .jsonl/.json/.parquet file, or a Hugging Face dataset
  name, read exactly as datagen reads sources (prompts, OpenAI messages, ShareGPT, or `turns`);
- a mapping `{path, split, subset, fields, name}` of any of these: a split, configuration, field mapping
  (`fields: {prompt: question, id: qid}`, over a preset's) and report label of the user's. A mapped
  column a record lacks is one line naming it and the columns the record has.
Only the user turns are kept: every assistant turn is answered by the target itself, turn by turn,
as datagen regenerates conversations. A record's `category` groups the report (else `all`).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import islice

from dspark_cli.errors import UsageError
from dspark_cli.prompts.conversation import Conversation
from dspark_cli.prompts.presets import PRESETS
from dspark_cli.recipe.schema import BenchDatasetSource, BenchSection, PromptSource

SPEED_BENCH = "nvidia/SPEED-Bench"


@dataclass
class BenchDataset:
    name: str  # the label in reports and in `bench.reference` keys (`mt_bench`, `speed_bench`, a file name)
    conversations: list[Conversation]


def dataset_source(entry: str | BenchDatasetSource, bench: BenchSection) -> tuple[str, PromptSource]:
    """(report label, prompt source) for one `bench.datasets` entry: a name or path, or a mapping of one with a
    split, configuration, columns (`fields`, over a preset's) and label of the user's."""
    if not isinstance(entry, str):
        label, source = dataset_source(entry.path, bench)
        preset = PRESETS.get(entry.path)
        if preset is not None:
            source = preset.source(split=entry.split, subset=entry.subset, fields=entry.fields)
        elif entry.split or entry.subset or entry.fields:
            mapping = {**source.fields, **entry.fields}
            schema = "turns" if "turns" in mapping else "prompt_response" if "prompt" in mapping else source.format
            changes = {"split": entry.split or source.split, "subset": entry.subset or source.subset}
            source = source.model_copy(update={**changes, "fields": mapping, "format": schema})
        return entry.name or label, source
    if entry in PRESETS:
        return entry, PRESETS[entry].source()
    if entry == "mt_bench":
        return "mt_bench", PromptSource(path=bench.mt_bench_path, split="train")
    if entry == "speed_bench" or entry.startswith("speed_bench:"):
        subset = entry.partition(":")[2] or bench.speed_bench_subset
        label = "speed_bench" if subset == bench.speed_bench_subset else f"speed_bench:{subset}"
        return label, PromptSource(path=SPEED_BENCH, subset=subset, split=bench.speed_bench_split)
    from dspark_cli.prompts.sources import source_name

    source = PromptSource(path=entry)
    return source_name(source), source


def load_datasets(bench: BenchSection) -> list[BenchDataset]:
    """Every dataset of `bench.datasets`, at most `bench.num_prompts` conversations each."""
    from dspark_cli.prompts.sources import read_source

    if not bench.datasets:
        raise UsageError("bench.datasets is empty", "add mt_bench, speed_bench, or a prompt file")
    out = []
    for entry, path in zip(bench.datasets, bench.dataset_paths(), strict=True):
        label, source = dataset_source(entry, bench)
        try:
            conversations = list(islice(read_source(source), bench.num_prompts))
        except UsageError as exc:
            hint = (
                "set bench.mt_bench_path to a local question.jsonl (FastChat's MT-Bench questions)"
                if path == "mt_bench"
                else exc.hint
                if "fields." in exc.message
                else "check bench.datasets (a local file works offline)"
            )
            raise UsageError(f"bench dataset {label}: {exc.message}", hint) from None
        for conv in conversations:
            conv.messages = [m for m in conv.messages if m["role"] != "assistant"]  # the target answers
        out.append(BenchDataset(label, conversations))
    return out


def category(conv: Conversation) -> str:
    value = conv.meta.get("category")
    return str(value) if value not in (None, "") else "all"
