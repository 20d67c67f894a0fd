"""The type check's baseline only shrinks: scripts/check_types.py against canned mypy output (no mypy run).

.venv/bin/python -m pytest tests/project/test_types_baseline.py -q
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("check_types", ROOT / "scripts" / "check_types.py")
check_types = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check_types)

KNOWN = """\
dspark_cli/a.py:10: error: Item "None" of "Machine | None" has no attribute "gpus"  [union-attr]
dspark_cli/a.py:12: note: See https://mypy.rtfd.io/en/stable/_refs.html#code-union-attr
dspark_cli/b.py:3:5: error: Name "x" already defined on line 1  [no-redef]
Found 2 errors in 2 files (checked 2 source files)
"""
KNOWN_ENTRIES = [
    'dspark_cli/a.py: union-attr: Item "None" of "Machine | None" has no attribute "gpus"',
    'dspark_cli/b.py: no-redef: Name "x" already defined on line N',
]
NEW = 'dspark_cli/c.py:7: error: Incompatible return value type (got "int | None", expected "int")  [return-value]\n'


def run(tmp_path: Path, output: str, *args: str, status: int | None = None) -> int:
    if status is None:
        status = 1 if "error:" in output else 0
    return check_types.main([*args, "--baseline", str(tmp_path / "baseline.txt")], mypy_result=(status, output))


def baseline(tmp_path: Path, entries: list[str] | None = None) -> Path:
    path = tmp_path / "baseline.txt"
    if entries is not None:
        path.write_text(check_types.HEADER + "".join(f"{e}\n" for e in entries))
    return path


def test_findings_are_normalised_without_line_numbers():
    assert check_types.normalise(KNOWN) == KNOWN_ENTRIES
    moved = KNOWN.replace(":10:", ":99:").replace(":3:5:", ":40:1:").replace("line 1 ", "line 7 ")
    assert check_types.normalise(moved) == KNOWN_ENTRIES


def test_the_same_findings_pass(tmp_path, capsys):
    baseline(tmp_path, KNOWN_ENTRIES)
    assert run(tmp_path, KNOWN.replace(":10:", ":11:")) == 0
    assert "2 known mypy findings, none new" in capsys.readouterr().out


def test_a_new_error_fails_with_its_line_and_the_command_to_see_it(tmp_path, capsys):
    baseline(tmp_path, KNOWN_ENTRIES)
    assert run(tmp_path, KNOWN + NEW) == 1
    err = capsys.readouterr().err.splitlines()
    assert err == [
        'new type error: dspark_cli/c.py: return-value: Incompatible return value type (got "int | None", '
        'expected "int")  (see it: ' + check_types._shown_python() + " -m mypy dspark_cli/c.py)"
    ]


def test_a_second_copy_of_a_known_error_is_new(tmp_path, capsys):
    baseline(tmp_path, KNOWN_ENTRIES)
    again = KNOWN.splitlines()[0].replace(":10:", ":30:") + "\n"
    assert run(tmp_path, KNOWN + again) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("new type error: " + KNOWN_ENTRIES[0])


def test_a_fixed_error_fails_until_the_baseline_shrinks(tmp_path, capsys):
    path = baseline(tmp_path, KNOWN_ENTRIES)
    fixed = "".join(line + "\n" for line in KNOWN.splitlines() if "a.py" not in line)
    assert run(tmp_path, fixed) == 1
    err = capsys.readouterr().err
    assert f"no longer occurs, remove it from {path}: {KNOWN_ENTRIES[0]}" in err
    assert "scripts/check_types.py --update" in err

    assert run(tmp_path, fixed, "--update") == 0
    assert check_types.read_baseline(path) == KNOWN_ENTRIES[1:]
    assert run(tmp_path, fixed) == 0


def test_update_never_adds(tmp_path, capsys):
    path = baseline(tmp_path, KNOWN_ENTRIES)
    output = KNOWN.replace("dspark_cli/b.py:3:5:", "dspark_cli/gone.py:3:5:") + NEW  # b.py fixed, gone.py and c.py new
    assert run(tmp_path, output, "--update") == 1
    assert check_types.read_baseline(path) == KNOWN_ENTRIES[:1]
    err = capsys.readouterr().err
    assert err.count("new type error: ") == 2 and "dspark_cli/c.py" in err and "dspark_cli/gone.py" in err

    empty = tmp_path / "empty"
    empty.mkdir()
    assert run(empty, NEW, "--update") == 1
    assert check_types.read_baseline(empty / "baseline.txt") == []


def test_update_allow_new_regenerates_the_baseline_sorted(tmp_path):
    path = baseline(tmp_path, ["dspark_cli/old.py: misc: gone"])
    assert run(tmp_path, NEW + KNOWN, "--update", "--allow-new") == 0
    assert check_types.read_baseline(path) == sorted([*KNOWN_ENTRIES, check_types.normalise(NEW)[0]])
    assert path.read_text().startswith("#")
    assert run(tmp_path, KNOWN + NEW) == 0


def test_allow_new_needs_update(tmp_path):
    with pytest.raises(SystemExit):
        run(tmp_path, KNOWN, "--allow-new")


@pytest.mark.parametrize(
    ("status", "output"),
    [(2, "pyproject.toml: [mypy]: error: bad config\n"), (1, "/x/python: No module named mypy\n")],
)
def test_mypy_not_running_fails(tmp_path, capsys, status, output):
    baseline(tmp_path, KNOWN_ENTRIES)
    assert run(tmp_path, output, status=status) == 1
    assert "mypy could not run" in capsys.readouterr().err


def test_the_committed_baseline_is_sorted_and_normalised():
    entries = check_types.read_baseline(check_types.BASELINE)
    assert entries == sorted(entries)
    for entry in entries:
        assert re.fullmatch(r"dspark_cli/[\w/]+\.py: [\w-]+: \S.*", entry), entry
        assert not re.search(r"\bon line \d", entry), entry
