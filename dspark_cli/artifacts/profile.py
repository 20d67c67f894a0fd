"""The acceptance profile, `speculation_profile.json`, as a file: which draft it describes, the reader, the
lookup for a draft's weights, and export's copy of it into a draft directory.

    doc = read_profile("runs/tiny/bench/speculation_profile.json")      # checked format and version
    found = find_profile("runs/tiny/draft", "runs/tiny/bench")    # (document, path) for these weights, or None
    place_profile(recipe, "runs/tiny/draft")                      # export: the bench's profile, when it matches

`dspark bench` writes it beside bench.json (bench/profile.py builds it and models a recommendation from
it); export copies it into a draft directory, serve and publish read it. A profile describes one draft by
the sha256 of its model.safetensors (as its manifest records it) with its contract (architecture, block
size, target), and is used only for the weights it measured. A several-draft bench's file holds one
document per draft (`drafts`, as bench.json's). The format: docs/bench.md (the acceptance profile).
Import-light: no torch.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dspark_cli.errors import DataError

if TYPE_CHECKING:
    from dspark_cli.recipe.schema import Recipe

log = logging.getLogger(__name__)

PROFILE = "speculation_profile.json"
FORMAT = "dspark.speculation_profile"
VERSION = 1
CONVENTIONS = {
    "position": "0-based draft slot: position i is the token at anchor + i + 1",
    "marginal": "P(position i accepted) = accepted / steps (bench.json's acceptance_per_position)",
    "conditional": "P(position i accepted | position i - 1 accepted) = accepted / given (position 0: given = steps)",
    "tau": "tokens per verification step, bonus included: 1 + sum of the marginal rates",
}


def draft_fingerprint(manifest: dict[str, Any], directory: str | Path, target: str | None = None) -> dict[str, Any]:
    """Which draft a profile describes, from the manifest its checks gave (a dspark export's, or a published
    draft's built in memory) and its directory: the digest of its tensors (what a profile is matched by), its
    weights' and config's sha256 as the manifest records them, architecture, block size and target."""
    files = manifest.get("files") or {}
    contract = manifest.get("contract") or {}
    return {
        "tensors_sha256": tensors_sha256(Path(directory) / "model.safetensors"),
        "weights_sha256": files.get("model.safetensors"),
        "config_sha256": files.get("config.json"),
        "architecture": manifest.get("architecture"),
        "block_size": contract.get("block_size") or (manifest.get("serving") or {}).get("num_speculative_tokens"),
        "target": contract.get("target") or target,
        "published": bool(manifest.get("published")),
    }


def tensors_sha256(weights: str | Path) -> str | None:
    """The sha256 of a safetensors file's tensors: each tensor's name, dtype, shape and bytes, in name order.
    Not the file's sha256: the header's metadata is written in no fixed order, so exporting the same
    tensors twice gives two files. None for a file that is missing or not safetensors."""
    import hashlib
    import json
    import struct

    digest = hashlib.sha256()
    try:
        with open(weights, "rb") as handle:
            (size,) = struct.unpack("<Q", handle.read(8))
            if size > 100_000_000:
                return None
            header = json.loads(handle.read(size))
            for name in sorted(k for k in header if k != "__metadata__"):
                info = header[name]
                start, end = info["data_offsets"]
                digest.update(json.dumps([name, info["dtype"], info["shape"]]).encode())
                handle.seek(8 + size + start)
                remaining = end - start
                while remaining > 0:
                    chunk = handle.read(min(1 << 20, remaining))
                    if not chunk:
                        return None
                    digest.update(chunk)
                    remaining -= len(chunk)
    except (OSError, ValueError, KeyError, TypeError, struct.error):
        return None
    return digest.hexdigest()


def documents(data: Any) -> list[dict[str, Any]]:
    """The single-draft documents of a profile file: itself, or its `drafts` (a several-draft bench)."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        return []
    if isinstance(data.get("drafts"), list):
        return [d for d in data["drafts"] if isinstance(d, dict) and d.get("format") == FORMAT]
    return [data]


def read_profile(path: str | Path) -> dict[str, Any]:
    """A profile file, checked for its format and version; one-line DataError when it is not one."""
    from dspark_cli.recipe.bounded import read_json

    path = Path(path)
    try:
        data = read_json(path)
    except (OSError, ValueError) as exc:
        raise DataError(f"{path}: unreadable ({exc})", "run `dspark bench DRAFT --offline` again") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise DataError(f"{path} is not a dspark acceptance profile", f"it needs format {FORMAT!r}")
    if data.get("version") != VERSION:
        raise DataError(
            f"{path}: profile version {data.get('version')!r}; this dspark reads version {VERSION}",
            "run `dspark bench DRAFT --offline` with this dspark",
        )
    return data


def matching(path: str | Path, tensors: str | None) -> dict[str, Any] | None:
    """The document in the profile file `path` that measured the tensors whose digest is `tensors`
    (`tensors_sha256`); None when none did (or there is no such file, or it is not a profile: logged)."""
    path = Path(path)
    if tensors is None or path.is_symlink() or not path.is_file():
        return None
    try:
        data = read_profile(path)
    except DataError as exc:
        log.warning("%s", exc.message)
        return None
    return next((d for d in documents(data) if (d.get("draft") or {}).get("tensors_sha256") == tensors), None)


def find_profile(draft_dir: str | Path, bench_dir: str | Path | None = None) -> tuple[dict[str, Any], Path] | None:
    """(document, file) of the profile for the weights now in `draft_dir`: its own speculation_profile.json,
    else the one in `bench_dir` (the recipe's bench report); None when neither measured these weights."""
    digest = tensors_sha256(Path(draft_dir) / "model.safetensors")
    for place in [Path(draft_dir), *([Path(bench_dir)] if bench_dir is not None else [])]:
        found = matching(place / PROFILE, digest)
        if found is not None:
            return found, place / PROFILE
        if (place / PROFILE).is_file():
            log.warning("%s measured other weights than %s's: not used", place / PROFILE, draft_dir)
    return None


def place_profile(recipe: Recipe | None, draft_dir: str | Path) -> Path | None:
    """Export's step after writing `draft_dir`: copy the recipe's bench profile into it when that profile measured
    these very tensors (a re-export after bench); the file it wrote, or None. It stays out of the manifest's
    checksums: its fingerprint ties it to model.safetensors' tensors, which the manifest checksums (a profile of
    other weights is never used). A published draft's directory (no dspark_manifest.json) is never written into."""
    from dspark_cli.artifacts.draft import DRAFT_MANIFEST
    from dspark_cli.artifacts.files import write_json_atomic

    draft_dir = Path(draft_dir)
    if recipe is None or not (draft_dir / DRAFT_MANIFEST).is_file():
        return None
    found = matching(
        Path(recipe.stage_dir("bench")).expanduser() / PROFILE, tensors_sha256(draft_dir / "model.safetensors")
    )
    if found is None:
        return None
    write_json_atomic(draft_dir / PROFILE, found)
    log.info("export: the acceptance profile of these weights copied into %s", draft_dir / PROFILE)
    return draft_dir / PROFILE
