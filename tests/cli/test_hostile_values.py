"""Hostile values: JSON from outside nested 50,000 deep, and numbers that fit no C type. Each case is a
command that ends in one `error:` line naming the file or the key (and a hint), with the files unchanged.

    .venv/bin/python -m pytest tests/cli/test_hostile_values.py -q
"""

from __future__ import annotations

import hashlib
import json
import types
import typing
from pathlib import Path
from typing import Any, get_args, get_origin

import pytest
from cli_support import assert_user_error, invoke
from pydantic import BaseModel, ValidationError

DEEP = "[" * 50_000 + "]" * 50_000  # json.loads: RecursionError


def files_of(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*") if p.is_file()
    }


def resign(draft: Path) -> None:
    """Record the draft's files' checksums in its manifest, as export (or a forger) would."""
    manifest = json.loads((draft / "dspark_manifest.json").read_text())
    manifest["files"] = {name: hashlib.sha256((draft / name).read_bytes()).hexdigest() for name in manifest["files"]}
    (draft / "dspark_manifest.json").write_text(json.dumps(manifest))


@pytest.fixture
def draft(tmp_path) -> Path:
    """A freshly exported tiny draft (and its training output beside it, `draft-train`)."""
    from bench_support import export_random_draft

    from dspark_cli.recipe import load_recipe

    return export_random_draft(load_recipe("tiny", [f"output_dir={tmp_path / 'run'}"]), tmp_path / "draft")


# --- case 1: JSON nested 50,000 deep is one line naming the file, not a RecursionError ------------------------


@pytest.mark.parametrize(
    ("text", "finding"),
    [(DEEP, "invalid JSON (nested deeper than 64 levels at line 1)"), ("[]", "not a JSON object (a list)")],
    ids=["50000-deep", "a-list"],
)
def test_a_draft_config_nested_50000_deep(tmp_path, draft, text, finding):
    (draft / "config.json").write_text(text)
    resign(draft)  # the checksums match: only the config's content stops it
    before = files_of(tmp_path)
    checked = invoke("export", "--check", str(draft))
    assert checked.exit_code == 1 and "internal error" not in checked.output, checked.output
    assert "Traceback" not in checked.output
    findings = [line for line in checked.output.splitlines() if "config.json" in line]
    assert findings == [f"error: config.json: {finding}; fix: export again"]
    benched = invoke("bench", str(draft), "--recipe", "tiny", "--offline", f"output_dir={tmp_path / 'run'}")
    assert_user_error(benched, str(draft), f"config.json: {finding}", exit_code=1)
    assert files_of(tmp_path) == before


def test_a_draft_manifest_nested_50000_deep(tmp_path, draft):
    (draft / "dspark_manifest.json").write_text(DEEP)
    before = files_of(tmp_path)
    for command in (["export", "--check", str(draft)], ["bench", str(draft), "--offline"]):
        result = invoke(*command)
        assert_user_error(result, "dspark_manifest.json: unreadable (nested deeper than 64 levels", exit_code=1)
    assert files_of(tmp_path) == before


def test_a_training_manifest_nested_50000_deep(tmp_path, draft):
    train = tmp_path / "draft-train"
    (train / "manifest.json").write_text('{"kind": "dspark.train", "contract": ' + DEEP + "}")
    before = files_of(tmp_path)
    result = invoke("export", str(train), "-o", str(tmp_path / "out"))
    assert_user_error(result, "manifest.json", "nested deeper than 64 levels", exit_code=1)
    assert files_of(tmp_path) == before and not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", ["config.json", "tokenizer_config.json"])  # the second: read by transformers
def test_a_target_json_file_nested_50000_deep(tmp_path, name):
    import shutil

    from dspark_cli.targets import resolve_target

    target = tmp_path / "target"
    shutil.copytree(resolve_target("tiny-gqa"), target)
    (target / name).write_text('{"hidden_size": ' + DEEP + "}")
    before = files_of(tmp_path)
    result = invoke("validate", "tiny", f"target.model={target}", "draft.arch=gqa")
    assert_user_error(result, "target.model", f"{name}: invalid JSON (nested deeper than 64 levels")
    assert files_of(tmp_path) == before


def test_a_bench_report_nested_50000_deep(tmp_path):
    from dspark_cli.artifacts.bench import read_bench_report
    from dspark_cli.errors import DataError

    report = tmp_path / "bench.json"
    report.write_text('{"kind": "dspark.bench", "offline": ' + DEEP + "}")
    with pytest.raises(DataError, match=r"bench.json: invalid JSON \(nested deeper than 64 levels"):
        read_bench_report(report)


def test_the_bounded_json_reader():
    from dspark_cli.recipe.bounded import MAX_JSON_NESTING, loads_json

    ok = {"a": "[[[[{{{{", "b": [[1, {"c": [2]}]]}  # brackets inside strings are text
    assert loads_json(json.dumps(ok)) == ok
    at_bound = "[" * MAX_JSON_NESTING + "]" * MAX_JSON_NESTING
    assert loads_json(at_bound) == json.loads(at_bound)
    for text, line in (("[" * 65 + "]" * 65, 1), ('{\n"x":\n' + "[" * 500 + "]" * 500 + "}", 3), (DEEP, 1)):
        with pytest.raises(json.JSONDecodeError, match="nested deeper than 64 levels") as caught:
            loads_json(text)
        assert caught.value.lineno == line
    with pytest.raises(json.JSONDecodeError, match="not UTF-8 text"):
        loads_json(b'{"a": "\xff"}')


# --- case 2: numbers that fit no C type are refused by validate, naming the key and the range ----------------

SEED_MAX, INT_MAX = 2**32 - 1, 2**63 - 1


@pytest.mark.parametrize(
    ("override", "key", "range_"),
    [
        ("train.seed=18446744073709551616", "train.seed:", "from 0 to 4,294,967,295"),  # 2**64: torch overflows
        ("datagen.seed=4294967296", "datagen.seed:", "from 0 to 4,294,967,295"),  # 2**32: numpy refuses
        ("seed=-1", "error: seed:", "from 0 to 4,294,967,295"),
        ("train.max_steps=9223372036854775808", "train.max_steps:", "from 1 to 9,223,372,036,854,775,807"),
        ("train.warmup_steps=9223372036854775808", "train.warmup_steps:", "from 0 to 9,223,372,036,854,775,807"),
        ("capture.devices=[0, 18446744073709551616]", "capture.devices: [1]", "9,223,372,036,854,775,807"),
    ],
)
def test_a_number_that_fits_no_c_type_is_refused(override, key, range_):
    assert_user_error(invoke("validate", "tiny", override, "--recipe-only"), f"{key} must be an integer", range_)


def test_the_largest_numbers_that_fit_are_taken(tmp_path):
    largest = [f"seed={SEED_MAX}", f"train.seed={SEED_MAX}", f"datagen.seed={SEED_MAX}", f"train.max_steps={INT_MAX}"]
    result = invoke("validate", "tiny", *largest, "--recipe-only")
    assert result.exit_code == 0, result.output
    recipe = tmp_path / "big.yaml"
    recipe.write_text(f"name: big\ntrain: {{seed: {SEED_MAX + 1}}}\n")
    text = recipe.read_text()
    assert_user_error(invoke("validate", str(recipe), "--recipe-only"), "train.seed", "4,294,967,295")
    assert recipe.read_text() == text


def test_the_seed_range_is_what_every_seeded_library_takes():
    """dspark seeds torch itself; vLLM and transformers' set_seed also seed numpy, the narrowest."""
    import random

    import numpy
    import torch

    from dspark_cli.recipe.schema import SEED_RANGE

    for seed in SEED_RANGE:
        torch.manual_seed(seed)
        torch.Generator().manual_seed(seed)
        numpy.random.seed(seed)
        random.seed(seed)
    for outside in (SEED_RANGE[0] - 1, SEED_RANGE[1] + 1):
        with pytest.raises(ValueError):
            numpy.random.seed(outside)
    torch.manual_seed(0)


def _too_big(annotation: Any, name: str) -> Any:
    """A value of `annotation`'s shape whose one integer is just past the range (None: it holds no integer)."""
    origin, args = get_origin(annotation), get_args(annotation)
    if annotation is int:
        return SEED_MAX + 1 if name.endswith("seed") else INT_MAX + 1
    if origin is typing.Annotated:
        return _too_big(args[0], name)
    if origin in (typing.Union, types.UnionType):
        return next((v for v in (_too_big(a, name) for a in args) if v is not None), None)
    if origin is list:
        item = _too_big(args[0], name)
        return None if item is None else [item]
    if origin is dict:
        value = _too_big(args[1], name)
        return None if value is None else {"k": value}
    return None


def _int_fields() -> list[tuple[str, dict[str, Any]]]:
    """(dotted key, recipe tree setting only it) for every integer anywhere in the schema."""
    from dspark_cli.recipe.schema import Recipe

    cases = []

    def walk(model: type[BaseModel], key: str, wrap: Any) -> None:
        for name, field in model.model_fields.items():
            annotation = field.annotation
            inner = next((a for a in get_args(annotation) if isinstance(a, type) and issubclass(a, BaseModel)), None)
            if isinstance(annotation, type) and issubclass(annotation, BaseModel):
                walk(annotation, f"{key}{name}.", lambda v, n=name: wrap({n: v}))
            elif get_origin(annotation) is list and inner is not None:  # datagen.sources: a list of mappings
                required = {k: "x" for k, f in inner.model_fields.items() if f.is_required()}
                walk(inner, f"{key}{name}[0].", lambda v, n=name, r=required: wrap({n: [{**r, **v}]}))
            elif (value := _too_big(annotation, name)) is not None:
                cases.append((f"{key}{name}", wrap({name: value})))

    walk(Recipe, "", lambda v: v)
    return cases


def test_every_integer_of_the_schema_is_bounded():
    from dspark_cli.recipe.loader import describe_error
    from dspark_cli.recipe.schema import Recipe

    cases = _int_fields()
    assert {"seed", "train.seed", "datagen.seed", "train.max_steps", "datagen.sources[0].max_samples"} <= {
        key for key, _ in cases
    }
    for key, tree in cases:
        with pytest.raises(ValidationError) as caught:
            Recipe.model_validate(tree)
        problems = [describe_error(err) for err in caught.value.errors()]
        assert any(p.startswith((f"{key}:", f"{key}[")) for p in problems), (key, problems)
