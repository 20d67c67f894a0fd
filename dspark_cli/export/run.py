"""What `dspark export` does, as three library calls: export a checkpoint, check a draft, plan from a recipe.

    export_checkpoint("runs/tiny/train", recipe=load_recipe("tiny"))           # -> runs/tiny/draft
    export_checkpoint("runs/tiny/train", output="out/draft", dry_run=True)      # the plan, nothing written
    export_checkpoint("runs/tiny/train", output="out/last", select="final")    # the last step's, not best/
    check_draft("out/draft", target="tiny-gqa")                                 # vLLM loader findings
    meta_plan(load_recipe("kimi-k3"))                                          # config.json + every tensor, no weights

Import-light: torch and transformers are imported inside the calls.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dspark_cli.artifacts.results import ExportPlan, ExportSummary
from dspark_cli.errors import UsageError
from dspark_cli.recipe.schema import Recipe


def export_checkpoint(
    checkpoint: str | Path,
    *,
    recipe: Recipe | None = None,
    output: str | Path | None = None,
    dtype: str | None = None,
    fmt: str | None = None,
    include_embeddings: bool = False,
    target: str | None = None,
    force: bool = False,
    dry_run: bool = False,
    select: str | None = None,
) -> ExportPlan | ExportSummary:
    """Export the training output `checkpoint`; return the plan (dry run) or a summary (`writer.export_draft`).

    With a `recipe` (the user's, or the resolved one training wrote beside the checkpoint) its `export`
    section decides dtype, format, embeddings and which draft (`export.select`), and `output` defaults to
    its export directory; the command line's flags are already folded into it. Without one, the arguments
    decide (bfloat16, vllm format, the best draft by default) and `output` is required unless `dry_run`.
    """
    from dspark_cli.export.writer import export_draft

    if recipe is not None:
        output = output or recipe.stage_dir("export")
        dtype, fmt, include_embeddings = recipe.export.dtype, recipe.export.format, recipe.export.include_embeddings
        select = recipe.export.select
    result = export_draft(
        checkpoint,
        output,
        recipe=recipe,
        dtype=dtype or "bfloat16",
        fmt=fmt or "vllm",
        include_embeddings=include_embeddings,
        target=target,
        dry_run=dry_run,
        force=force,
        select=select or "best",
    )
    if isinstance(result, ExportSummary):  # the bench's acceptance profile, when it measured these very weights
        from dspark_cli.artifacts.profile import place_profile

        place_profile(recipe, result.output_dir)
    return result


def describe_selected(selected: dict[str, Any] | None) -> str:
    """One phrase for dspark_manifest.json's `selected`: which draft of the training run was exported."""
    if not selected:
        return "draft: the directory given (not a training run)"
    if selected.get("checkpoint") == "best" and "value" in selected:
        return f"draft: best/ (step {selected['step']}, validation {selected['metric']} {selected['value']:.3f})"
    return f"draft: {selected['checkpoint']}/ (step {selected.get('step')})"


def check_draft(directory: str | Path, target: str | None = None) -> list[Any]:
    """Every finding (`integrity.Finding`) for a draft directory, made by dspark or elsewhere, used with `target`."""
    from dspark_cli.export.integrity import draft_findings

    return draft_findings(directory, target, require_manifest=False)[1]


def planned_config_problems(recipe: Recipe) -> list[str]:
    """What export would refuse about the draft this recipe describes, judged before any training from
    the meta-device plan: a draft config that cannot be built, and the vLLM loader rules (rules.py,
    errors only) its config.json would break. The mask token is left to export when the recipe leaves
    it to the tokenizer; a hub target not on this machine without declared geometry is not judged."""
    from dspark_cli.errors import DsparkError
    from dspark_cli.export.roster import export_dry_run
    from dspark_cli.export.rules import check_config
    from dspark_cli.targets import Target

    draft = recipe.draft.model_dump()
    if draft.get("mask_token_id") is None:
        draft["mask_token_id"] = 0  # a placeholder: export takes the tokenizer's mask token
    target = recipe.target.model_dump()
    config = None
    if Target.of(recipe).config() is not None:
        config = Target.of(recipe).transformers_config()
    elif not all(target.get(k) for k in ("hidden_size", "vocab_size", "num_hidden_layers")):
        return []
    try:
        planned = export_dry_run(draft, target, config, recipe.export.dtype)["config"]
    except DsparkError as exc:  # DraftConfigError: what training would refuse when it builds the draft
        return [f"draft: {exc.message}" + (f" ({exc.hint})" if exc.hint else "")]
    findings = [f for f in check_config(planned) if f.severity == "error"]
    if recipe.draft.mask_token_id is None:
        findings = [f for f in findings if f.key != "mask_token_id"]
    return [f"draft: the exported config.json would break a vLLM loader rule: {f.line()}" for f in findings]


def meta_plan(recipe: Recipe) -> ExportPlan:
    """The vLLM config.json and every tensor (name, shape, dtype) of the draft `recipe` describes.

    Built on the meta device: no weights and no memory. The target's config is read when it is
    available here (its geometry fills the draft fields the recipe leaves unset).
    """
    from dspark_cli.export.roster import export_dry_run
    from dspark_cli.targets import Target

    if recipe.export.format != "vllm":
        raise UsageError(f"--meta --dry-run lists the vllm format; export.format is {recipe.export.format}")
    config = None
    if Target.of(recipe).config() is not None:
        config = Target.of(recipe).transformers_config()
    return ExportPlan.from_dict(
        export_dry_run(recipe.draft.model_dump(), recipe.target.model_dump(), config, recipe.export.dtype)
    )
