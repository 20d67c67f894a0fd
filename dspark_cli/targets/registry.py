"""Target names -> directories: the bundled tiny targets by name, local model dirs as they are.

    python -c "from dspark_cli.targets import resolve_target; print(resolve_target('tiny-mla'))"

Import-light on purpose (no torch / transformers): the CLI resolves targets while validating a recipe.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path

from dspark_cli.errors import UsageError
from dspark_cli.targets.files import check_target_files

TINY_DIR = Path(__file__).resolve().parent / "tiny"
BUNDLED_TARGETS: dict[str, Path] = {"tiny-mla": TINY_DIR / "tiny-mla", "tiny-gqa": TINY_DIR / "tiny-gqa"}

# owner/name as the Hugging Face Hub spells repo ids (e.g. "Qwen/Qwen3-8B", "moonshotai/Kimi-K3").
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")


def is_hub_id(name: str) -> bool:
    return bool(_HUB_ID.match(name)) and ".." not in name


def resolve_target(name_or_path: str) -> Path | None:
    """Where a target lives.

    - a bundled name ("tiny-mla", "tiny-gqa") -> its shipped directory (checked to contain config.json);
    - an existing local directory -> that directory (resolved to an absolute path);
    - either way, its config.json and safetensors headers are checked first (`files.check_target_files`):
      no config.json is a UsageError, a corrupt one or truncated weights a DataError naming the file;
    - a Hugging Face repo id ("owner/name") that is not a local directory -> **None**: pass the id on as-is,
      and let the stage that loads the model find it in the hub cache (or download it where allowed);
    - anything else -> `UsageError` with a one-line message and a hint (did-you-mean for near bundled names).
    """
    if name_or_path in BUNDLED_TARGETS:
        path = BUNDLED_TARGETS[name_or_path]
        if not (path / "config.json").is_file():
            raise UsageError(
                f"bundled target {name_or_path!r} is missing its files at {path}",
                "reinstall dspark, or rebuild it in a source checkout: "
                "python -m tools.tiny_targets.build_tiny --out " + str(TINY_DIR),
            )
        check_target_files(path)
        return path
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        check_target_files(path)
        return path.resolve()
    if path.exists():
        raise UsageError(
            f"target {name_or_path!r} is a file, not a model directory", "pass the directory that holds config.json"
        )
    if is_hub_id(name_or_path):
        return None
    near = difflib.get_close_matches(name_or_path, list(BUNDLED_TARGETS), n=1, cutoff=0.6)
    hint = (
        f"did you mean {near[0]!r}?"
        if near
        else f"use a bundled target ({', '.join(BUNDLED_TARGETS)}), a local model directory or a hub id like Qwen/Qwen3-8B"
    )
    raise UsageError(f"unknown target {name_or_path!r}: not a bundled name, a directory or a hub repo id", hint)
