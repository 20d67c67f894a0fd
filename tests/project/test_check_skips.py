"""CI cannot pass by skipping: scripts/check_skips.py against a run's skips, and `require` under CI=true.

.venv/bin/python -m pytest tests/project/test_check_skips.py -q
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import requirements_support

ROOT = Path(__file__).resolve().parents[2]
CHECKER = ROOT / "scripts" / "check_skips.py"


def check(tmp_path: Path, skips: list[tuple[str, str]], allowed: str) -> subprocess.CompletedProcess:
    record, allow = tmp_path / "skips.jsonl", tmp_path / "allowed.txt"
    record.write_text("".join(json.dumps({"nodeid": n, "reason": r}) + "\n" for n, r in skips))
    allow.write_text(allowed)
    return subprocess.run(
        [sys.executable, str(CHECKER), str(record), "--allowed", str(allow)], capture_output=True, text=True
    )


ALLOWED = """# comment
tests/benchmarks/test_peers.py::test_specforge_* | no SpecForge venv
tests/serving/test_serve.py::test_too_old[a-b] | GPU only
"""


def test_an_unlisted_skip_fails_the_check_with_its_line(tmp_path):
    done = check(
        tmp_path,
        [
            ("tests/benchmarks/test_peers.py::test_specforge_draft", "no SpecForge venv"),
            ("tests/capture/test_mooncake_store.py::test_put", "mooncake is not\ninstalled"),
        ],
        ALLOWED,
    )
    assert done.returncode == 1, done
    lines = done.stderr.splitlines()
    assert lines[0] == "unlisted skip: tests/capture/test_mooncake_store.py::test_put: mooncake is not installed"
    assert len(lines) == 2 and "1 of 2 skips are not in" in lines[1], lines
    assert "test_specforge" not in done.stderr


def test_listed_skips_pass_and_entries_that_did_not_run_are_fine(tmp_path):
    done = check(tmp_path, [("tests/serving/test_serve.py::test_too_old[a-b]", "GPU only")], ALLOWED)
    assert done.returncode == 0 and done.stdout.startswith("check_skips: 1 skips"), done
    assert check(tmp_path, [], ALLOWED).returncode == 0
    # brackets are literal, `*` is the only wildcard
    assert check(tmp_path, [("tests/serving/test_serve.py::test_too_olda", "GPU only")], ALLOWED).returncode == 1


def test_a_listed_test_skipping_for_another_reason_is_unlisted(tmp_path):
    """The entry names the reason too: vLLM serving DSpark here one day must not pass as the GPU-only skip."""
    serve = "tests/serving/test_serve.py::test_too_old[a-b]"
    assert check(tmp_path, [(serve, "on a machine without a\nGPU only")], ALLOWED).returncode == 0
    done = check(tmp_path, [(serve, "vLLM 0.34 serves DSpark")], ALLOWED)
    assert done.returncode == 1 and f"unlisted skip: {serve}: vLLM 0.34 serves DSpark" in done.stderr, done


def test_an_entry_without_its_reason_is_refused(tmp_path):
    done = check(tmp_path, [], "tests/x.py::test_y\n")
    assert done.returncode == 2 and "allowed.txt:1: expected" in done.stderr, done


def test_the_repository_allow_list_names_tests_that_exist():
    sys.path.insert(0, str(CHECKER.parent))
    import check_skips

    entries = check_skips.read_allowed(check_skips.ALLOWED)
    assert entries, "tests/skips_allowed.txt lists nothing"
    for entry in entries:
        path, _, name = entry.pattern.partition("::")
        assert (ROOT / path).is_file(), entry
        assert f"def {name.rstrip('*')}" in (ROOT / path).read_text(), entry


@pytest.mark.parametrize(
    "value,expected", [("true", True), ("TRUE", True), ("1", True), ("", False), ("false", False), ("0", False)]
)
def test_ci_is_true_or_1(monkeypatch, value, expected):
    monkeypatch.setenv("CI", value)
    assert requirements_support.ci() is expected


NEEDS_IT = """
import requirements_support
from requirements_support import require, require_module, requires

requirements_support.LOOKUPS["mooncake"] = lambda: "mooncake is hidden for this test"
requirements_support.LOOKUPS["gcc"] = lambda: None


def test_in_the_body():
    require("mooncake")


@requires("mooncake")
def test_marked():
    pass


def test_a_part_that_does_not_import():
    require_module("gcc_is_here_but_not_this", "gcc", "the part is hidden for this test")
"""
AT_IMPORT = """
from requirements_support import missing

missing("vllm", "vllm is hidden for this test")


def test_never_collected():
    pass
"""


def run_tiny_suite(tmp_path: Path, ci: str | None) -> tuple[subprocess.CompletedProcess, list[dict]]:
    """A pytest of its own on two generated test files, with the plugin as tests/conftest.py loads it."""
    suite = tmp_path / f"suite-{ci}"
    suite.mkdir()
    (suite / "pytest.ini").write_text("[pytest]\n")
    (suite / "test_needs_it.py").write_text(NEEDS_IT)
    (suite / "test_at_import.py").write_text(AT_IMPORT)
    env = {k: v for k, v in os.environ.items() if k != "CI"} | {"PYTHONPATH": str(ROOT / "tests")}
    if ci is not None:
        env["CI"] = ci
    record = suite / "skips.jsonl"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "requirements_support", "-p", "no:cacheprovider", "-q", "-rA"]
        + ["--continue-on-collection-errors", f"--record-skips={record}", "test_needs_it.py", "test_at_import.py"],
        cwd=suite,
        env=env,
        capture_output=True,
        text=True,
    )
    return done, [json.loads(line) for line in record.read_text().splitlines()]


def test_a_missing_component_skips_here_and_fails_under_ci(tmp_path):
    done, skips = run_tiny_suite(tmp_path, None)
    assert done.returncode == 0 and "4 skipped" in done.stdout, done.stdout
    assert {s["nodeid"]: s["reason"] for s in skips} == {
        "test_needs_it.py::test_in_the_body": "mooncake is hidden for this test",
        "test_needs_it.py::test_marked": "mooncake is hidden for this test",
        "test_needs_it.py::test_a_part_that_does_not_import": (
            "the part is hidden for this test (gcc_is_here_but_not_this does not import: "
            "No module named 'gcc_is_here_but_not_this')"
        ),
        "test_at_import.py": "vllm is hidden for this test",
    }, skips

    done, skips = run_tiny_suite(tmp_path, "true")
    assert done.returncode == 1 and skips == [], done.stdout
    # in the body: failed; as a mark: an error at set-up; at import: a collection error (which stops a run
    # without --continue-on-collection-errors)
    assert "2 failed" in done.stdout and "2 errors" in done.stdout, done.stdout
    hint = "CI must have it: see scripts/dev.sh"
    assert f"FAILED test_needs_it.py::test_in_the_body - Failed: mooncake is hidden for this test; {hint}" in (
        done.stdout
    )
    assert f"ERROR test_needs_it.py::test_marked - Failed: mooncake is hidden for this test; {hint}" in done.stdout
    assert f"vllm is hidden for this test; {hint}" in done.stdout


# --- scripts/dev.sh test, on a stand-in venv: what it does with the Mooncake install, pytest's status, the check
FAKE_PYTHON = """#!/usr/bin/env bash
echo "python $*" >> "$FAKE_LOG"
case "$*" in
    *"import mooncake.store"*) exit 1 ;;
    *"-m pytest"*)
        for arg; do case "$arg" in --record-skips=*) printf '%s' "$FAKE_SKIPS" > "${arg#--record-skips=}" ;; esac; done
        exit "$FAKE_PYTEST_STATUS" ;;
    *check_skips.py*) exec REAL_PYTHON "$@" ;;
esac
"""


def dev_test(tmp_path: Path, *, ci: str | None, pytest_status: int = 0, skips: str = "") -> subprocess.CompletedProcess:
    """`bash scripts/dev.sh test` with DSPARK_VENV a stand-in: its python fails `import mooncake.store` and
    stands in for pytest, its pip fails, and ldconfig says libibverbs is here (no apt-get)."""
    venv, bin_dir = tmp_path / "venv", tmp_path / "venv" / "bin"
    if not venv.exists():
        bin_dir.mkdir(parents=True)
        (bin_dir / "python").write_text(FAKE_PYTHON.replace("REAL_PYTHON", sys.executable))
        for name, body in [("pip", "exit 1"), ("ruff", "exit 0"), ("mkdocs", "exit 0"), ("dspark", "exit 0")]:
            (bin_dir / name).write_text(f'#!/usr/bin/env bash\necho "{name} $*" >> "$FAKE_LOG"\n{body}\n')
        (tmp_path / "ldconfig").write_text(
            "#!/bin/sh\necho '\tlibibverbs.so.1 (libc6,x86-64) => /lib/libibverbs.so.1'\n"
        )
        for tool in [*bin_dir.iterdir(), tmp_path / "ldconfig"]:
            tool.chmod(0o755)
    digest = subprocess.run(["sha256sum", "pyproject.toml"], cwd=ROOT, capture_output=True, text=True, check=True)
    (venv / ".dspark-installed").write_text(digest.stdout.split()[0] + "\n")  # ensure_venv: nothing to do
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env |= {"DSPARK_VENV": str(venv), "PATH": f"{tmp_path}:{env['PATH']}", "FAKE_LOG": str(tmp_path / "log")}
    env |= {"FAKE_PYTEST_STATUS": str(pytest_status), "FAKE_SKIPS": skips}
    if ci is not None:
        env["CI"] = ci
    (tmp_path / "log").write_text("")
    return subprocess.run(["bash", str(ROOT / "scripts" / "dev.sh"), "test"], env=env, capture_output=True, text=True)


def ran(tmp_path: Path, tool: str) -> list[str]:
    return [line for line in (tmp_path / "log").read_text().splitlines() if line.startswith(tool)]


def test_under_ci_a_failed_mooncake_install_stops_the_set_up(tmp_path):
    done = dev_test(tmp_path, ci="TRUE")
    assert done.returncode == 1, done
    assert done.stderr.strip().splitlines()[-1] == (
        "dspark: pip install -e '.[mooncake]' failed; CI=TRUE needs the Mooncake client: stopping"
    )
    assert not ran(tmp_path, "ruff") and not [c for c in ran(tmp_path, "python") if "pytest" in c]


def test_outside_ci_a_failed_mooncake_install_warns_and_is_tried_again(tmp_path):
    for run in (1, 2):
        done = dev_test(tmp_path, ci=None)
        assert done.returncode == 0, done
        assert "dspark: pip install -e '.[mooncake]' failed; the Mooncake tests will skip" in done.stderr
        assert len(ran(tmp_path, "pip install")) == 1 and ran(tmp_path, "mkdocs build"), run  # not stamped


def test_the_test_command_keeps_pytests_status_and_fails_on_an_unlisted_skip(tmp_path):
    unlisted = json.dumps({"nodeid": "tests/capture/test_x.py::test_y", "reason": "no tmpfs"}) + "\n"
    listed = json.dumps(
        {
            "nodeid": "tests/serving/test_serve.py::test_too_old_vllm_for_the_method",
            "reason": "--method dspark stops at the GPU check first here",
        }
    )
    done = dev_test(tmp_path, ci=None, pytest_status=3, skips=unlisted)
    assert done.returncode == 3 and not ran(tmp_path, "mkdocs"), done  # pytest's own status
    assert "unlisted skip: tests/capture/test_x.py::test_y: no tmpfs" in done.stderr  # named all the same
    done = dev_test(tmp_path, ci=None, skips=unlisted + listed + "\n")
    assert done.returncode == 1 and not ran(tmp_path, "mkdocs"), done
    assert "unlisted skip: tests/capture/test_x.py::test_y: no tmpfs" in done.stderr
    assert "test_too_old_vllm_for_the_method" not in done.stderr
    done = dev_test(tmp_path, ci=None, skips=listed + "\n")
    assert done.returncode == 0 and ran(tmp_path, "mkdocs build"), done
    assert "check_skips: 1 skips, all in tests/skips_allowed.txt" in done.stdout
