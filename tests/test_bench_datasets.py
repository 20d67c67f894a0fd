"""Bench datasets: names to sources, conversations reduced to the user turns the target answers.

    .venv/bin/python -m pytest tests/test_bench_datasets.py -q
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dspark_cli.bench.datasets import category, dataset_source, load_datasets
from dspark_cli.errors import UsageError
from dspark_cli.recipe.schema import BenchSection

MT_BENCH = Path(__file__).resolve().parents[2] / "shared" / "data" / "mt_bench_questions.jsonl"


def test_names_map_to_sources():
    bench = BenchSection(mt_bench_path="/data/question.jsonl", speed_bench_split="test")
    label, source = dataset_source("mt_bench", bench)
    assert label == "mt_bench" and source.path == "/data/question.jsonl"
    label, source = dataset_source("speed_bench", bench)
    assert (label, source.path, source.subset, source.split) == ("speed_bench", "nvidia/SPEED-Bench", "qualitative", "test")
    label, source = dataset_source("speed_bench:throughput_1k", bench)
    assert (label, source.subset) == ("speed_bench:throughput_1k", "throughput_1k")
    label, source = dataset_source("tiny-eval", bench)
    assert label == "tiny-eval" and source.path == "tiny-eval"


def test_conversation_files_keep_user_turns_and_categories(tmp_path):
    path = tmp_path / "chats.jsonl"
    records = [
        {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                      {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye"}],
         "category": "chat"},
        {"prompt": "Add 2 and 2", "response": "4"},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    (dataset,) = load_datasets(BenchSection(datasets=[str(path)]))
    first, second = dataset.conversations
    assert dataset.name == "chats.jsonl"
    assert first.messages == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                              {"role": "user", "content": "Bye"}]  # the target writes every answer itself
    assert first.user_turns == ["Hi", "Bye"] and category(first) == "chat" and category(second) == "all"
    assert len(load_datasets(BenchSection(datasets=[str(path)], num_prompts=1))[0].conversations) == 1


@pytest.mark.skipif(not MT_BENCH.is_file(), reason=f"{MT_BENCH} not found")
def test_mt_bench_file():
    (dataset,) = load_datasets(BenchSection(mt_bench_path=str(MT_BENCH)))
    assert dataset.name == "mt_bench" and len(dataset.conversations) == 80
    assert all(len(c.user_turns) == 2 for c in dataset.conversations)
    assert {category(c) for c in dataset.conversations} == {
        "writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"}


def test_unreachable_mt_bench_names_the_field(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(UsageError) as err:
        load_datasets(BenchSection(mt_bench_path="no-such-org/no-such-mt-bench"))
    assert "bench.mt_bench_path" in err.value.hint
