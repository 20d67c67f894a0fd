"""What every stage that trusts an exported draft checks first, in one place.

`export --check`, `bench`, `serve` (with `--dry-run` too) and `publish` all call `draft_findings`:
the files export wrote must match the sha256 checksums in `dspark_manifest.json` (a truncated or
bit-flipped `model.safetensors` is refused by every stage, not only by publish), every static vLLM
loader rule must pass, the draft must have been trained for the target it is used with (the same
test bench has always made: the target's config.json fingerprint in the draft's contract), and what
the draft asks of serving must be safe: environment variables only from `SERVING_ENV`, the names
export itself writes (a draft made by someone else must not set LD_PRELOAD or PYTHONPATH).

    manifest = verify_draft("runs/tiny/draft", "tiny-mla", doing="nothing was uploaded")  # or raises
    manifest, findings = draft_findings("runs/tiny/draft", "tiny-mla")                    # every finding

Cost: one streamed sha256 pass over each file per call (milliseconds for a tiny draft, about the
time of reading the weights once for a large one); nothing is hashed twice within a call.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dspark_cli.artifacts.draft import DRAFT_MANIFEST as MANIFEST
from dspark_cli.artifacts.draft import read_draft_manifest
from dspark_cli.artifacts.files import sha256_file
from dspark_cli.errors import ContractError, DataError, UsageError
from dspark_cli.export.rules import Finding, check_draft_dir

REQUIRED = ("config.json", "model.safetensors")
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
    if not (draft_dir / MANIFEST).is_file() and not require_manifest:
        findings = check_draft_dir(draft_dir, target_config)
        return {}, [
            *findings,
            Finding(
                MANIFEST,
                "missing: checksums, the trained-for target and serving settings were not checked",
                "export it with dspark",
                "warning",
            ),
        ]
    manifest = read_draft_manifest(draft_dir)
    findings = checksum_findings(draft_dir, manifest)  # first: a changed file explains the findings after it
    findings += check_draft_dir(draft_dir, target_config, bool(manifest.get("include_embeddings")))
    return manifest, [*findings, *target_findings(manifest, target), *serving_findings(manifest)]


def verify_draft(draft_dir: str | Path, target: str | None = None, *, doing: str = "") -> dict[str, Any]:
    """The draft's manifest once every check of `draft_findings` passes, else a one-line error
    (ContractError for a draft of another target, DataError otherwise); `doing` is appended to it."""
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
