"""Shared by the capture tests: one real datagen run per bundled tiny target per session, and recipes on it.

from capture_support import capture_recipe
recipe = capture_recipe("tiny-mla", tmp_path, "capture.batch_size=3")
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from dspark_cli.recipe import Recipe, load_recipe

_DATAGEN: dict[str, Path] = {}  # target -> finished datagen dir, made once per session
# hf capture unless a test asks for vllm: the independent reference, and no vLLM engine in the pytest process
DATAGEN_OVERRIDES = (
    "datagen.engine=hf",
    "capture.backend=hf",
    "datagen.sources=[{path: tiny-prompts, max_samples: 6}]",
    "datagen.max_tokens=24",
    "datagen.temperature=0.0",
    "datagen.batch_size=6",
    "datagen.shard_size=4",
)


def _recipe(target: str, root: Path, *overrides: str) -> Recipe:
    return load_recipe("tiny", [f"target.model={target}", f"output_dir={root}", *DATAGEN_OVERRIDES, *overrides])


def datagen_dir(target: str) -> Path:
    """A finished datagen output of 6 bundled prompts answered by `target` (greedy, 24 tokens)."""
    if target not in _DATAGEN:
        from dspark_cli.datagen.run import run_datagen

        root = Path(tempfile.mkdtemp(prefix=f"dspark-capture-{target}-"))
        run_datagen(_recipe(target, root))
        _DATAGEN[target] = root / "data"
    return _DATAGEN[target]


def capture_recipe(target: str, tmp_path: Path, *overrides: str) -> Recipe:
    """A recipe whose datagen output is the shared one (copied) and whose capture goes under tmp_path."""
    source = datagen_dir(target)
    if not (tmp_path / "run" / "data").exists():
        shutil.copytree(source, tmp_path / "run" / "data")
    return _recipe(target, tmp_path / "run", *overrides)


def start_producers(recipe_yaml: Path, stream_dir: Path) -> subprocess.Popen[str]:
    """The producers' supervisor (`python -m dspark_cli.capture.producers RECIPE STREAM`) as a process of its own,
    from the repository root, its output kept (text) for the test to show when it fails."""
    return subprocess.Popen(
        [sys.executable, "-m", "dspark_cli.capture.producers", str(recipe_yaml), str(stream_dir)],
        cwd=Path(__file__).resolve().parents[1],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
