"""`dspark export CHECKPOINT`: write a vLLM draft directory; `--check DIR`; `--recipe R --meta --dry-run`."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from dspark_cli.artifacts.results import ExportPlan, ExportSummary
from dspark_cli.cli.common import (
    DryRunOpt,
    FormatOpt,
    OverridesArg,
    RecipeOpt,
    check_format,
    draft_location,
    load_beside,
    preflight_stage,
    split_positional,
    tensor_rows,
)
from dspark_cli.errors import UsageError
from dspark_cli.ui import handle_errors, print_json, print_table, say


@handle_errors
def export(
    checkpoint: Annotated[str | None, typer.Argument(help="Training checkpoint directory.", show_default=False)] = None,
    overrides: OverridesArg = None,
    output: Annotated[str | None, typer.Option("--output", "-o", help="Sets export.output_dir.")] = None,
    recipe: RecipeOpt = None,
    export_format: Annotated[
        str | None,
        typer.Option(
            "--export-format",
            help="Sets export.format: `vllm` (native) or `speculators` (GQA drafts only; vLLM reads it as Qwen3DSparkModel).",
        ),
    ] = None,
    meta: Annotated[
        bool, typer.Option("--meta", help="Build the draft on the meta device (no weights, no memory).")
    ] = False,
    check: Annotated[str | None, typer.Option("--check", help="Only validate a draft: a directory or hub id.")] = None,
    target: Annotated[str | None, typer.Option(help="Target to check the draft against (name or path).")] = None,
    dtype: Annotated[str | None, typer.Option(help="Sets export.dtype: bfloat16, float32 or float16.")] = None,
    include_embeddings: Annotated[
        bool, typer.Option("--include-embeddings", help="Also write the target's embed_tokens/lm_head.")
    ] = False,
    force: Annotated[
        bool, typer.Option("--force", help="Replace an earlier export (never any other directory).")
    ] = False,
    select: Annotated[str | None, typer.Option(help="Sets export.select: best (validation's pick) or final.")] = None,
    dry_run: DryRunOpt = False,
    output_format: FormatOpt = "text",
) -> None:
    """Write a vLLM-native draft directory (or, with --dry-run, list every tensor it would hold).

    `dspark export --recipe kimi-k3 --meta --dry-run --format json` lists the config.json and every
    tensor (name, shape, dtype) of the draft a recipe describes, without weights or memory.
    """
    from dspark_cli.export.run import check_draft, describe_selected, export_checkpoint, meta_plan

    check_format(output_format)
    checkpoint, rest = split_positional(checkpoint, overrides)
    if check is not None:
        _render_check(check, check_draft(draft_location(check), target), output_format)
        return
    if checkpoint is None and recipe is None:
        raise UsageError("export needs a CHECKPOINT, or --recipe with --meta --dry-run, or --check DIR")
    flags = {
        "export.output_dir": output,
        "export.format": export_format,
        "export.dtype": dtype,
        "export.include_embeddings": include_embeddings or None,
        "export.select": select,
    }
    # the user's recipe, else the one training wrote beside the checkpoint, less where outputs go (recipe/trust.py)
    loaded = load_beside(recipe, checkpoint, rest, flags, whole=True)
    if meta:
        if loaded is None or not dry_run:
            raise UsageError("--meta builds the draft from a recipe without weights: use --recipe R --meta --dry-run")
        _render_meta_plan(meta_plan(loaded), output_format)
        return
    if checkpoint is None:
        raise UsageError("export needs a CHECKPOINT (a training output directory) unless --meta --dry-run")
    if loaded is not None:
        preflight_stage(loaded, ["export"], recipe, machine=not dry_run, force=force, inputs={"export": checkpoint})
    result = export_checkpoint(
        checkpoint,
        recipe=loaded,
        output=output,
        dtype=dtype,
        fmt=export_format,
        include_embeddings=include_embeddings,
        target=target,
        force=force,
        dry_run=dry_run,
        select=select,
    )
    _render_export(result, describe_selected(result.selected), output_format)


def _render_export(result: ExportPlan | ExportSummary, selected: str, output_format: str) -> None:
    if output_format == "json":
        print_json(result.to_dict())
        return
    if isinstance(result, ExportPlan):
        _print_tensors(f"{result.architecture} from {result.source}", result)
        say(f"files: {', '.join(result.files or [])}; {result.num_tensors} tensors, {result.num_bytes:,} bytes")
        say(selected)
        for line in result.findings or []:
            say(f"finding: {line}", style="red")
        return
    for line in result.warnings:
        say(f"warning: {line}", style="yellow")
    say(
        f"exported {result.architecture} ({result.num_tensors} tensors, {result.num_bytes:,} bytes) "
        f"-> {result.output_dir}; {selected}; checked against vLLM 0.33's loader rules",
        style="green",
    )


def _render_check(directory: str, findings: list[Any], output_format: str) -> None:
    """The findings, one a line (or JSON); exit 1 when any is an error."""
    from dspark_cli.errors import DsparkError

    if output_format == "json":
        print_json([{"key": f.key, "message": f.message, "fix": f.fix, "severity": f.severity} for f in findings])
    else:
        for finding in findings:
            say(f"{finding.severity}: {finding.line()}", style="red" if finding.severity == "error" else "yellow")
    errors = [f for f in findings if f.severity == "error"]
    if errors:
        raise DsparkError(f"{directory}: {len(errors)} problem(s) vLLM 0.33 would trip on", "see the lines above")
    if output_format != "json":
        say(f"{directory}: ok for vLLM 0.33 ({len(findings)} warning(s))", style="green")


def _render_meta_plan(plan: ExportPlan, output_format: str) -> None:
    if output_format == "json":
        print_json(plan.to_dict())
        return
    _print_tensors(f"{plan.architecture}: model.safetensors", plan)
    say(
        f"{plan.num_tensors} tensors, {plan.num_parameters or 0:,} parameters, {plan.num_bytes / 2**30:.2f} GiB; "
        "config.json: `--format json` prints it"
    )


def _print_tensors(title: str, plan: ExportPlan) -> None:
    print_table(f"{title} (dry run, nothing written)", ["tensor", "shape", "dtype"], tensor_rows(plan.tensors))
