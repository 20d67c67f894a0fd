"""Errors a user can cause -- broken inputs and OS errors -- are one line and a hint, never "internal error".

Each test is a real CLI run (typer's CliRunner) of a case from a bad-input matrix:
corrupt or missing target files, an output path that is a file / read-only / on a full disk, a binary
prompts file, `init -o DIR --force`, a safetensors header claiming 1e12 bytes.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
from pathlib import Path

import pytest
from cli_support import assert_user_error, invoke
from disk_support import full_disk, mount_tmpfs
from requirements_support import missing

from dspark_cli.targets import resolve_target

# datagen fails (or not) before it loads the target when its output path is unusable: no model run needed
DATAGEN = ["datagen.sources=[{path: tiny-prompts, max_samples: 2}]", "datagen.max_tokens=4", "datagen.engine=hf"]


def _target_copy(tmp_path: Path, name: str = "tiny-gqa") -> Path:
    target = tmp_path / "target"
    shutil.copytree(resolve_target(name), target)
    return target


# --- the target's files --------------------------------------------------------------------------------


def _corrupt_config(target: Path) -> str:
    (target / "config.json").write_text('{"hidden_size": 64,\n "vocab_size": ')
    return "config.json: invalid JSON"


def _no_config(target: Path) -> str:
    (target / "config.json").unlink()
    return "no config.json"


def _truncated_weights(target: Path) -> str:
    weights = target / "model.safetensors"
    os.truncate(weights, weights.stat().st_size // 2)
    return "model.safetensors: truncated"


def _huge_header(target: Path) -> str:
    (target / "model.safetensors").write_bytes(struct.pack("<Q", 10**12) + b"{}")
    return "header claims 1,000,000,000,000 bytes"


@pytest.mark.parametrize("breakage", [_corrupt_config, _no_config, _truncated_weights, _huge_header])
@pytest.mark.parametrize("command", [["validate"], ["datagen", "--dry-run"], ["train", "--dry-run"]])
def test_a_broken_target_is_named_by_validate_and_every_stage(tmp_path, breakage, command):
    target = _target_copy(tmp_path)
    needle = breakage(target)
    result = invoke(
        command[0], "tiny", f"target.model={target}", "draft.arch=gqa", f"output_dir={tmp_path / 'run'}", *command[1:]
    )
    assert_user_error(result, "target.model:", str(target), needle)
    assert not (tmp_path / "run").exists()


def test_a_safetensors_header_claiming_1e12_bytes_is_no_memory_error(tmp_path):
    draft = tmp_path / "draft"
    draft.mkdir()
    (draft / "config.json").write_text(json.dumps({"architectures": ["Qwen3DSparkModel"]}))
    (draft / "model.safetensors").write_bytes(struct.pack("<Q", 10**12) + b"{}")
    result = invoke("export", "--check", str(draft))
    assert result.exit_code == 1 and "internal error" not in result.output, result.output
    assert "model.safetensors: unreadable header" in result.output and "claims 1,000,000,000,000 bytes" in result.output


# --- where outputs go ----------------------------------------------------------------------------------


def test_an_output_dir_that_is_a_file(tmp_path):
    in_the_way = tmp_path / "runs"
    in_the_way.write_text("not a directory\n")
    for args in (
        ["validate", "tiny", f"output_dir={in_the_way}"],
        ["datagen", "tiny", *DATAGEN, f"output_dir={in_the_way}"],
        ["validate", "tiny", f"export.output_dir={in_the_way}/draft"],
    ):
        result = invoke(*args)  # caught with the recipe, before any stage starts
        assert result.exit_code == 2 and "internal error" not in result.output, result.output
        assert f"{in_the_way} is a file" in result.output.splitlines()[0], result.output
    # where no recipe names the path, the OS error itself is the one line
    result = invoke("init", "tiny", "-o", str(in_the_way / "my.yaml"))
    assert_user_error(result, str(in_the_way))
    assert in_the_way.read_text() == "not a directory\n"


@pytest.fixture
def read_only_dir(tmp_path):
    """A directory this process cannot write to: chmod 555, or (as root, whom modes do not stop) a ro mount."""
    where = tmp_path / "ro"
    if mount_tmpfs(where, "ro,size=64k"):
        yield where
        subprocess.run(["umount", str(where)], check=True)
    elif os.geteuid() != 0:
        where.chmod(0o555)
        yield where
        where.chmod(0o755)
    else:
        missing("tmpfs", "root here and tmpfs cannot be mounted: no way to make a read-only directory")


@pytest.fixture
def full_dir(tmp_path):
    """A directory on a filesystem with (almost) no space left: a 64 kB tmpfs, filled."""
    with full_disk(tmp_path / "full") as where:
        yield where


@pytest.mark.parametrize("command", ["datagen", "init"])
def test_a_read_only_directory(read_only_dir, command):
    args = (
        ["datagen", "tiny", *DATAGEN, f"output_dir={read_only_dir / 'run'}"]
        if command == "datagen"
        else ["init", "tiny", "-o", str(read_only_dir / "my.yaml")]
    )
    result = invoke(*args)
    assert_user_error(result, str(read_only_dir))
    assert ("read-only file system" in result.output) or ("permission denied" in result.output)
    assert os.listdir(read_only_dir) == []


@pytest.mark.parametrize("command", ["datagen", "init"])
def test_a_full_disk(full_dir, command):
    args = (
        ["datagen", "tiny", *DATAGEN, f"output_dir={full_dir / 'run'}"]
        if command == "datagen"
        else ["init", "tiny", "-o", str(full_dir / "my.yaml")]
    )
    result = invoke(*args)
    assert_user_error(result, "no space left on device", exit_code=1)
    if command == "init":  # the temporary copy is gone, nothing half-written is left
        assert sorted(os.listdir(full_dir)) == ["filler"]


# --- inputs --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".parquet"])
def test_a_binary_prompts_file(tmp_path, suffix):
    prompts = tmp_path / f"prompts{suffix}"
    prompts.write_bytes(b"\x1f\x8b\x08\x00" + bytes(range(255, -1, -1)) * 8)  # a gzip file, say
    result = invoke(
        "datagen", "tiny", f"datagen.sources=[{{path: {prompts}}}]", f"output_dir={tmp_path / 'run'}", "--dry-run"
    )
    assert_user_error(result, str(prompts))
    assert "not UTF-8 text" in result.output or "not a readable Parquet file" in result.output


def test_init_force_onto_a_directory_refuses_and_leaves_nothing(tmp_path):
    directory = tmp_path / "recipes"
    directory.mkdir()
    (directory / "keep.yaml").write_text("name: mine\n")
    result = invoke("init", "tiny", "-o", str(directory), "--force")
    assert_user_error(result, f"{directory} is a directory")
    assert sorted(os.listdir(tmp_path)) == ["recipes"]  # no .recipes.tmp beside it
    assert os.listdir(directory) == ["keep.yaml"] and (directory / "keep.yaml").read_text() == "name: mine\n"
