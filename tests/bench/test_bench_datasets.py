"""Bench datasets: names to sources, conversations reduced to the user turns the target answers.

.venv/bin/python -m pytest tests/bench/test_bench_datasets.py -q
"""

from __future__ import annotations

import json

import pytest

from dspark_cli.bench.datasets import category, dataset_source, load_datasets
from dspark_cli.errors import UsageError
from dspark_cli.prompts.bundled import BUNDLED_DATASETS
from dspark_cli.recipe.schema import BenchSection

MT_BENCH = BUNDLED_DATASETS["mt-bench"]  # FastChat's question.jsonl, bundled


def test_names_map_to_sources():
    bench = BenchSection(mt_bench_path="/data/question.jsonl", speed_bench_split="test")
    label, source = dataset_source("mt_bench", bench)
    assert label == "mt_bench" and source.path == "/data/question.jsonl"
    label, source = dataset_source("speed_bench", bench)
    assert (label, source.path, source.subset, source.split) == (
        "speed_bench",
        "nvidia/SPEED-Bench",
        "qualitative",
        "test",
    )
    label, source = dataset_source("speed_bench:throughput_1k", bench)
    assert (label, source.subset) == ("speed_bench:throughput_1k", "throughput_1k")
    label, source = dataset_source("tiny-eval", bench)
    assert label == "tiny-eval" and source.path == "tiny-eval"


def test_conversation_files_keep_user_turns_and_categories(tmp_path):
    path = tmp_path / "chats.jsonl"
    records = [
        {
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello!"},
                {"role": "user", "content": "Bye"},
            ],
            "category": "chat",
        },
        {"prompt": "Add 2 and 2", "response": "4"},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    (dataset,) = load_datasets(BenchSection(datasets=[str(path)]))
    first, second = dataset.conversations
    assert dataset.name == "chats.jsonl"
    assert first.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "user", "content": "Bye"},
    ]  # the target writes every answer itself
    assert first.user_turns == ["Hi", "Bye"] and category(first) == "chat" and category(second) == "all"
    assert len(load_datasets(BenchSection(datasets=[str(path)], num_prompts=1))[0].conversations) == 1


def test_mt_bench_is_bundled_and_read_by_default():
    (dataset,) = load_datasets(BenchSection())  # bench.datasets [mt_bench] from the bundled copy, offline
    (by_path,) = load_datasets(BenchSection(mt_bench_path=str(MT_BENCH)))
    assert [c.user_turns for c in dataset.conversations] == [c.user_turns for c in by_path.conversations]
    assert dataset.name == "mt_bench" and len(dataset.conversations) == 80
    assert all(len(c.user_turns) == 2 for c in dataset.conversations)
    assert {category(c) for c in dataset.conversations} == {
        "writing",
        "roleplay",
        "reasoning",
        "math",
        "coding",
        "extraction",
        "stem",
        "humanities",
    }


def test_unreachable_mt_bench_names_the_field(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(UsageError) as err:
        load_datasets(BenchSection(mt_bench_path="no-such-org/no-such-mt-bench"))
    assert "bench.mt_bench_path" in err.value.hint
