"""A published DSpark draft: a directory someone else made (no `dspark_manifest.json`), read with trust kept.

    where = draft_source("Inferact/Kimi-K3-DSpark")             # dspark_cli.publish: a local dir, or a hub snapshot
    manifest = published_manifest(where, "kimi-k3")              # the checks, then the contract from config.json
    findings = published_findings(where, target_config)          # every finding (export --check lists them)

What counts as a published draft: a directory with `config.json` and one `model.safetensors` in either
format vLLM 0.33 loads (native `K3DSparkModel` / `Qwen3DSparkModel`, or the speculators format), made by
another tool (speculators, the Kimi-K3-DSpark release, another user's `dspark export` with its manifest
removed). Before any work, every check a dspark export gets that the files allow: vLLM's config rules,
the tensor roster vLLM allocates (names, shapes, dtypes: a config that lies about its geometry fails
here), the draft against the target it is used with (hidden size, vocabulary, layer ids within the
target's depth, mask token), plus the trust rules of a directory nobody here wrote:

- safetensors only: a pickle-format file (`.bin`, `.pt`, `.pth`, `.pkl`, `.ckpt`, ...) is refused, not
  ignored (a user could think it is what is loaded); sharded weights (`*.safetensors.index.json`) too;
- no code: `.py` and other executable or library files are refused (vLLM would not run them, and dspark
  never does; `trust_remote_code` is the target's setting only);
- no symbolic links, folders or other non-regular files in it (what is checked is what is read); a file
  no stage reads is passed over (`IGNORED`: a model card, a licence) or is a warning (anything else);
- `config.json` at most `MAX_CONFIG_BYTES`, nested at most 64 deep (`recipe.bounded.read_json`);
- nothing is taken from it beyond the draft: no environment, no destinations, no recipe, no serving
  settings (the recipe the user passes says how to serve and bench it), and nothing is written into it.

The manifest built here has the form of an export's (`kind: dspark.draft`, `contract`, `serving`) with
`published: true`, so bench and serve take one path for both; the contract (target layer ids, block
size, Markov rank, confidence head, mask token) is read from config.json as vLLM reads it. It is held
in memory only.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from dspark_cli.artifacts.draft import CONFIG, DRAFT_MANIFEST, WEIGHTS
from dspark_cli.errors import DataError, UsageError
from dspark_cli.export.rules import Finding

MAX_CONFIG_BYTES = 1 << 20  # a DSpark config.json is ~2 KB; Kimi-K3-DSpark's ~3 KB
# files that hold pickled Python objects: loading one can run code, so a draft that ships one is refused
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt", ".npy", ".npz", ".joblib")
CODE_SUFFIXES = (".py", ".pyc", ".pyo", ".so", ".dylib", ".dll", ".sh", ".exe", ".ipynb", ".pyx")
# read by no stage, harmless to have beside the draft (a model card, a licence, hub bookkeeping)
IGNORED = re.compile(
    r"^(README(\.md)?|LICEN[CS]E.*|NOTICE.*|\.gitattributes|generation_config\.json|"
    r"tokenizer(_config)?\.json|special_tokens_map\.json|.*\.(md|txt|png|jpg|jpeg|svg))$",
    re.IGNORECASE,
)


def is_published(draft_dir: str | Path) -> bool:
    """A draft directory dspark did not export: config.json + model.safetensors, no dspark_manifest.json."""
    directory = Path(draft_dir)
    return not (directory / DRAFT_MANIFEST).exists() and (directory / CONFIG).is_file()


def file_findings(directory: Path) -> list[Finding]:
    """The trust rules: what lies in the directory, before anything in it is read."""
    out = []
    try:
        entries = sorted(directory.iterdir())
    except OSError as exc:
        return [Finding(str(directory), f"unreadable ({exc.strerror or exc})", "check its permissions")]
    for entry in entries:
        name = entry.name
        if entry.is_symlink():
            out.append(
                Finding(
                    name, "is a symbolic link: a published draft is read only from its own files", "copy the file in"
                )
            )
        elif name.lower().endswith(PICKLE_SUFFIXES):
            out.append(
                Finding(
                    name,
                    "is a pickle-format file: loading one can run code, and dspark reads safetensors only",
                    "remove it (the draft's weights must be model.safetensors)",
                )
            )
        elif name.lower().endswith(CODE_SUFFIXES):
            out.append(
                Finding(
                    name,
                    "is code: dspark never runs code that comes with a draft",
                    "remove it (vLLM does not need the config.py speculators' save_pretrained writes)"
                    if name == "config.py"
                    else "remove it",
                )
            )
        elif name.endswith(".safetensors.index.json") or (
            name.endswith(".safetensors") and name != WEIGHTS and entry.is_file()
        ):
            out.append(
                Finding(
                    name,
                    f"sharded or extra weights: dspark reads one {WEIGHTS} (as the Kimi-K3-DSpark and "
                    "speculators drafts ship)",
                    f"merge the shards into one {WEIGHTS}",
                )
            )
        elif entry.is_dir():
            if name != ".cache":  # huggingface_hub's bookkeeping of a local_dir download
                out.append(Finding(name, "is a folder: a draft directory holds files only", "move it out"))
        elif not entry.is_file():
            out.append(Finding(name, "is not a regular file (a pipe, socket or device)", "remove it"))
        elif name not in (CONFIG, WEIGHTS) and not IGNORED.match(name):
            out.append(
                Finding(
                    name, "is read by neither dspark nor vLLM: left as it is", "remove it if it is not yours", "warning"
                )
            )
    for name in (CONFIG, WEIGHTS):
        path = directory / name
        if not path.is_symlink() and not path.is_file():
            out.append(
                Finding(
                    name, f"missing in {directory}", "pass a DSpark draft directory (config.json + model.safetensors)"
                )
            )
    config = directory / CONFIG
    if config.is_file() and not config.is_symlink() and config.stat().st_size > MAX_CONFIG_BYTES:
        out.append(
            Finding(
                CONFIG,
                f"{config.stat().st_size:,} bytes: larger than any draft config ({MAX_CONFIG_BYTES:,} at most)",
                "pass the draft's own config.json",
            )
        )
    return out


def published_findings(draft_dir: str | Path, target_config: dict[str, Any] | None) -> list[Finding]:
    """Every finding for a published draft used with the target whose config.json is `target_config`
    (None: the target's geometry is not checked): the trust rules first; when they pass, the rules an
    export gets (`check_draft_dir`: config, tensor roster, shapes, target)."""
    from dspark_cli.export.rules import check_draft_dir

    directory = Path(draft_dir)
    findings = file_findings(directory)
    if any(f.severity == "error" for f in findings):
        return findings  # nothing in a directory that breaks the trust rules is read
    return findings + [_for_published(f) for f in check_draft_dir(directory, target_config, include_embeddings=False)]


def _for_published(finding: Finding) -> Finding:
    """An export rule's finding, its fix said for a draft the user did not export (nothing to re-export)."""
    if finding.severity != "error" or "export" not in finding.fix:
        return finding
    return Finding(finding.key, finding.message, "the draft's publisher must fix it; use another draft", "error")


def contract_of(config: dict[str, Any]) -> dict[str, Any]:
    """The contract a published draft's config.json states, read as vLLM reads it (either format)."""
    from dspark_cli.draft.speculators import block_size_of, from_speculators, is_speculators
    from dspark_cli.export.rules import LAYER_ID_KEYS, MASK_ID_KEYS, arch_of, read_as_vllm

    native = from_speculators(config) if is_speculators(config) else config
    return {
        "architecture": (native.get("architectures") or [None])[0],
        "arch": arch_of(native),
        "target_layer_ids": read_as_vllm(native, LAYER_ID_KEYS)[1],
        "block_size": block_size_of(config),
        "mask_token_id": read_as_vllm(native, MASK_ID_KEYS)[1],
        "markov_rank": native.get("markov_rank"),
        "confidence_head": bool(native.get("enable_confidence_head")),
        "num_layers": native.get("num_hidden_layers"),
        "hidden_size": native.get("hidden_size"),
        "vocab_size": native.get("vocab_size"),
        "verifier": ((config.get("speculators_config") or {}).get("verifier") or {}).get("name_or_path")
        if is_speculators(config)
        else None,
    }


def published_manifest(draft_dir: str | Path, target: str | None, *, doing: str = "") -> dict[str, Any]:
    """The in-memory manifest of a published draft that passes every check for `target` (a name or path;
    None: not checked against a target), else a one-line DataError naming the first finding (and the count)."""
    from dspark_cli.artifacts.files import sha256_file
    from dspark_cli.draft.speculators import is_speculators
    from dspark_cli.recipe.bounded import read_json
    from dspark_cli.targets import Target

    directory = Path(draft_dir)
    if not directory.is_dir():
        raise UsageError(f"draft directory not found: {directory}", "pass a DSpark draft directory or a hub id")
    if not any((directory / name).exists() or (directory / name).is_symlink() for name in (CONFIG, WEIGHTS)):
        raise UsageError(
            f"{directory} is not a draft directory: no {DRAFT_MANIFEST} (a dspark export) and no {CONFIG} or "
            f"{WEIGHTS} (a published draft)" + (f"; {doing}" if doing else ""),
            "pass the directory `dspark export` wrote, or a published DSpark draft",
        )
    target_config = Target.named(target).full_config() if target else None
    findings = published_findings(directory, target_config)
    errors = [f for f in findings if f.severity == "error"]
    if errors:
        more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
        raise DataError(
            f"{directory}: {errors[0].line()}{more}" + (f"; {doing}" if doing else ""),
            f"`dspark export --check {directory}` lists every finding",
        )
    config = read_json(directory / CONFIG)
    contract = contract_of(config)
    return {
        "kind": "dspark.draft",
        "published": True,
        "format": "speculators" if is_speculators(config) else "vllm",
        "architecture": contract["architecture"],
        "dtype": _dtype_of(config),
        "contract": {k: v for k, v in contract.items() if k not in ("architecture", "verifier")},
        "verifier": contract["verifier"],
        "serving": {"num_speculative_tokens": contract["block_size"]},
        "files": {name: sha256_file(directory / name) for name in (CONFIG, WEIGHTS)},
        "warnings": [f.line() for f in findings if f.severity == "warning"] + _verifier_warning(contract, target),
    }


def _dtype_of(config: dict[str, Any]) -> str | None:
    """The weights' dtype a config states: `torch_dtype` or transformers 5's `dtype`, at the top level or
    (speculators format) in `transformer_layer_config`."""
    for where in (config, config.get("transformer_layer_config") or {}):
        if isinstance(where, dict) and (where.get("torch_dtype") or where.get("dtype")):
            return str(where.get("torch_dtype") or where.get("dtype"))
    return None


def _verifier_warning(contract: dict[str, Any], target: str | None) -> list[str]:
    """A speculators draft names the target it was trained for (`verifier.name_or_path`): said when it is not
    the one named here (a local copy of it is, by its directory name)."""
    verifier = contract.get("verifier")
    if not verifier or not target or Path(str(verifier)).name == Path(target).name:
        return []
    return [f"the draft names {verifier} as its verifier; you use {target}: tau is lower where they differ"]
