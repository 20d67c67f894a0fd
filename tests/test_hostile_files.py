"""Hostile and careless inputs, part B of issue 36: every case is a CLI run (typer's CliRunner) that
ends in one `error:` line and one `hint:` line, exit 2, with nothing lost or half-written.

Cases: conversations lost to repeated ids or same-named sources (3), directories that are not ours
(4), recipes and prompt files too large, too deep or not UTF-8 (5, 6), recipe values out of bounds (10).
"""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from dspark_cli.cli import app

runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(app, list(args))


def assert_user_error(result, *needles: str, exit_code: int = 2) -> None:
    """One `error:` line naming what is wrong, one `hint:` line, no traceback and no "internal error"."""
    lines = result.output.strip().splitlines()
    assert result.exit_code == exit_code, result.output
    assert "internal error" not in result.output and "Traceback" not in result.output, result.output
    assert len(lines) == 2 and lines[0].startswith("error: ") and lines[1].startswith("hint: "), result.output
    for needle in needles:
        assert needle in lines[0], (needle, result.output)


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def keep_answers(tmp_path: Path, sources: str, *extra: str) -> list[str]:
    """A datagen run that keeps the sources' answers (tokenises only: no model runs)."""
    return ["datagen", "tiny", "target.model=tiny-mla", f"output_dir={tmp_path / 'run'}",
            f"datagen.sources={sources}", "datagen.regenerate=false", "datagen.exclude_eval=[]", *extra]


def chats(prefix: str, ids: list[int]) -> list[dict]:
    return [{"id": i, "messages": [{"role": "user", "content": f"{prefix} question {n}"},
                                   {"role": "assistant", "content": f"{prefix} answer {n}"}]}
            for n, i in enumerate(ids)]


# --- case 3: no conversation is lost to an id ---------------------------------------------------------------

def test_repeated_ids_in_one_source_are_refused(tmp_path):
    prompts = write_jsonl(tmp_path / "p.jsonl", chats("same id", [0, 0, 1, 1, 2, 2]))
    result = invoke(*keep_answers(tmp_path, f"[{{path: {prompts}}}]"))
    assert_user_error(result, "p.jsonl:2", "id '0' repeats", "p.jsonl:1")
    assert not (tmp_path / "run").exists()


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
        (path / name).read_text() == text for name, text in files.items())


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
    mine = tmp_path / "mine"
    files = _users_dir(mine)
    result = invoke("train", "tiny", f"output_dir={tmp_path / 'run'}", "-o", str(mine))
    assert result.exit_code == 2 and f"train.output_dir: {mine} already exists and is not dspark train output" \
        in result.output, result.output
    assert _unchanged(mine, files)


def test_the_stage_itself_refuses_a_users_directory(tmp_path):
    """Not only the preflight: the library call that writes (a train rank 0, datagen) refuses it too."""
    import pytest

    from dspark_cli.artifacts.files import exclusive_output
    from dspark_cli.errors import UsageError

    mine = tmp_path / "mine"
    files = _users_dir(mine)
    with pytest.raises(UsageError, match="not dspark train output"), exclusive_output(mine, "train.output_dir",
                                                                                       kind="dspark.train"):
        pass
    assert _unchanged(mine, files)
    with exclusive_output(tmp_path / "ours", "train.output_dir", kind="dspark.train"):
        pass
    with exclusive_output(tmp_path / "ours", "train.output_dir", kind="dspark.train"):  # marked as ours: again
        pass
    with pytest.raises(UsageError, match="not dspark datagen output"), exclusive_output(
            tmp_path / "ours", "datagen.output_dir", kind="dspark.datagen"):
        pass
