"""Prompt sources in every schema, filters, and evaluation-prompt exclusion (no model needed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dspark_cli.datagen.filters import FilterReport, eval_fingerprints, filter_conversations
from dspark_cli.errors import UsageError
from dspark_cli.prompts.bundled import BUNDLED_DATASETS
from dspark_cli.prompts.conversation import normalise_text, turn_hashes
from dspark_cli.prompts.sources import read_source
from dspark_cli.recipe.schema import PromptSource

MT_BENCH = BUNDLED_DATASETS["mt-bench"]  # FastChat's question.jsonl, bundled


def write_jsonl(path: Path, records: list[object]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def convs(path: Path, **kwargs):
    return list(read_source(PromptSource(path=str(path), **kwargs)))


def test_openai_messages(tmp_path):
    path = write_jsonl(
        tmp_path / "m.jsonl",
        [
            {
                "id": 7,
                "messages": [
                    {"role": "system", "content": "be brief"},
                    {"role": "user", "content": "hi"},
                    {"role": "assistant", "content": "hello"},
                    {"role": "user", "content": [{"type": "text", "text": "more"}]},
                ],
            }
        ],
    )
    [conv] = convs(path)
    assert conv.id == "m.jsonl#7" and conv.system == "be brief" and conv.user_turns == ["hi", "more"]


def test_sharegpt_conversations(tmp_path):
    path = write_jsonl(
        tmp_path / "s.jsonl",
        [
            {
                "conversations": [
                    {"from": "system", "value": "sys"},
                    {"from": "human", "value": "q1"},
                    {"from": "gpt", "value": "a1"},
                    {"from": "human", "value": "q2"},
                ]
            }
        ],
    )
    [conv] = convs(path)
    assert [m["role"] for m in conv.messages] == ["system", "user", "assistant", "user"]
    assert conv.user_turns == ["q1", "q2"]


def test_prompt_response_columns_json_and_parquet(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    records = [{"prompt": "p1", "response": "r1"}, {"prompt": "p2", "response": None}]
    (tmp_path / "pr.json").write_text(json.dumps(records))
    assert [c.messages for c in convs(tmp_path / "pr.json")] == [
        [{"role": "user", "content": "p1"}, {"role": "assistant", "content": "r1"}],
        [{"role": "user", "content": "p2"}],
    ]
    pq.write_table(pa.Table.from_pylist(records), tmp_path / "pr.parquet")
    assert [c.user_turns for c in convs(tmp_path / "pr.parquet")] == [["p1"], ["p2"]]


def test_field_mapping_for_other_schemas(tmp_path):
    path = write_jsonl(tmp_path / "o.jsonl", [{"question": "why?", "answer": "because", "uid": "x1"}])
    [conv] = convs(path, format="prompt_response", fields={"prompt": "question", "response": "answer", "id": "uid"})
    assert conv.id == "o.jsonl#x1" and conv.user_turns == ["why?"]


def test_mt_bench_turns_schema():
    conversations = convs(MT_BENCH)
    assert len(conversations) == 80 and all(len(c.user_turns) == 2 for c in conversations)
    assert conversations[0].meta["category"] == "writing"


@pytest.mark.parametrize(
    ("records", "kwargs", "message"),
    [
        ([{"text": "x"}], {}, "o.jsonl:1: unknown schema (keys: text)"),
        ([{"prompt": "x"}], {"format": "messages"}, "o.jsonl:1: missing field 'messages'"),
        ([{"messages": [{"role": "bot", "content": "x"}]}], {}, "messages[0].role 'bot' is not one of"),
        ([{"conversations": [{"from": "gpt", "value": "only an answer"}]}], {}, "o.jsonl:1: no user turn with text"),
        ([{"prompt": 3}], {}, "o.jsonl:1: prompt: expected text, got int"),
    ],
)
def test_bad_records_are_one_line(tmp_path, records, kwargs, message):
    path = write_jsonl(tmp_path / "o.jsonl", records)
    with pytest.raises(
        UsageError, match=message.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(").replace(")", r"\)")
    ):
        convs(path, **kwargs)


def test_missing_empty_and_corrupt_sources(tmp_path):
    with pytest.raises(UsageError, match="prompt source not found"):
        convs(tmp_path / "nope.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(UsageError, match="is empty"):
        convs(tmp_path / "empty.jsonl")
    (tmp_path / "bad.jsonl").write_text('{"prompt": "a"}\n{"prompt": \n')
    with pytest.raises(UsageError, match="bad.jsonl:2: invalid JSON"):
        convs(tmp_path / "bad.jsonl")


def test_max_samples(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": f"p{i}"} for i in range(10)])
    assert len(convs(path, max_samples=3)) == 3


def test_normalisation_ignores_case_width_and_whitespace():
    assert normalise_text("  Hello\n\tWORLD ") == normalise_text("hello world") == "hello world"
    assert normalise_text("ｆｕｌｌ") == "full"  # NFKC folds full-width letters


def test_builtin_mt_bench_fingerprints_match_the_dataset():
    from_file = set()
    for line in MT_BENCH.read_text().splitlines():
        from_file |= turn_hashes(json.loads(line)["turns"])
    assert eval_fingerprints("mt_bench") == from_file and len(from_file) == 160
    assert eval_fingerprints(str(MT_BENCH)) == from_file


def test_eval_prompts_are_excluded_with_counts(tmp_path):
    first = json.loads(MT_BENCH.read_text().splitlines()[0])["turns"]
    records = [
        {"prompt": "Write a haiku about rivers."},
        {"prompt": "  " + first[0].upper() + "  "},  # an MT-Bench question, re-cased and padded
        {
            "messages": [
                {"role": "user", "content": "warm-up"},
                {"role": "assistant", "content": "ok"},
                {"role": "user", "content": first[1]},
            ]
        },  # contains MT-Bench's second turn
        {"prompt": "write a HAIKU about rivers."},  # duplicate of the first after normalisation
    ]
    path = write_jsonl(tmp_path / "mix.jsonl", records)
    report = FilterReport()
    kept = list(
        filter_conversations(
            convs(path),
            eval_hashes=eval_fingerprints("mt_bench"),
            dedup=True,
            prompt_length=None,
            min_prompt_tokens=0,
            max_prompt_tokens=10**9,
            max_turns=None,
            report=report,
        )
    )
    assert [c.user_turns for c in kept] == [["Write a haiku about rivers."]]
    assert report.as_dict() == {
        "read": {"mix.jsonl": 4},
        "kept": {"mix.jsonl": 1},
        "dropped": {"eval_prompt": {"mix.jsonl": 2}, "duplicate": {"mix.jsonl": 1}},
    }


def test_length_filter_and_max_turns(tmp_path):
    path = write_jsonl(tmp_path / "l.jsonl", [{"turns": ["a", "b", "c"]}, {"prompt": "x" * 50}, {"prompt": "yy"}])
    report = FilterReport()
    kept = list(
        filter_conversations(
            convs(path),
            eval_hashes=set(),
            dedup=False,
            prompt_length=lambda c: len(c.user_turns[0]),
            min_prompt_tokens=2,
            max_prompt_tokens=10,
            max_turns=2,
            report=report,
        )
    )
    assert [c.user_turns for c in kept] == [["yy"]]
    assert report.dropped == {"prompt_too_short": {"l.jsonl": 1}, "prompt_too_long": {"l.jsonl": 1}}


def test_unknown_eval_set_is_one_line():
    with pytest.raises(UsageError, match="evaluation set 'nosuch_bench.jsonl'"):
        eval_fingerprints("nosuch_bench.jsonl")
