"""What a training directory may hold and what a rerun may do : `dspark train` runs.

    .venv/bin/python -m pytest tests/training/test_train_integrity.py -q        # ~2 min on 2 cores

Checkpoints carry checksums verified before anything is unpickled; loading runs no code from the
files; a diverged run stops without saving; a rerun with other settings is refused in one line;
checkpoint failures (torch's CheckpointException, a full disk) are one line and leave no temp dir.
Each test copies one finished 5-step run (checkpoints at steps 2, 4, 5) of the fixture target.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import train_fixtures
from requirements_support import missing

pytestmark = (
    pytest.mark.slow
)  # every test here runs dspark stages in processes (torchrun, producers, training): minutes

ROOT = Path(__file__).resolve().parents[2]
DSPARK = str(Path(sys.executable).with_name("dspark"))


def _dspark(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", "COLUMNS": "200"}
    return subprocess.run([DSPARK, *args], capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)


def _train(work: Path, *extra: str) -> subprocess.CompletedProcess:
    return _dspark("train", "tiny", *train_fixtures.cli_overrides(work, *extra))


def _one_line_error(out: subprocess.CompletedProcess, code: int = 1) -> str:
    assert out.returncode == code, (out.returncode, out.stderr[-3000:])
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 2, out.stderr  # error + hint
    return out.stderr


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    work = tmp_path_factory.mktemp("integrity") / "w"
    train_fixtures.make_target(work / "target")
    sequences = train_fixtures.make_sequences(work / "target", num=10)
    train_fixtures.write_capture(work, sequences, train_fixtures.cli_overrides(work))
    out = _train(work)
    assert out.returncode == 0, out.stderr[-3000:]
    assert sorted(p.name for p in (work / "run" / "train" / "checkpoints").iterdir()) == [
        "latest",
        "step-000002",
        "step-000004",
        "step-000005",
    ]
    return work


@pytest.fixture
def work(finished, tmp_path):
    copy = tmp_path / "w"
    shutil.copytree(finished, copy, symlinks=True)
    return copy


def _ckpt(work: Path, step: int = 5) -> Path:
    return work / "run" / "train" / "checkpoints" / f"step-{step:06d}"


def _flip(path: Path, at: float = 0.5, count: int = 2) -> None:
    data = bytearray(path.read_bytes())
    for i in range(count):
        data[int(len(data) * at) + i] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "damage", ["distcp-flip", "distcp-overwrite", "distcp-truncate", "metadata-overwrite", "metadata-truncate"]
)
def test_a_damaged_checkpoint_is_refused_before_it_is_read(work, damage):
    """Case 3 (and 6's truncated files): was a silent resume (NaN loss / changed weights) or a raw
    CheckpointException traceback; now one line naming the file, before torch reads it."""
    name, how = damage.split("-")
    victim = _ckpt(work) / (".metadata" if name == "metadata" else "__0_0.distcp")
    if how == "flip":
        _flip(victim)
    elif how == "overwrite":
        data = bytearray(victim.read_bytes())
        data[len(data) // 3 : len(data) // 3 + 64] = b"\x00" * 64
        victim.write_bytes(bytes(data))
    else:
        victim.write_bytes(victim.read_bytes()[: len(victim.read_bytes()) // 2])
    err = _one_line_error(_train(work))
    assert str(victim) in err and ("checksum mismatch" in err or "truncated" in err)
    assert "--resume" in err  # the hint: an earlier checkpoint, or start over
    if damage == "distcp-flip":  # following the hint: the earlier checkpoint resumes and the run finishes
        out = _train(work, "--resume", str(_ckpt(work, 4)))
        assert out.returncode == 0, out.stderr[-3000:]
        manifest = json.loads((work / "run" / "train" / "manifest.json").read_text())
        assert manifest["summary"]["resumed_from"] == str(_ckpt(work, 4)) and manifest["summary"]["steps"] == 5


def _payload(marker: Path) -> bytes:
    class Evil:
        def __reduce__(self):
            return exec, (f"open({str(marker)!r}, 'w').write('pwned')",)

    return pickle.dumps(Evil())


def test_a_pickle_payload_in_metadata_never_runs(work, tmp_path):
    """Case 4: `.metadata` is unpickled by torch DCP on resume; a payload there ran."""
    from dspark_cli.artifacts.files import sha256_file

    marker = tmp_path / "pwned"
    ckpt = _ckpt(work)
    (ckpt / ".metadata").write_bytes(_payload(marker))
    err = _one_line_error(_train(work))  # the checksum catches the swap
    assert "checksum mismatch" in err or "truncated" in err
    assert not marker.exists()
    # a hostile author also rewrites checksums.json: the allow-listing unpickler refuses the payload
    sums = json.loads((ckpt / "checksums.json").read_text())
    metadata = ckpt / ".metadata"
    sums["files"][".metadata"] = {"bytes": metadata.stat().st_size, "sha256": sha256_file(metadata)}
    (ckpt / "checksums.json").write_text(json.dumps(sums))
    err = _one_line_error(_train(work))
    assert "unreadable checkpoint" in err and "refusing to load builtins.exec" in err
    assert not marker.exists()
    # and a checkpoint without checksums (older dspark, or made by hand) is refused, not trusted
    (ckpt / "checksums.json").unlink()
    err = _one_line_error(_train(work))
    assert "no checksums.json" in err and not marker.exists()


def test_a_payload_in_non_tensor_state_never_runs(work, tmp_path, monkeypatch):
    """Case 4, the other unpickle: DCP loads non-tensor state (optimizer settings) with
    torch.load(weights_only=False); a checkpoint written with such a payload does not run it on load."""
    import torch

    from dspark_cli.training import checkpoint as ckpt_mod
    from dspark_cli.training.distributed import DistEnv

    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return exec, (f"open({str(marker)!r}, 'w').write('pwned')",)

    env = DistEnv(0, 1, 0, torch.device("cpu"))
    module = torch.nn.Linear(2, 2)
    optimizer = torch.optim.AdamW(module.parameters())
    real_state = ckpt_mod._state
    monkeypatch.setattr(ckpt_mod, "_state", lambda m, o: {**real_state(m, o), "extra": Evil()})
    recipe = train_fixtures.tiny_recipe(work)
    path = ckpt_mod.save_checkpoint(
        env,
        tmp_path / "out",
        step=1,
        module=module,
        optimizer=optimizer,
        meta={"contract": None, "position": {"epoch": 0, "consumed": 1}},
        recipe=recipe,
    )  # a meta.json that passes check_meta: the payload is reached
    monkeypatch.setattr(ckpt_mod, "_state", lambda m, o: {**real_state(m, o), "extra": None})
    monkeypatch.setattr(ckpt_mod, "check_contract", lambda *a: None)
    from dspark_cli.errors import DataError

    with pytest.raises(DataError, match="unreadable checkpoint") as info:
        ckpt_mod.load_checkpoint(env, path, module=module, optimizer=optimizer, contract=None)
    assert "\n" not in str(info.value) and not marker.exists()


def test_a_truncated_file_behind_forged_checksums_is_one_line(work):
    """Case 6: torch's CheckpointException (a BaseException) escaped as a traceback."""
    from dspark_cli.artifacts.files import sha256_file

    ckpt = _ckpt(work)
    victim = ckpt / "__0_0.distcp"
    victim.write_bytes(victim.read_bytes()[:1000])
    sums = json.loads((ckpt / "checksums.json").read_text())
    sums["files"][victim.name] = {"bytes": 1000, "sha256": sha256_file(victim)}
    (ckpt / "checksums.json").write_text(json.dumps(sums))
    err = _one_line_error(_train(work))
    assert f"{ckpt}: unreadable checkpoint" in err


def test_a_diverged_run_stops_at_the_first_non_finite_step_and_saves_nothing_from_it(tmp_path):
    """Case 3, the guard: NaN in one captured sequence made NaN weights, checkpoints and final/."""
    import torch

    work = tmp_path / "w"
    train_fixtures.make_target(work / "target")
    sequences = train_fixtures.make_sequences(work / "target", num=10)
    import dataclasses

    aux = sequences[7].aux_hidden.clone()
    aux[20:30] = torch.nan  # a loss-masked stretch of one sequence
    sequences[7] = dataclasses.replace(sequences[7], aux_hidden=aux)
    train_fixtures.write_capture(work, sequences, train_fixtures.cli_overrides(work))
    err = _one_line_error(_train(work, "train.log_every=1"))
    assert "training diverged: non-finite loss or gradient norm at step" in err
    bad = int(err.split("at step ")[1].split(";")[0])
    train_dir = work / "run" / "train"
    steps = [json.loads(line)["step"] for line in (train_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, bad))  # every step before it was logged, finite; none from it on
    saved = sorted(int(p.name.split("-")[1]) for p in (train_dir / "checkpoints").glob("step-*"))
    assert all(s < bad for s in saved) and not (train_dir / "final").exists()
    assert not (train_dir / "manifest.json").exists()


def _recorded(work: Path) -> tuple[bytes, bytes]:
    train_dir = work / "run" / "train"
    return (train_dir / "recipe.yaml").read_bytes(), (train_dir / "manifest.json").read_bytes()


@pytest.mark.parametrize(
    "change, named, fix",
    [
        # the preflight's line (it refuses before any work; training itself would refuse the same)
        (
            ("train.max_steps=2", "capture.max_seq_len=256"),
            "captured with capture.max_seq_len=64, this recipe says 256",
            "capture into a new capture.output_dir",
        ),
        (("train.max_steps=2",), "train.max_steps None -> 2", "-o DIR"),
        (("draft.num_layers=3",), "draft.num_layers 2 -> 3", "-o DIR"),
        (("train.lr=0.01", "train.seed=3"), "train.lr 0.003 -> 0.01, train.seed 0 -> 3", "-o DIR"),  # tiny's lr 3e-3
    ],
)
def test_a_rerun_with_other_settings_is_refused_and_records_nothing(work, change, named, fix):
    """Case 5: exited 0 with the old result and rewrote recipe.yaml + the manifest (or a traceback)."""
    before = _recorded(work)
    err = _one_line_error(_train(work, *change), code=2)
    assert named in err and fix in err
    assert _recorded(work) == before


def test_settings_that_do_not_shape_the_result_may_change_and_the_hint_works(work):
    out = _train(work, "train.log_every=1", "train.checkpoint_every=3")
    assert out.returncode == 0, out.stderr[-3000:]
    # following the refusal's hint: a new directory trains with the new settings and records them
    out = _train(work, "train.max_steps=2", "-o", str(work / "other"))
    assert out.returncode == 0, out.stderr[-3000:]
    manifest = json.loads((work / "other" / "manifest.json").read_text())
    assert manifest["recipe"]["train"]["max_steps"] == 2 and manifest["summary"]["steps"] == 2
    assert "max_steps: 2" in (work / "other" / "recipe.yaml").read_text()


def _mount_tmpfs(directory: Path, size: str) -> bool:
    directory.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(directory)], capture_output=True, text=True
    )
    return done.returncode == 0


@pytest.mark.parametrize("what", ["checkpoint", "final"])
def test_a_full_disk_during_a_save_is_one_line_and_the_rerun_finishes(tmp_path, what):
    """Case 6: a full disk gave a CheckpointException traceback and left `.tmp-step-*`, which kept the
    disk full so every rerun failed. A real full disk: a small tmpfs (a checkpoint is 1.33 MB, final/
    0.37 MB), which needs root (mount); elsewhere the test is skipped (under CI: fails)."""
    work = tmp_path / "w"
    train_fixtures.make_target(work / "target")
    sequences = train_fixtures.make_sequences(work / "target", num=10)
    train_fixtures.write_capture(work, sequences, train_fixtures.cli_overrides(work))
    train_dir = tmp_path / "small"
    # "checkpoint": step 2's checkpoint fits, step 4's does not; "final": only step 5 is checkpointed
    size, extra = ("2m", ()) if what == "checkpoint" else ("1500k", ("train.checkpoint_every=100",))
    if not _mount_tmpfs(train_dir, size):
        missing("tmpfs", "mounting a tmpfs needs root")
    try:
        err = _one_line_error(_train(work, "-o", str(train_dir), *extra))
        failed = "saving checkpoint step-000004 failed" if what == "checkpoint" else "writing final/ failed"
        assert failed in err and "MiB free in" in err, err  # torch's writer says "unexpected pos", not ENOSPC
        assert not list((train_dir / "checkpoints").glob(".tmp-*")) and not list(train_dir.glob(".final.tmp-*"))
        latest = "step-000002" if what == "checkpoint" else "step-000005"
        assert (train_dir / "checkpoints" / "latest").read_text().strip() == latest
        # a run killed mid-save (kill -9) leaves a temp dir behind; the next run removes it
        subprocess.run(["mount", "-o", "remount,size=64m", str(train_dir)], check=True)
        stale = train_dir / "checkpoints" / ".tmp-step-000004"
        stale.mkdir(exist_ok=True)
        (stale / "__0_0.distcp").write_bytes(b"x" * 100_000)
        out = _train(work, "-o", str(train_dir), *extra)
        assert out.returncode == 0, out.stderr[-3000:]
        assert not stale.exists() and (train_dir / "final" / "model.safetensors").is_file()
        summary = json.loads((train_dir / "manifest.json").read_text())["summary"]
        assert summary["resumed_from"].endswith(latest) and summary["steps"] == 5
    finally:
        subprocess.run(["umount", str(train_dir)], capture_output=True)


def _resign_meta(ckpt: Path, **changes) -> None:
    from dspark_cli.artifacts.files import sha256_file

    meta = json.loads((ckpt / "meta.json").read_text())
    meta.update(changes)
    (ckpt / "meta.json").write_text(json.dumps(meta))
    sums = json.loads((ckpt / "checksums.json").read_text())
    sums["files"]["meta.json"] = {
        "bytes": (ckpt / "meta.json").stat().st_size,
        "sha256": sha256_file(ckpt / "meta.json"),
    }
    (ckpt / "checksums.json").write_text(json.dumps(sums))


def test_a_resigned_meta_claiming_step_1e12_is_not_trusted(work):
    """Checksums prove the files are as written; a re-signed meta.json is as written too."""
    ckpt = _ckpt(work)
    _resign_meta(ckpt, step=10**12)
    err = _one_line_error(_train(work))
    assert (
        f"{ckpt}: not a checkpoint dspark wrote: its meta.json claims step 1,000,000,000,000 but the "
        "checkpoint is step-000005" in err
    )
    renamed = ckpt.with_name(f"step-{10**12}")  # renamed to match, and `latest` pointed at it
    ckpt.rename(renamed)
    (renamed.parent / "latest").write_text(renamed.name + "\n")
    err = _one_line_error(_train(work))
    assert "claims step 1,000,000,000,000, past the run's 5 steps" in err


def _crashed_after_step_4(work: Path) -> Path:
    """The run as a crash after step 5's log line but before its checkpoint leaves it: `latest` is
    step-000004 (the finished output stays: a resume rewrites it). The metrics log is returned."""
    shutil.rmtree(_ckpt(work, 5))
    (_ckpt(work, 4).parent / "latest").write_text("step-000004\n")
    return work / "run" / "train" / "metrics.jsonl"


def test_a_metrics_log_a_crash_cut_short_resumes(work):
    """metrics.jsonl ending in NUL bytes (a power loss: the file grew, its last block never landed) after a
    torn line made `dspark train --resume auto` an internal error; now that end is dropped with a warning,
    the file is cut back to its last good line, and the resumed run's lines follow it."""
    metrics = _crashed_after_step_4(work)
    whole = metrics.read_bytes().splitlines(keepends=True)
    good = [line for line in whole if json.loads(line)["step"] <= 4]
    metrics.write_bytes(b"".join(good) + b'{"step": 5, "loss": 2.' + b"\x00" * 4096)
    out = _train(work)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "internal error" not in out.stderr and "4,096 trailing NUL bytes" in out.stderr, out.stderr[-3000:]
    lines = metrics.read_bytes().splitlines(keepends=True)
    assert lines[: len(good)] == good and b"\x00" not in metrics.read_bytes()
    assert [json.loads(line)["step"] for line in lines] == [json.loads(line)["step"] for line in whole]


def test_a_metrics_log_damaged_in_the_middle_is_one_line(work):
    metrics = _crashed_after_step_4(work)
    lines = metrics.read_bytes().splitlines(keepends=True)
    metrics.write_bytes(b"".join([lines[0], b"\x00" * 40 + b"\n", *lines[1:]]))
    err = _one_line_error(_train(work))
    assert f"{metrics}:2: damaged line" in err and "delete that line" in err
    assert not _ckpt(work, 5).exists()  # refused before any step
