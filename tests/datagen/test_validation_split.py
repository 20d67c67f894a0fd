"""The validation split, data side: datagen holds conversations out by the hash of their normalised prompts,
writes them apart (`validation/`), and capture captures them apart; training never sees them as training data.

    .venv/bin/python -m pytest tests/datagen/test_validation_split.py -q
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import re
import shutil
import unicodedata
from fractions import Fraction
from pathlib import Path

import pytest
import torch
from cli_support import assert_user_error, invoke
from split_support import FRACTION, prompt_records, split_copy, split_datagen, split_recipe, write_prompts

from dspark_cli.artifacts.datagen import iter_records
from dspark_cli.capture import (
    CapturedSequence,
    capture_pending,
    contract_for_recipe,
    ensure_capture,
    iter_captured,
    run_capture,
)
from dspark_cli.datagen.filters import split_validation
from dspark_cli.datagen.run import plan_datagen, run_datagen
from dspark_cli.errors import UsageError
from dspark_cli.prompts.conversation import Conversation
from dspark_cli.recipe import load_recipe
from dspark_cli.training.validation_data import validation_sequences


def reference_key(user_turns: list[str]) -> int:
    """The documented key, written out: sha256 of the user turns (NFKC, whitespace collapsed, case-folded,
    joined by U+001E) as an integer."""
    norm = [re.sub(r"\s+", " ", unicodedata.normalize("NFKC", t)).strip().casefold() for t in user_turns]
    return int(hashlib.sha256("\x1e".join(norm).encode("utf-8")).hexdigest(), 16)


def reference_split(convs: list[Conversation], fraction: float, most: int) -> set[str]:
    """Ids held out, the slow way: exact fractions, whole groups of equal keys, smallest keys first."""
    if fraction == 0 or len(convs) < 20:
        return set()
    keys = {c.id: reference_key(c.user_turns) for c in convs}
    held: set[str] = set()
    for key in sorted({k for k in keys.values() if Fraction(k, 2**256) < Fraction(fraction)}):
        group = {i for i, k in keys.items() if k == key}
        if len(held) + len(group) > most:
            break
        held |= group
    return held


def conversations(num: int) -> list[Conversation]:
    """`num` conversations, c{i} and c{i + num/2} asking the same (the second re-cased and re-spaced)."""
    rng = random.Random(0)
    words = ["sort", "a list", "parse", "JSON", "in Python", "quickly", "with tests", "Rust", "a tree"]
    texts = [" ".join(rng.choice(words) for _ in range(4)) + f" #{i}" for i in range(num // 2)]
    texts += ["  " + t.upper().replace(" ", "\n ") for t in texts]
    return [Conversation(f"c{i}", "s", [{"role": "user", "content": t}]) for i, t in enumerate(texts)]


def test_the_split_is_the_documented_hash_rule_whatever_the_order():
    convs = conversations(400)
    for fraction, most in ((0.1, 256), (0.3, 256), (0.3, 9), (0.49, 1000)):
        train, held = split_validation(convs, fraction=fraction, most=most)
        assert {c.id for c in held} == reference_split(convs, fraction, most)
        assert len(held) <= most and {c.id for c in train} | {c.id for c in held} == {c.id for c in convs}
        assert [c.id for c in held] == [c.id for c in convs if c.id in {h.id for h in held}]  # input order kept
        shuffled = convs[:]
        random.Random(fraction).shuffle(shuffled)
        assert {c.id for c in split_validation(shuffled, fraction=fraction, most=most)[1]} == {c.id for c in held}
        half = len(convs) // 2  # c{i} and c{i + half} ask the same: always on the same side
        assert all((f"c{i}" in {c.id for c in held}) == (f"c{i + half}" in {c.id for c in held}) for i in range(half))
    assert 20 < len(split_validation(convs, fraction=0.1, most=256)[1]) < 60


def test_no_split_at_fraction_zero_or_for_a_tiny_corpus(caplog):
    convs = conversations(40)
    assert split_validation(convs, fraction=0.0, most=256) == (convs, [])
    with caplog.at_level(logging.WARNING, logger="dspark_cli.datagen.filters"):
        assert split_validation(convs[:19], fraction=0.3, most=256) == (convs[:19], [])
    assert "fewer than 20: no validation split" in caplog.text


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("datagen.validation_fraction=0.5", "datagen.validation_fraction: must be less than 0.5"),
        ("datagen.validation_fraction=-0.1", "datagen.validation_fraction: must be greater than or equal to 0"),
        ("datagen.validation_max=0", "datagen.validation_max: must be greater than 0"),
    ],
)
def test_a_bad_split_setting_is_one_line(override, needle):
    assert_user_error(invoke("validate", "tiny", override), needle)


def test_the_plan_holds_out_the_same_conversations_whatever_order_batches_or_replicas(tmp_path):
    records = prompt_records()
    straight = write_prompts(tmp_path / "a" / "prompts.jsonl", records)
    shuffled = records[:]
    random.Random(1).shuffle(shuffled)
    mixed = write_prompts(tmp_path / "b" / "prompts.jsonl", shuffled)  # same name: the same conversation ids
    base = plan_datagen(split_recipe(tmp_path / "run", straight))
    held = sorted(c.id for c in base.validation)
    assert held and len(base.conversations) + len(held) == len(records)
    assert held == sorted(c.id for c in base.conversations + base.validation if c.id in set(held))
    for prompts, overrides in (
        (mixed, ()),
        (mixed, ("datagen.batch_size=3", "datagen.shard_size=5", "datagen.data_parallel_size=2")),
        (straight, ("datagen.regenerate=false",)),
    ):
        plan = plan_datagen(split_recipe(tmp_path / "run", prompts, *overrides))
        assert sorted(c.id for c in plan.validation) == held, overrides
    other = plan_datagen(split_recipe(tmp_path / "run", straight, "datagen.validation_fraction=0.2"))
    assert other.fingerprint != base.fingerprint  # a changed split is another plan (resume refuses it)


@pytest.mark.slow  # a datagen run (hf, tiny-gqa, 48 conversations): ~8 s
def test_datagen_writes_the_split_apart_and_no_prompt_is_on_both_sides():
    data = split_datagen() / "run" / "data"
    manifest = json.loads((data / "manifest.json").read_text())
    train = list(iter_records(data))
    held = list(iter_records(data, split="validation"))
    assert held and train
    train_ids, held_ids = {r["id"] for r in train}, {r["id"] for r in held}
    assert not train_ids & held_ids and len(train_ids | held_ids) == len(prompt_records())
    # content: the hash of the normalised prompts of each side never meets the other's
    train_keys = {reference_key([m["content"] for m in r["messages"] if m["role"] == "user"]) for r in train}
    held_keys = {reference_key([m["content"] for m in r["messages"] if m["role"] == "user"]) for r in held}
    assert not train_keys & held_keys

    def partner(conv_id: str) -> str:
        return conv_id.removesuffix("-variant") if conv_id.endswith("-variant") else conv_id + "-variant"

    assert all(partner(i) in held_ids for i in held_ids) and all(partner(i) in train_ids for i in train_ids)
    convs = [Conversation(r["id"], r["source"], r["messages"][:1]) for r in train + held]
    assert held_ids == reference_split(convs, FRACTION, 256)
    split = manifest["validation"]
    assert (split["fraction"], split["max"], split["num_conversations"]) == (FRACTION, 256, len(held))
    assert split["ids"] == sorted(held_ids) and manifest["num_conversations"] == len(train)
    assert split["ids_sha256"] == hashlib.sha256("\n".join(sorted(held_ids)).encode()).hexdigest()
    assert [s["file"] for s in split["shards"]] == [
        f"validation/shard-{i:05d}.jsonl" for i in range(len(held) // 16 + 1)
    ]
    assert not any(s["file"].startswith("validation") for s in manifest["shards"])


@pytest.mark.slow  # regenerates one shard: ~6 s
def test_a_killed_validation_shard_is_regenerated_and_a_changed_fraction_is_refused(tmp_path):
    recipe = split_copy(tmp_path)
    data = Path(recipe.stage_dir("datagen"))
    before = {p.name: p.read_bytes() for p in sorted(data.glob("shard-*.jsonl"))}
    held = (data / "validation" / "shard-00000.jsonl").read_bytes()
    (data / "validation" / "shard-00000.jsonl").unlink()
    summary = run_datagen(recipe)
    assert summary.validation == len(json.loads((data / "manifest.json").read_text())["validation"]["ids"])
    assert (data / "validation" / "shard-00000.jsonl").read_bytes() == held
    assert {p.name: p.read_bytes() for p in sorted(data.glob("shard-*.jsonl"))} == before
    for fraction in ("0.2", "0"):
        with pytest.raises(UsageError, match="different plan"):
            run_datagen(split_copy(tmp_path, f"datagen.validation_fraction={fraction}"))


def _capture_contents(directory: Path, recipe) -> dict[str, CapturedSequence]:
    return {s.id: s for s in iter_captured(directory, expect=contract_for_recipe(recipe))}


@pytest.mark.slow  # captures twice (one process, then two workers): ~25 s
def test_capture_puts_the_split_under_validation_only(tmp_path):
    recipe = split_copy(tmp_path)
    summary = run_capture(recipe)
    hidden = Path(recipe.stage_dir("capture"))
    train = _capture_contents(hidden, recipe)
    held = _capture_contents(hidden / "validation", recipe)
    data = Path(recipe.stage_dir("datagen"))
    held_ids = set(json.loads((data / "manifest.json").read_text())["validation"]["ids"])
    assert summary.validation_sequences == len(held) > 0
    assert {i.split("/")[0] for i in held} == held_ids and not {i.split("/")[0] for i in train} & held_ids
    train_tokens = {tuple(s.input_ids.tolist()) for s in train.values()}
    assert not train_tokens & {tuple(s.input_ids.tolist()) for s in held.values()}  # by token content
    # what the trainers read: the same sequences, in plan order
    contract = contract_for_recipe(recipe)
    got = validation_sequences(recipe, contract)
    assert [s.id for s in got] == list(held)
    assert all(torch.equal(a.aux_hidden, held[a.id].aux_hidden) for a in got)
    assert capture_pending(recipe) is None
    # a capture without its split is pending; the rerun captures only the split
    mtimes = {p.name: p.stat().st_mtime_ns for p in hidden.glob("shard-*.safetensors")}
    shutil.rmtree(hidden / "validation")
    assert "validation" in capture_pending(recipe)
    ensure_capture(recipe)
    assert capture_pending(recipe) is None and {p.name: p.stat().st_mtime_ns for p in hidden.glob("shard-*")} == mtimes
    # two offline workers: the training shards by the workers, the split here, in one process
    two = split_copy(tmp_path, "capture.workers=2", f"capture.output_dir={tmp_path / 'two'}")
    assert run_capture(two).workers == 2
    again = _capture_contents(tmp_path / "two" / "validation", two)
    assert list(again) == list(held) and list(_capture_contents(tmp_path / "two", two)) == list(train)
    assert all(torch.allclose(again[i].aux_hidden, held[i].aux_hidden, atol=1e-5) for i in held)


def test_no_split_reads_as_no_validation(tmp_path):
    from dspark_cli.contract import Contract

    recipe = split_recipe(tmp_path / "run", tmp_path / "none.jsonl", "datagen.validation_fraction=0")
    assert validation_sequences(recipe, Contract("tiny-gqa", None, (0,))) == []


def test_datagen_says_how_many_conversations_it_holds_out(tmp_path):
    overrides = (f"output_dir={tmp_path}", "datagen.sources=[{path: tiny-prompts, max_samples: 200}]")
    held = len(plan_datagen(load_recipe("tiny", list(overrides))).validation)
    assert held > 0
    result = invoke("datagen", "tiny", *overrides, "--dry-run")
    assert result.exit_code == 0, result.output
    assert f"({held} held out for validation)" in result.output
    result = invoke("datagen", "tiny", *overrides, "datagen.validation_fraction=0", "--dry-run")
    assert result.exit_code == 0, result.output
    assert "held out" not in result.output
