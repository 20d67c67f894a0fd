"""Hostile and careless inputs: every case is a CLI run (typer's CliRunner) that
ends in one `error:` line and one `hint:` line, exit 2, with nothing lost or half-written.

Cases: conversations lost to repeated ids or same-named sources (3), directories that are not ours
(4), recipes and prompt files too large, too deep or not UTF-8 (5, 6), recipe values out of bounds (10).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_support import assert_user_error, invoke, invoke_process
from requirements_support import missing


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def keep_answers(tmp_path: Path, sources: str, *extra: str) -> list[str]:
    """A datagen run that keeps the sources' answers (tokenises only: no model runs)."""
    return [
        "datagen",
        "tiny",
        "target.model=tiny-mla",
        f"output_dir={tmp_path / 'run'}",
        f"datagen.sources={sources}",
        "datagen.regenerate=false",
        "datagen.exclude_eval=[]",
        *extra,
    ]


def chats(prefix: str, ids: list[int]) -> list[dict]:
    return [
        {
            "id": i,
            "messages": [
                {"role": "user", "content": f"{prefix} question {n}"},
                {"role": "assistant", "content": f"{prefix} answer {n}"},
            ],
        }
        for n, i in enumerate(ids)
    ]


# --- case 3: no conversation is lost to an id ---------------------------------------------------------------


def test_repeated_ids_in_one_source_are_refused(tmp_path):
    prompts = write_jsonl(tmp_path / "p.jsonl", chats("same id", [0, 0, 1, 1, 2, 2]))
    result = invoke(*keep_answers(tmp_path, f"[{{path: {prompts}}}]"))
    assert_user_error(result, "p.jsonl:2", "id '0' repeats", "p.jsonl:1")
    assert not (tmp_path / "run").exists()
    same = write_jsonl(tmp_path / "same.jsonl", chats("x", [0]) * 2 + chats("y", [1]))  # an exact repeat
    plan = invoke(*keep_answers(tmp_path, f"[{{path: {same}}}]"), "--dry-run")
    assert plan.exit_code == 0 and "dropped (duplicate): 1" in plan.output, plan.output  # counted, as dedup does


def test_two_sources_with_the_same_file_name_keep_both(tmp_path):
    from dspark_cli.artifacts.datagen import iter_records

    a = write_jsonl(tmp_path / "srcA" / "p.jsonl", chats("A", [0, 1, 2]))
    b = write_jsonl(tmp_path / "srcB" / "p.jsonl", chats("B", [0, 1, 2]))
    result = invoke(*keep_answers(tmp_path, f"[{{path: {a}}}, {{path: {b}}}]"))
    assert result.exit_code == 0, result.output
    records = list(iter_records(tmp_path / "run" / "data"))
    users = sorted(r["messages"][0]["content"] for r in records)
    assert users == sorted([f"A question {n}" for n in range(3)] + [f"B question {n}" for n in range(3)])
    assert len({r["id"] for r in records}) == 6
    again = invoke(*keep_answers(tmp_path, f"[{{path: {a}}}, {{path: {a}}}]"))  # the same file twice
    assert_user_error(again, "datagen.sources[1]", "repeats datagen.sources[0]")


# --- case 4: a directory without our manifest is never written -------------------------------------------------


def _users_dir(path: Path) -> dict[str, str]:
    path.mkdir(parents=True)
    files = {"recipe.yaml": "my: own recipe\n", "metrics.jsonl": '{"mine": 1}\n'}
    for name, text in files.items():
        (path / name).write_text(text)
    return files


def _unchanged(path: Path, files: dict[str, str]) -> bool:
    return sorted(p.name for p in path.iterdir()) == sorted(files) and all(
        (path / name).read_text() == text for name, text in files.items()
    )


def test_datagen_never_writes_into_a_users_directory(tmp_path):
    prompts = write_jsonl(tmp_path / "p.jsonl", chats("x", [0, 1]))
    mine = tmp_path / "mine"
    files = _users_dir(mine)
    link = tmp_path / "link"
    link.symlink_to(mine)
    for out in (mine, link):
        result = invoke(*keep_answers(tmp_path, f"[{{path: {prompts}}}]"), "-o", str(out))
        assert result.exit_code == 2 and "is not dspark datagen output" in result.output, result.output
        assert _unchanged(mine, files)
    fresh = invoke(*keep_answers(tmp_path, f"[{{path: {prompts}}}]"), "-o", str(tmp_path / "new"))
    assert fresh.exit_code == 0, fresh.output
    again = invoke(*keep_answers(tmp_path, f"[{{path: {prompts}}}]"), "-o", str(tmp_path / "new"))  # its own: resumes
    assert again.exit_code == 0, again.output


def test_train_never_writes_into_a_users_directory(tmp_path):
    """With a finished datagen output, so that nothing else stops the run first: training into the
    user's directory overwrote their recipe.yaml and appended to their metrics.jsonl."""
    prompts = write_jsonl(tmp_path / "p.jsonl", chats("x", [0, 1, 2, 3]))
    assert invoke(*keep_answers(tmp_path, f"[{{path: {prompts}}}]")).exit_code == 0
    mine = tmp_path / "mine"
    files = _users_dir(mine)
    result = invoke(
        "train", "tiny", "target.model=tiny-mla", f"output_dir={tmp_path / 'run'}", "train.max_steps=2", "-o", str(mine)
    )
    assert (
        result.exit_code == 2
        and f"train.output_dir: {mine} already exists and is not dspark train output" in result.output
    ), result.output
    assert _unchanged(mine, files)


def test_the_stage_itself_refuses_a_users_directory(tmp_path):
    """Not only the preflight: the library call that writes (a train rank 0, datagen) refuses it too."""
    import pytest

    from dspark_cli.artifacts.files import exclusive_output
    from dspark_cli.errors import UsageError

    mine = tmp_path / "mine"
    files = _users_dir(mine)
    with (
        pytest.raises(UsageError, match="not dspark train output"),
        exclusive_output(mine, "train.output_dir", kind="dspark.train"),
    ):
        pass
    assert _unchanged(mine, files)
    with exclusive_output(tmp_path / "ours", "train.output_dir", kind="dspark.train"):
        pass
    with exclusive_output(tmp_path / "ours", "train.output_dir", kind="dspark.train"):  # marked as ours: again
        pass
    with (
        pytest.raises(UsageError, match="not dspark datagen output"),
        exclusive_output(tmp_path / "ours", "datagen.output_dir", kind="dspark.datagen"),
    ):
        pass


# --- case 5: every size from a file or a recipe is bounded before the work ----------------------------------

# 1e9 leaves from nine lines, under a field the recipe has (`seed`): under unknown keys the recipe would be
# refused for those before anything walked the value; here only a bound on the parsed graph stops it.
ALIAS_BOMB = "seed:\n  a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"  {chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 10)}]\n" for i in range(8)
)


def test_a_yaml_alias_bomb_is_refused_at_once(tmp_path):
    recipe = tmp_path / "bomb.yaml"
    recipe.write_text("name: bomb\n" + ALIAS_BOMB)
    result = invoke_process("validate", str(recipe), "--recipe-only", timeout=60)  # an expanded bomb hangs
    assert_user_error(result, str(recipe), "alias")
    override = invoke("validate", "tiny", "--recipe-only", "bench.datasets=" + "[" + ", ".join(["x"] * 3) + "]")
    assert override.exit_code == 0, override.output


def test_a_drafts_alias_bomb_recipe_is_refused_before_anything(tmp_path):
    draft = tmp_path / "draft"
    draft.mkdir()
    (draft / "recipe.yaml").write_text(ALIAS_BOMB)
    (draft / "dspark_manifest.json").write_text("{}")
    result = invoke_process("bench", str(draft), "--offline", timeout=60)
    assert_user_error(result, "recipe.yaml", "alias")


def test_a_recipe_that_is_too_large_or_too_deep(tmp_path):
    big = tmp_path / "big.yaml"
    big.write_text("name: big\n" + "#" * (2 << 20) + "\n")
    assert_user_error(invoke("validate", str(big), "--recipe-only"), "more than a recipe may be")
    deep = tmp_path / "deep.yaml"
    deep.write_text("name: deep\nx: " + "[" * 100_000 + "]" * 100_000 + "\n")
    assert_user_error(invoke("validate", str(deep), "--recipe-only"), str(deep))


def test_a_draft_of_a_billion_layers_is_refused_before_a_model_is_built(tmp_path):
    result = invoke("validate", "tiny", "draft.num_layers=1000000000")
    assert_user_error(result, "draft.num_layers", "less than or equal to 64")
    result = invoke("export", "--recipe", "kimi-k3", "draft.num_layers=1000000000", "--meta", "--dry-run")
    assert_user_error(result, "draft.num_layers")
    result = invoke(
        "bench", "--recipe", "tiny", f"output_dir={tmp_path / 'run'}", "draft.num_layers=1000000000", "--offline"
    )
    assert_user_error(result, "draft.num_layers")


def test_a_draft_config_claiming_a_million_layers(tmp_path):
    draft = tmp_path / "draft"
    draft.mkdir()
    result = invoke(
        "export",
        "--recipe",
        "tiny",
        f"export.output_dir={tmp_path / 'plan'}",
        "--meta",
        "--dry-run",
        "--format",
        "json",
    )
    assert result.exit_code == 0, result.output
    config = json.loads(result.stdout)["config"]
    config["num_hidden_layers"] = 1_000_000
    config["layer_types"] = ["full_attention"] * 3
    (draft / "config.json").write_text(json.dumps(config))
    (draft / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    checked = invoke("export", "--check", str(draft))
    assert checked.exit_code != 0 and "internal error" not in checked.output, checked.output
    assert "1,000,000" in checked.output and "at most 64" in checked.output, checked.output


def test_a_signed_draft_claiming_a_million_layers_is_not_benched(tmp_path):
    """A draft whose manifest checksums match (re-signed, as a forger would) and whose config claims a
    million layers: bench refuses it in one line before it builds anything."""
    import time

    from bench_support import export_random_draft
    from test_publish import resign

    from dspark_cli.recipe import load_recipe

    draft = export_random_draft(load_recipe("tiny", [f"output_dir={tmp_path / 'run'}"]), tmp_path / "draft")
    config = json.loads((draft / "config.json").read_text())
    config["num_hidden_layers"] = 1_000_000
    (draft / "config.json").write_text(json.dumps(config))
    resign(draft)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    started = time.perf_counter()
    benched = invoke("bench", str(draft), "--recipe", "tiny", "--offline", f"output_dir={tmp_path / 'run'}")
    assert benched.exit_code == 1 and "internal error" not in benched.output, benched.output
    assert "at most 64 draft layers, got 1,000,000" in benched.output and "not benchmarking it" in benched.output
    assert time.perf_counter() - started < 10  # no model of a million layers was built
    # no file written (the preflight's writability probe leaves the empty output directory it made)
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file()) == before


@pytest.mark.slow  # in the fast lane at load 7: 10 s
def test_a_50_mb_prompt_is_dropped_without_tokenising_it(tmp_path):
    """Tokenising it took 38 s and 8.4 GB here; measured without tokenising: 6.5 s and 1.5 GB. Memory,
    unlike time, does not depend on how busy the machine is: the bound is on the process's peak RSS."""
    prompts = tmp_path / "p.jsonl"
    huge = {"id": "huge", "messages": [{"role": "user", "content": "word " * 10_000_000}]}
    write_jsonl(prompts, [*chats("small", [1, 2]), huge])
    result = invoke_process(*keep_answers(tmp_path, f"[{{path: {prompts}}}]"), "--dry-run", timeout=300)
    assert result.exit_code == 0, result.output
    assert "dropped (prompt_too_long): 1" in result.output and "2 conversations" in result.output, result.output
    assert 0 < result.peak_rss_mib < 4096, result.peak_rss_mib


# --- case 6: the user's input at fault is one line, not "internal error" -------------------------------------


def test_a_recipe_that_is_not_utf8(tmp_path):
    recipe = tmp_path / "latin1.yaml"
    recipe.write_bytes("name: caf\u00e9\n".encode("latin-1"))
    assert_user_error(invoke("validate", str(recipe), "--recipe-only"), f"{recipe}:1: not UTF-8")


def test_prompts_nested_100k_deep(tmp_path):
    for name, text in (
        ("deep.jsonl", '{"messages": ' + "[" * 100_000 + "]" * 100_000 + "}\n"),
        ("deep.json", "[" * 100_000 + "]" * 100_000),
    ):
        path = tmp_path / name
        path.write_text(text)
        result = invoke(*keep_answers(tmp_path, f"[{{path: {path}}}]"), "--dry-run")
        assert_user_error(result, str(path), "nested too deeply")


def test_a_conversation_starting_with_an_assistant_turn(tmp_path):
    prompts = write_jsonl(
        tmp_path / "p.jsonl",
        [
            {
                "messages": [
                    {"role": "assistant", "content": "hello first"},
                    {"role": "user", "content": "hi"},
                    {"role": "assistant", "content": "yo"},
                ]
            }
        ],
    )
    result = invoke(*keep_answers(tmp_path, f"[{{path: {prompts}}}]"))
    assert_user_error(result, "p.jsonl:1", "starts with an assistant turn")
    assert not (tmp_path / "run").exists()


def _target_copy(tmp_path: Path, name: str = "tiny-gqa") -> Path:
    import shutil

    from dspark_cli.targets import resolve_target

    target = tmp_path / "target"
    shutil.copytree(resolve_target(name), target)
    return target


def test_a_chat_template_the_sandbox_stops(tmp_path):
    target = _target_copy(tmp_path, "tiny-mla")
    (target / "chat_template.jinja").write_text("{{ ''.__class__.__mro__[1].__subclasses__() }}")
    config = json.loads((target / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (target / "tokenizer_config.json").write_text(json.dumps(config))
    prompts = write_jsonl(tmp_path / "p.jsonl", chats("x", [1]))
    result = invoke(
        "datagen",
        "tiny",
        f"target.model={target}",
        f"output_dir={tmp_path / 'run'}",
        f"datagen.sources=[{{path: {prompts}}}]",
        "datagen.regenerate=false",
        "datagen.exclude_eval=[]",
    )
    assert_user_error(result, "chat template", "SecurityError")


def test_a_target_config_whose_sizes_do_not_match_its_weights(tmp_path):
    target = _target_copy(tmp_path)
    config = json.loads((target / "config.json").read_text())
    config["intermediate_size"] *= 2
    (target / "config.json").write_text(json.dumps(config))
    for command in (
        ["validate"],
        [
            "datagen",
            "datagen.engine=hf",
            "datagen.max_tokens=4",
            "datagen.sources=[{path: tiny-prompts, max_samples: 2}]",
        ],
    ):
        result = invoke(
            command[0],
            "tiny",
            f"target.model={target}",
            "draft.arch=gqa",
            f"output_dir={tmp_path / 'run'}",
            *command[1:],
        )
        assert_user_error(result, "target.model:", "intermediate_size is", "gate_proj.weight is")
    assert not (tmp_path / "run").exists()


def test_a_capture_shard_on_a_full_disk(tmp_path):
    """safetensors' write error is a SafetensorError, not an OSError: it must read as a full disk."""
    import errno
    import shutil
    import subprocess

    import pytest
    import torch

    from dspark_cli.capture.shards import write_shard
    from dspark_cli.capture.types import CapturedSequence
    from dspark_cli.errors import os_error

    where = tmp_path / "small"
    where.mkdir()
    if (
        shutil.which("mount") is None
        or subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(where)], capture_output=True, check=False
        ).returncode
        != 0
    ):
        missing("tmpfs", "a small tmpfs cannot be mounted here (needs root): no full disk to write to")
    try:
        length, hidden = 512, 64
        seq = CapturedSequence(
            id="a#1",
            input_ids=torch.zeros(length, dtype=torch.int32),
            loss_mask=torch.ones(length, dtype=torch.int32),
            aux_hidden=torch.zeros(length, 2 * hidden),
            last_hidden=torch.zeros(length, hidden),
        )
        with pytest.raises(OSError) as caught:
            write_shard(where / "shard-00000.safetensors", [seq], layer_ids=[0, 1], hidden_size=hidden)
        assert caught.value.errno == errno.ENOSPC
        assert os_error(caught.value).message.startswith("no space left on device")
        assert list(where.iterdir()) == []  # no half-written temp shard
    finally:
        subprocess.run(["umount", str(where)], check=True)


# --- case 10: recipe values out of bounds, paths, checkpoints, a read-only directory ----------------------------


def test_values_that_pass_no_more(tmp_path):
    for override, needle in (
        ("train.lr=.inf", "train.lr: must be a finite number"),
        ("train.lr=.nan", "train.lr: must be a finite number"),
        ("name=../../escape", "name: must be a plain name"),
        ('name="a\\nb"', "name: must be a plain name"),
        ("output_dir=runs/../../escape", "output_dir: must not step out with '..'"),
        ('output_dir="runs/a\\nb"', "output_dir: must not contain control characters"),
        ("train.output_dir=/x/../y", "train.output_dir: must not step out"),
    ):
        assert_user_error(invoke("validate", "tiny", "--recipe-only", override), needle)
    result = invoke("validate", "tiny", "train.nproc_per_node=100000")
    assert_user_error(result, "train.nproc_per_node: 100,000 processes on this machine without a GPU")


def test_validate_in_a_read_only_directory_refuses_what_the_stages_would(tmp_path, monkeypatch):
    import shutil
    import subprocess

    where = tmp_path / "ro"
    where.mkdir()
    if (
        shutil.which("mount") is None
        or subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(where)], capture_output=True, check=False
        ).returncode
        != 0
    ):
        missing("tmpfs", "a read-only tmpfs cannot be mounted here (needs root)")
    try:
        monkeypatch.chdir(where)
        result = invoke("validate", "tiny")
        assert result.exit_code == 2 and "internal error" not in result.output, result.output
        assert "datagen.output_dir: cannot write" in result.output and "read-only file system" in result.output, (
            result.output
        )
        assert invoke("validate", "tiny", f"output_dir={tmp_path / 'run'}").exit_code == 0
    finally:
        monkeypatch.chdir(tmp_path)
        subprocess.run(["umount", str(where)], check=True)
