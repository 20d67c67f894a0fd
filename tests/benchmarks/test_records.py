"""Records in benchmarks/results/ cannot go stale: each names the commit it was made at, and its sources
(benchmarks/records.py) have not changed since (by content: benchmarks/provenance.py); and the checker itself,
on a repository made here."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import provenance  # noqa: E402  benchmarks/provenance.py
import records  # noqa: E402  benchmarks/records.py


def test_every_file_in_results_is_a_record_or_notes() -> None:
    assert provenance.unlisted_files(provenance.RESULTS, records.RECORDS) == []


def test_every_record_names_a_committed_script() -> None:
    ls_files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    tracked = set(ls_files.splitlines())  # whole paths: a substring of another path is not a committed script
    missing = [f"{name}: {entry.script}" for name, entry in records.RECORDS.items() if entry.script not in tracked]
    assert missing == []


@pytest.mark.parametrize("name", sorted(records.RECORDS))
def test_record_is_fresh(name: str) -> None:
    assert provenance.check([name]) == []


# --- the checker, on a repository of its own ---


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True)
    return done.stdout.strip()


def _commit(repo: Path, message: str) -> str:
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", message)
    return _git(repo, "rev-parse", "HEAD")


def _record(results: Path, commit: str | None) -> None:
    results.mkdir(exist_ok=True)
    prov = {"commit": commit, "command": "python bench.py", "cpu_model": "cpu", "cores": 2, "load": {"before": 0.1}}
    data = {"tokens_per_s": 1.0} if commit is None else {"provenance": prov, "tokens_per_s": 1.0}
    (results / "speed.json").write_text(json.dumps(data))


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    _git(tmp_path, "init", "-q")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "loop.py").write_text('"""The loop."""\n\ndef step(x):\n    return x + 1\n')
    (tmp_path / "pkg" / "data.txt").write_text("a\n")
    (tmp_path / "other.py").write_text("X = 1\n")
    return tmp_path


def _problems(repo: Path) -> list[str]:
    return provenance.record_problems(repo, repo / "results", "speed", ["pkg/"], "python bench.py")


def test_a_change_to_a_dependency_makes_the_record_stale(repo: Path) -> None:
    _record(repo / "results", _commit(repo, "A"))
    assert _problems(repo) == []
    (repo / "other.py").write_text("X = 2\n")  # not a dependency
    _commit(repo, "B: elsewhere")
    assert _problems(repo) == []
    (repo / "pkg" / "loop.py").write_text('"""The loop."""\n\ndef step(x):\n    return x + 2\n')
    _commit(repo, "C: the loop")
    problems = _problems(repo)
    assert len(problems) == 1 and "stale" in problems[0] and "pkg/loop.py" in problems[0], problems


def test_an_excluded_path_under_a_dependency_keeps_the_record_fresh(repo: Path) -> None:
    _record(repo / "results", _commit(repo, "A"))
    depends = ["pkg/", ":(exclude)pkg/data.txt"]
    (repo / "pkg" / "data.txt").write_text("b\n")
    _commit(repo, "B: the excluded file")
    assert provenance.record_problems(repo, repo / "results", "speed", depends) == []
    (repo / "pkg" / "loop.py").write_text('"""The loop."""\n\ndef step(x):\n    return x + 2\n')
    assert "pkg/loop.py" in "".join(provenance.record_problems(repo, repo / "results", "speed", depends))


def test_no_record_runs_the_mooncake_client_that_records_exclude() -> None:
    """records.MOONCAKE_ONLY holds while no record opens a mooncake:// stream (no script, command or the
    tiny recipe names one) and the modules outside it import it inside functions only, never on load."""
    tiny = (ROOT / records.TINY).read_text()
    for name, entry in records.RECORDS.items():
        for text in (entry.command, (ROOT / entry.script).read_text(), tiny):
            assert "mooncake" not in text.lower(), name
    excluded = {p.removeprefix(":(exclude)") for p in records.MOONCAKE_ONLY}
    modules = {p.removesuffix(".py").replace("/", ".") for p in excluded}
    on_load = []
    for path in (ROOT / "dspark_cli").rglob("*.py"):
        if path.relative_to(ROOT).as_posix() in excluded:
            continue
        for node in ast.parse(path.read_text()).body:  # module level: what importing the module runs
            names = [node.module] if isinstance(node, ast.ImportFrom) else []
            names += [a.name for a in node.names] if isinstance(node, ast.Import) else []
            on_load += [f"{path.relative_to(ROOT)}: {n}" for n in names if n in modules]
    assert on_load == []


def test_an_uncommitted_change_and_a_non_python_file_count_by_bytes(repo: Path) -> None:
    _record(repo / "results", _commit(repo, "A"))
    (repo / "pkg" / "data.txt").write_text("a \n")
    assert "pkg/data.txt" in "".join(_problems(repo))


def test_formatting_and_comments_keep_the_record_fresh(repo: Path) -> None:
    _record(repo / "results", _commit(repo, "A"))
    (repo / "pkg" / "loop.py").write_text(
        "'''The loop.'''\n\n\n# why: nothing\ndef step( x ):\n    return (x\n            + 1)  # one\n"
    )
    _commit(repo, "B: format")
    assert _problems(repo) == []


def test_a_changed_docstring_a_deleted_or_an_added_file_makes_it_stale(repo: Path) -> None:
    _record(repo / "results", _commit(repo, "A"))
    (repo / "pkg" / "loop.py").write_text('"""The loop, changed."""\n\ndef step(x):\n    return x + 1\n')
    assert "pkg/loop.py" in "".join(_problems(repo))
    _git(repo, "mv", "pkg/loop.py", "pkg/steps.py")  # a rename: the old path is gone
    _commit(repo, "B: renamed")
    assert "pkg/loop.py" in "".join(_problems(repo)) and "pkg/steps.py" in "".join(_problems(repo))


def test_a_record_without_provenance_or_with_an_unknown_commit_fails_in_one_line(repo: Path) -> None:
    _commit(repo, "A")
    _record(repo / "results", None)
    assert _problems(repo) == ["speed: no provenance (commit, command, CPU, load) (rerun: python bench.py)"]
    _record(repo / "results", "0123456789abcdef0123456789abcdef01234567")
    (problem,) = _problems(repo)
    assert "0123456789" in problem and "does not have" in problem


def test_the_writer_refuses_dirty_sources_and_marks_an_allowed_run(repo: Path, monkeypatch) -> None:
    _commit(repo, "A")
    monkeypatch.setitem(records.RECORDS, "speed", records.Record("bench.py", "python bench.py", ("pkg/",)))
    monkeypatch.setattr(provenance, "RESULTS", repo / "results")
    (repo / "pkg" / "loop.py").write_text("def step(x):\n    return x\n")
    with pytest.raises(SystemExit, match="differ from HEAD"):
        provenance.Recording("speed", root=repo, out_dir=repo / "results")
    rec = provenance.Recording("speed", root=repo, out_dir=repo / "results", allow_dirty=True, every=0.05)
    written = rec.write({"tokens_per_s": 2.0}, lambda r: f"# speed\n\n{r['tokens_per_s']} tokens/s\n")
    prov = written["provenance"]
    assert prov["dirty"] and prov["dirty_paths"] == ["pkg/loop.py"] and prov["load"]["samples"] >= 1
    assert json.loads((repo / "results" / "speed.json").read_text())["provenance"]["commit"] == _git(
        repo, "rev-parse", "HEAD"
    )
    md = (repo / "results" / "speed.md").read_text().splitlines()
    assert md[0 if not prov["loaded"] else 2] == "# speed" and "(dirty: pkg/loop.py)" in md[-1]
    assert md[0].startswith("**Loaded machine**") == prov["loaded"]
    assert any("made from uncommitted sources" in p for p in _problems(repo))


def test_a_loaded_run_says_so_in_the_first_line(tmp_path: Path) -> None:
    prov = {
        "commit": "abc",
        "dirty": False,
        "dirty_paths": [],
        "command": "python bench.py",
        "started": "now",
        "wall_s": 1.0,
        "cpu_model": "cpu",
        "cores": 2,
        "python": "3",
        "load": {"before": 3, "after": 3, "during_mean": 3.2, "during_max": 4, "samples": 2, "own_cores": 1.0},
        "loaded": True,
    }
    provenance.write_record(tmp_path, "speed", {"provenance": prov}, "# speed\n")
    assert (tmp_path / "speed.md").read_text().startswith("**Loaded machine**: the 1-minute load averaged 3.2")
