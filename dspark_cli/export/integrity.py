"""What every stage that trusts an exported draft checks first, in one place.

`export --check`, `bench`, `serve` (with `--dry-run` too) and `publish` all call `draft_findings`:
the files export wrote must match the sha256 checksums in `dspark_manifest.json` (a truncated or
bit-flipped `model.safetensors` is refused by every stage, not only by publish), every static vLLM
loader rule must pass, the draft must have been trained for the target it is used with (the same
test bench has always made: the target's config.json fingerprint in the draft's contract), what
the manifest repeats from config.json must agree with config.json as vLLM reads it (`COPIES`: the
block size, target layer ids, mask token, architecture, dtype and format; config.json is what vLLM
loads, so it is the source of truth and a copy that disagrees means the draft was edited), and what
the draft asks of serving must be safe: environment variables only from `SERVING_ENV`, the names
export itself writes (a draft made by someone else must not set LD_PRELOAD or PYTHONPATH).

    manifest = verify_draft("runs/tiny/draft", "tiny-mla", doing="nothing was uploaded")  # or raises
    manifest, findings = draft_findings("runs/tiny/draft", "tiny-mla")                    # every finding
    n = speculative_tokens(draft_block_size("runs/tiny/draft"), recipe.serve.num_speculative_tokens)

Cost: one streamed sha256 pass over each file per call (milliseconds for a tiny draft, about the
time of reading the weights once for a large one); nothing is hashed twice within a call.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dspark_cli.artifacts.draft import CONFIG, read_draft_manifest
from dspark_cli.artifacts.draft import DRAFT_MANIFEST as MANIFEST
from dspark_cli.artifacts.files import sha256_file
from dspark_cli.draft.speculators import block_size_of, from_speculators, is_speculators
from dspark_cli.errors import ContractError, DataError, UsageError
from dspark_cli.export.rules import LAYER_ID_KEYS, MASK_ID_KEYS, Finding, check_draft_dir, read_as_vllm
from dspark_cli.recipe.bounded import read_json

REQUIRED = ("config.json", "model.safetensors")
# what dspark_manifest.json repeats from config.json: (field of config.json, its copies in the manifest)
COPIES = (
    ("block_size", ("serving.num_speculative_tokens", "contract.block_size")),
    ("target_layer_ids", ("contract.target_layer_ids",)),
    ("mask_token_id", ("contract.mask_token_id",)),
    ("architectures", ("architecture",)),
    ("torch_dtype", ("dtype",)),
    ("format", ("format",)),
)
# environment the export writes into `serving.env`, and the values it writes
SERVING_ENV = {"VLLM_KIMI_K3_AUX_ATTN_RES_STREAM": ("0", "1")}


def checksum_findings(draft_dir: Path, manifest: dict[str, Any]) -> list[Finding]:
    """Every file the manifest lists, present as a regular file with the sha256 export recorded."""
    files = manifest.get("files")
    if not isinstance(files, dict) or any(name not in files for name in REQUIRED):
        return [Finding(MANIFEST, "lists no checksums of config.json and model.safetensors", "export the draft again")]
    out = []
    for name, digest in files.items():
        path = draft_dir / str(name)
        if not isinstance(name, str) or Path(name).name != name or name.startswith("."):
            out.append(Finding(MANIFEST, f"lists {name!r}, not a file export writes", "export the draft again"))
        elif path.is_symlink():
            out.append(Finding(name, "is a symlink; export writes regular files", "export the draft again"))
        elif not path.is_file():
            out.append(Finding(name, f"missing (listed in {MANIFEST})", "export the draft again"))
        elif sha256_file(path) != digest:
            out.append(
                Finding(
                    name,
                    f"changed since export: sha256 differs from {MANIFEST} (truncated, corrupted or edited)",
                    "export the draft again",
                )
            )
    return out


def config_as_vllm_reads(config: dict[str, Any]) -> dict[str, Any]:
    """The value of each `COPIES` field of config.json (either format) that vLLM serves with: the block
    size, layer ids and mask token from the key vLLM reads first, the architecture, the dtype, the format."""
    native = from_speculators(config) if is_speculators(config) else config  # ValueError: vLLM refuses it
    names = native.get("architectures")
    return {
        "block_size": block_size_of(config),
        "target_layer_ids": read_as_vllm(native, LAYER_ID_KEYS)[1],
        "mask_token_id": read_as_vllm(native, MASK_ID_KEYS)[1],
        "architectures": names[0] if isinstance(names, list) and names else names,
        "torch_dtype": native.get("torch_dtype"),
        "format": "speculators" if is_speculators(config) else "vllm",
    }


def _manifest_value(manifest: dict[str, Any], dotted: str) -> Any:
    head, _, tail = dotted.partition(".")
    value = manifest.get(head)
    return (value.get(tail) if isinstance(value, dict) else None) if tail else value


def consistency_findings(draft_dir: Path, manifest: dict[str, Any]) -> list[Finding]:
    """One finding per config.json field that a copy in the manifest contradicts (`COPIES`): bench reads
    config.json, the model card and older tools the manifest, so both must describe the draft vLLM serves.
    A copy the manifest leaves out is not compared; an unreadable config.json is the rules' finding."""
    try:
        config = read_json(draft_dir / CONFIG)
        actual = config_as_vllm_reads(config) if isinstance(config, dict) else None
    except (ValueError, OSError):
        actual = None
    if actual is None:
        return []
    out = []
    for key, copies in COPIES:
        for place in copies:
            copy = _manifest_value(manifest, place)
            if copy is not None and (copy != actual[key] or type(copy) is not type(actual[key])):
                out.append(
                    Finding(
                        key,
                        f"{CONFIG} says {actual[key]!r}, {MANIFEST} ({place}) says {copy!r}",
                        "export the draft again (dspark export CHECKPOINT -o DIR)",
                    )
                )
                break
    return out


def speculative_tokens(block_size: int, requested: int | None) -> int:
    """Tokens drafted per step when serving or benching a draft of `block_size` (`draft_block_size`):
    `serve.num_speculative_tokens` when set, at most the block size the draft was trained with."""
    if requested is None:
        return block_size
    if requested > block_size:
        raise UsageError(
            f"serve.num_speculative_tokens={requested} exceeds the draft's block size {block_size}",
            "use at most the block size the draft was trained with",
        )
    return requested


def target_findings(manifest: dict[str, Any], target: str | None) -> list[Finding]:
    """The draft against a target on this machine: was it trained for that target's config?"""
    from dspark_cli.targets import Target

    contract = manifest.get("contract") or {}
    expected = contract.get("target_config_sha256")
    actual = Target.named(target).geometry(strict=False).config_sha256 if target else None
    if expected and actual and expected != actual:
        return [
            Finding(
                "target",
                f"the draft was trained for target {contract.get('target')!r}, whose config differs from {target}",
                f"use the draft with its own target (contract.target in {MANIFEST})",
            )
        ]
    return []


def serving_findings(manifest: dict[str, Any]) -> list[Finding]:
    """What the draft asks of the vLLM launch: only settings export itself writes."""
    serving = manifest.get("serving") or {}
    if not isinstance(serving, dict):
        return [Finding("serving", "is not a mapping", "export the draft again")]
    out = []
    env = serving.get("env") or {}
    if not isinstance(env, dict):
        return [Finding("serving.env", "is not a mapping", "export the draft again")]
    refused = [k for k, v in env.items() if k not in SERVING_ENV or v not in SERVING_ENV[k]]
    if refused:
        shown = ", ".join(f"{k}={env[k]!r}" if k in SERVING_ENV else str(k) for k in refused)
        out.append(
            Finding(
                "serving.env",
                f"sets {shown}: a draft may only set {', '.join(SERVING_ENV)} (0 or 1) for vLLM",
                "set extra environment yourself when you launch vLLM, or export the draft again",
            )
        )
    block = serving.get("num_speculative_tokens")
    if block is not None and (not isinstance(block, int) or isinstance(block, bool) or not 0 < block <= 64):
        out.append(
            Finding("serving.num_speculative_tokens", f"{block!r} is not a block size", "export the draft again")
        )
    kwargs = serving.get("chat_template_kwargs")
    if kwargs is not None and (
        not isinstance(kwargs, dict)
        or not all(isinstance(v, (bool, int, float, str)) or v is None for v in kwargs.values())
    ):
        out.append(Finding("serving.chat_template_kwargs", "must map names to plain values", "export the draft again"))
    return out


def draft_findings(
    draft_dir: str | Path, target: str | None = None, *, require_manifest: bool = True
) -> tuple[dict[str, Any], list[Finding]]:
    """(manifest, every finding) for the draft at `draft_dir` used with `target` (a name or path; None: skip).

    Without `require_manifest` (export --check of a draft made elsewhere), a directory without a
    manifest gets the static rules and a warning that nothing else could be checked.
    """
    from dspark_cli.targets import Target

    draft_dir = Path(draft_dir)
    if not draft_dir.is_dir():
        raise UsageError(f"draft directory not found: {draft_dir}", "pass the directory `dspark export` wrote")
    target_config = Target.named(target).full_config() if target else None
    if not (draft_dir / MANIFEST).exists() and not require_manifest:  # a published draft (export/published.py)
        from dspark_cli.export.published import published_findings

        return {}, [
            *published_findings(draft_dir, target_config),
            Finding(
                MANIFEST,
                "missing (a published draft): checked as one; the target it was trained for and its chat "
                "template are not recorded",
                "bench it on your prompts before you trust its numbers",
                "warning",
            ),
        ]
    manifest = read_draft_manifest(draft_dir)
    findings = checksum_findings(draft_dir, manifest)  # first: a changed file explains the findings after it
    findings += consistency_findings(draft_dir, manifest)
    findings += check_draft_dir(draft_dir, target_config, bool(manifest.get("include_embeddings")))
    return manifest, [*findings, *target_findings(manifest, target), *serving_findings(manifest)]


def verify_draft(
    draft_dir: str | Path, target: str | None = None, *, doing: str = "", published: bool = False
) -> dict[str, Any]:
    """The draft's manifest once every check of `draft_findings` passes, else a one-line error
    (ContractError for a draft of another target, DataError otherwise); `doing` is appended to it.
    With `published`, a directory without dspark_manifest.json is a published draft: its checks
    (`export/published.py`) and the in-memory manifest they give (`"published": true`)."""
    if published and Path(draft_dir).is_dir() and not (Path(draft_dir) / MANIFEST).exists():
        from dspark_cli.export.published import published_manifest

        return published_manifest(draft_dir, target, doing=doing)
    manifest, findings = draft_findings(draft_dir, target)
    errors = [f for f in findings if f.severity == "error"]
    if errors:
        more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
        cls = ContractError if errors[0].key == "target" else DataError
        raise cls(
            f"{draft_dir}: {errors[0].line()}{more}" + (f"; {doing}" if doing else ""),
            f"`dspark export --check {draft_dir}` lists every finding",
        )
    return manifest
