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


# -- presets and field mappings ------------------------------------------------------------------------------


def test_presets_name_the_public_sets_and_their_columns():
    bench = BenchSection.model_validate({"datasets": ["gsm8k", "humaneval", "math500", "alpaca"]})
    sources = {label: source for label, source in (dataset_source(e, bench) for e in bench.datasets)}
    gsm8k = sources["gsm8k"]
    assert (gsm8k.path, gsm8k.subset, gsm8k.split, gsm8k.fields) == (
        "openai/gsm8k",
        "main",
        "test",
        {"prompt": "question"},
    )
    assert sources["humaneval"].fields == {"prompt": "prompt", "id": "task_id"}
    assert sources["math500"].fields["prompt"] == "problem" and sources["math500"].fields["id"] == "unique_id"
    assert sources["alpaca"].fields == {"prompt": "instruction", "input": "input"}
    # a mapping over a preset: the user's split and columns win, the label is theirs
    mapped = BenchSection.model_validate({"datasets": [{"path": "gsm8k", "split": "train", "name": "gsm8k-train"}]})
    label, source = dataset_source(mapped.datasets[0], mapped)
    assert (label, source.split, source.subset, source.fields["prompt"]) == ("gsm8k-train", "train", "main", "question")


def test_a_field_mapping_reads_a_local_file_and_a_missing_column_is_one_line(tmp_path):
    path = tmp_path / "alpaca.jsonl"
    rows = [
        {"instruction": "Summarise this.", "input": "A long text.", "output": "Short."},
        {"instruction": "Name a colour.", "input": "", "output": "Red."},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    entry = {"path": str(path), "fields": {"prompt": "instruction", "input": "input"}, "name": "mine"}
    [dataset] = load_datasets(BenchSection.model_validate({"datasets": [entry]}))
    assert dataset.name == "mine"
    assert [c.user_turns for c in dataset.conversations] == [["Summarise this.\n\nA long text."], ["Name a colour."]]
    bad = BenchSection.model_validate({"datasets": [{"path": str(path), "fields": {"prompt": "question"}}]})
    with pytest.raises(UsageError) as caught:
        load_datasets(bad)
    message = caught.value.message
    assert "\n" not in message and "'question'" in message and "fields.prompt" in message
    assert "columns: input, instruction, output" in message
    assert "fields: {prompt: <column>}" in caught.value.hint


GSM8K_README = b"---\nconfigs:\n- config_name: main\n  data_files:\n  - split: test\n    path: main/test-*\n---\n"
READ_GSM8K = """
import json, sys
from dspark_cli.bench.datasets import load_datasets
from dspark_cli.errors import UsageError
from dspark_cli.recipe.schema import BenchSection
try:
    [d] = load_datasets(BenchSection.model_validate({"datasets": [json.loads(sys.argv[1])]}))
    print(json.dumps({"name": d.name, "turns": [c.user_turns for c in d.conversations], "ids": [c.id for c in d.conversations]}))
except UsageError as exc:
    print(json.dumps({"error": exc.message}))
"""


@pytest.mark.slow  # a Python process reading a dataset from the loopback hub with `datasets`: ~8 s loaded
def test_the_gsm8k_preset_reads_gsm8k_shaped_records_from_the_hub(tmp_path):
    """The `gsm8k` preset against a loopback hub holding openai/gsm8k as the Hub lays it out (config `main`,
    split `test`, Parquet), read by `datasets` in its own process (the suite's own process runs offline)."""
    import io
    import os
    import subprocess
    import sys

    import pyarrow as pa
    import pyarrow.parquet as pq
    from hub_server import LoopbackHub, Repo

    table = io.BytesIO()
    questions = ["Natalia sold clips to 48 friends. How many?", "Weng earns $12 an hour. How much for 50 minutes?"]
    pq.write_table(pa.table({"question": questions, "answer": ["72", "10"]}), table)
    files = {"README.md": GSM8K_README, "main/test-00000-of-00001.parquet": table.getvalue()}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_OFFLINE"))}
    env.update({"HF_HOME": str(tmp_path / "hf"), "HF_HUB_DISABLE_XET": "1", "HF_HUB_DISABLE_TELEMETRY": "1"})
    with LoopbackHub("hf_unused") as hub:
        hub.datasets["openai/gsm8k"] = Repo(private=False, files=files)
        env["HF_ENDPOINT"] = hub.url

        def read(entry) -> dict:
            done = subprocess.run(
                [sys.executable, "-c", READ_GSM8K, json.dumps(entry)],
                capture_output=True,
                text=True,
                env=env,
                timeout=120,
            )
            assert done.returncode == 0, done.stderr
            return json.loads(done.stdout.strip().splitlines()[-1])

        read_preset = read("gsm8k")
        wrong = read({"path": "gsm8k", "fields": {"prompt": "query"}})
    assert read_preset["name"] == "gsm8k" and read_preset["turns"] == [[q] for q in questions]
    assert any("/datasets/openai/gsm8k/resolve/" in path for _, path in hub.requests)
    assert "no column 'query' (fields.prompt)" in wrong["error"] and "columns: answer, question" in wrong["error"]
