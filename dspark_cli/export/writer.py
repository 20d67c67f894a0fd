"""`dspark export`: a trained draft -> a vLLM-native draft directory, validated before it appears.

    dspark export runs/tiny/train -o runs/tiny/draft            # config.json, model.safetensors, manifest
    dspark export runs/tiny/train -o runs/tiny/last --select final   # the last step's draft, not the best
    dspark export runs/tiny/train --dry-run --format json       # the file and tensor table, nothing written
    dspark export --check runs/tiny/draft --target tiny-mla     # only the static checks
    dspark export runs/g/train -o runs/g/draft --export-format speculators   # GQA: the speculators config.json

MLA drafts become vLLM `K3DSparkModel` directories (`model_type: k3_dspark`), GQA drafts
`Qwen3DSparkModel` ones: vLLM 0.33 loads that class natively for Qwen3-style DSpark drafts and it
keeps every DSpark field at the top level of config.json, where our conventions (0-based output-of-
layer ids, `mask_token_id`) mean exactly what vLLM reads (the DeepSpec-style `dflash_config` form is
converted by vLLM and adds a second place for the same numbers). The target's embed_tokens and
lm_head are not written unless `--include-embeddings`. Of a training run, the draft its validation
chose (`best/`) is exported when training kept one, else `final/` (`select`); dspark_manifest.json's
`selected` says which and its step. Everything is written into a temporary
directory, checked with every rule in `rules.py`, and renamed into place only when clean.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dspark_cli import __version__
from dspark_cli.artifacts.draft import DRAFT_FILES, LoadedDraft, load_draft_dir
from dspark_cli.artifacts.draft import DRAFT_MANIFEST as MANIFEST
from dspark_cli.artifacts.files import (
    claim_output_dir,
    clean_stale_temp_dirs,
    make_public,
    make_temp_dir,
    replace_dir,
    safetensors_os_error,
    sha256_file,
    write_json_atomic,
)
from dspark_cli.artifacts.results import ExportPlan, ExportSummary
from dspark_cli.errors import DsparkError, UsageError
from dspark_cli.export.rules import FP32_TENSORS, Finding, check_against_target, check_draft_dir, num_bytes
from dspark_cli.targets import Target

if TYPE_CHECKING:
    from dspark_cli.recipe.schema import Recipe

EXPORTED_FILES = DRAFT_FILES
log = logging.getLogger(__name__)


class ExportError(DsparkError):
    """The export breaks a vLLM loader rule. `findings` has every line."""

    def __init__(self, findings: list[Finding], where: str) -> None:
        self.findings = findings
        errors = [f for f in findings if f.severity == "error"]
        more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
        super().__init__(f"{where}: {errors[0].line()}{more}", "`dspark export --check DIR` lists every finding")


def _target_embeddings(target: str) -> dict[str, Any]:
    """The target's embed_tokens / lm_head weights, read from its safetensors files only."""
    embed, lm_head = Target.named(target).embeddings()
    return {"embed_tokens.weight": embed, "lm_head.weight": lm_head}


def export_tensors(draft: LoadedDraft, dtype: str, embeddings: dict[str, Any] | None = None) -> dict[str, Any]:
    """The tensors to write: the draft's state dict in `dtype`, the confidence head in float32."""
    import torch

    torch_dtype = getattr(torch, dtype)
    out = {}
    for name, tensor in draft.state_dict.items():
        want = torch.float32 if name.startswith(FP32_TENSORS) else torch_dtype
        out[name] = tensor.to(want).contiguous()
    for name, tensor in (embeddings or {}).items():
        out[name] = tensor.to(torch_dtype).contiguous()
    return out


def plan_export(draft: LoadedDraft, dtype: str, tensors: dict[str, Any]) -> dict[str, Any]:
    from dspark_cli.draft.config import vllm_config_dict

    table = {name: (tuple(t.shape), str(t.dtype).removeprefix("torch.")) for name, t in tensors.items()}
    config = vllm_config_dict(draft.config, dtype)
    return {
        "source": str(draft.source),
        "architecture": config["architectures"][0],
        "files": ["config.json", "model.safetensors", MANIFEST],
        "config": config,
        "num_tensors": len(table),
        "num_bytes": num_bytes(table),
        "tensors": [{"name": n, "shape": list(s), "dtype": d} for n, (s, d) in table.items()],
    }


def as_speculators(plan: dict[str, Any], target: str | None, target_config: dict[str, Any] | None) -> dict[str, Any]:
    """The plan with the speculators-format config.json (GQA drafts; vLLM has no speculators form for MLA)."""
    from dspark_cli.draft.speculators import to_speculators

    if plan["architecture"] != "Qwen3DSparkModel":
        raise UsageError(
            f"--export-format speculators: a {plan['architecture']} (MLA) draft has no speculators form; "
            "vLLM maps speculators-format dspark to Qwen3DSparkModel only",
            "export MLA drafts in the native format: --export-format vllm",
        )
    if not target:
        raise UsageError(
            "--export-format speculators names the target (the verifier) in config.json", "pass --target or --recipe"
        )
    verifier_architectures = (target_config or {}).get("architectures") or []
    return {
        **plan,
        "format": "speculators",
        "config": to_speculators(plan["config"], verifier=target, verifier_architectures=verifier_architectures),
    }


def _manifest(
    draft: LoadedDraft, plan: dict[str, Any], recipe: Recipe | None, include_embeddings: bool, directory: Path
) -> dict[str, Any]:
    from dspark_cli.artifacts.train import init_record
    from dspark_cli.recipe import recorded_tree

    train = draft.train_manifest
    contract = train.get("contract", {})
    config = plan["config"]
    serving = {"method": "dspark", "num_speculative_tokens": config.get("block_size")}
    if recipe is not None:
        serving.update(
            {
                "chat_template_kwargs": recipe.target.chat_template_kwargs,
                "attention_backend": recipe.serve.attention_backend,
                "draft_sample_method": recipe.serve.draft_sample_method,
                "rejection_sample_method": recipe.serve.rejection_sample_method,
            }
        )
    aux_stream = (contract.get("extra") or {}).get("aux_attn_res_stream")
    if aux_stream is None and recipe is not None:
        aux_stream = recipe.capture.aux_attn_res_stream
    if aux_stream is not None:
        serving["env"] = {"VLLM_KIMI_K3_AUX_ATTN_RES_STREAM": "1" if aux_stream else "0"}
    return {
        "kind": "dspark.draft",
        "format_version": 1,
        "dspark": __version__,
        "format": plan.get("format", "vllm"),
        "architecture": plan["architecture"],
        "dtype": config.get("torch_dtype"),
        "include_embeddings": include_embeddings,
        "contract": contract,
        "serving": serving,
        "training": train.get("summary", {}),
        # which draft of the training run: {checkpoint: best, step, metric, value} or {checkpoint: final, step}
        "selected": draft.selected,
        # where training's first weights came from (a warm start names its source draft and its sha256)
        "init": init_record(train),
        "recipe": recorded_tree(recipe.model_dump(mode="json") if recipe is not None else train.get("recipe")),
        # every file export writes but this one: what bench, serve and publish verify, and all publish uploads
        "files": {name: sha256_file(directory / name) for name in EXPORTED_FILES if (directory / name).is_file()},
    }


def _refuse_contradictions(checkpoint: str | Path, directory: Path, manifest: dict[str, Any]) -> None:
    """The manifest's copies of config.json's fields (the training contract's block size, layer ids and
    mask token among them) must agree with the config.json written, or every later stage refuses the draft."""
    from dspark_cli.errors import DataError
    from dspark_cli.export.integrity import consistency_findings

    found = consistency_findings(directory, manifest)
    if found:
        # only the training contract can disagree here: export derives the rest from config.json itself
        raise DataError(
            f"{checkpoint}: {found[0].key}: " + found[0].message.replace(MANIFEST, "the training run's manifest.json"),
            "export the checkpoint as training wrote it (its config.json was edited), or train again",
        )


def export_draft(
    checkpoint: str | Path,
    output_dir: str | Path | None,
    *,
    recipe: Recipe | None = None,
    dtype: str = "bfloat16",
    fmt: str = "vllm",
    include_embeddings: bool = False,
    target: str | None = None,
    dry_run: bool = False,
    force: bool = False,
    select: str = "best",
) -> ExportPlan | ExportSummary:
    """Export; return the plan (dry run) or a summary. Raises ExportError listing vLLM loader findings.
    `select`: of a training run, `best` (its `best/` when it kept one, else `final/`) or `final`."""
    from safetensors import SafetensorError
    from safetensors.torch import save_file

    if fmt not in ("vllm", "speculators"):
        raise UsageError(f"export format {fmt!r} is not one of vllm, speculators", "use --export-format vllm")
    if select not in ("best", "final"):
        raise UsageError(f"export.select {select!r} is not one of best, final", "use --select best or --select final")
    draft = load_draft_dir(checkpoint, select)
    explicit = target is not None
    target = target or (
        recipe.target.model if recipe is not None else draft.train_manifest.get("contract", {}).get("target")
    )
    embeddings = _target_embeddings(target) if include_embeddings and target else None
    if include_embeddings and embeddings is None:
        raise UsageError("--include-embeddings needs to know the target", "pass --target or --recipe")
    tensors = export_tensors(draft, dtype, embeddings)
    plan = plan_export(draft, dtype, tensors)
    try:
        target_config = Target.named(target).full_config() if target else None
    except UsageError:
        if explicit:
            raise
        target_config = None  # the training run's target is not on this machine: checks against it are skipped
        log.warning("target %s of %s is not available here; skipping the checks against the target", target, checkpoint)
    native = plan["config"]
    if fmt == "speculators":
        plan = as_speculators(plan, target, target_config)
    if dry_run:
        return ExportPlan.from_dict(
            {
                **plan,
                "findings": [f.line() for f in check_against_target(native, target_config or {})],
                "selected": draft.selected,
            }
        )
    if output_dir is None:
        raise UsageError("export needs an output directory", "pass -o DIR (or --recipe for export.output_dir)")
    final = Path(output_dir)
    claim_output_dir(
        final,
        kind="dspark.draft",
        what="draft",
        force=force,
        manifest_name=MANIFEST,
        inputs=(checkpoint, draft.source),
        own=EXPORTED_FILES,
    )
    final.parent.mkdir(parents=True, exist_ok=True)
    clean_stale_temp_dirs(final)  # left by killed exports of this directory (never a live one's)
    tmp = make_temp_dir(final)
    try:
        (tmp / "config.json").write_text(json.dumps(plan["config"], indent=2) + "\n", encoding="utf-8")
        try:
            save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt", "dspark": __version__})
        except SafetensorError as exc:  # a full disk: one line naming it (the temp dir goes below)
            raise safetensors_os_error(exc, final) from None
        make_public(tmp / "model.safetensors")
        findings = check_draft_dir(tmp, target_config, include_embeddings)
        if any(f.severity == "error" for f in findings):
            raise ExportError(findings, str(final))
        if recipe is not None:
            from dspark_cli.recipe import write_resolved

            write_resolved(recipe, tmp)
        manifest = _manifest(draft, plan, recipe, include_embeddings, tmp)
        _refuse_contradictions(checkpoint, tmp, manifest)
        write_json_atomic(tmp / MANIFEST, manifest)
        replace_dir(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return ExportSummary(
        output_dir=str(final),
        architecture=plan["architecture"],
        num_tensors=plan["num_tensors"],
        num_bytes=plan["num_bytes"],
        warnings=[f.line() for f in findings if f.severity != "error"],
        selected=draft.selected,
    )
