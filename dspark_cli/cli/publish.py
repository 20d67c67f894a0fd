"""`dspark publish DRAFT_DIR --repo-id OWNER/NAME`: upload a checked draft with its model card."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from dspark_cli.cli.common import (
    DraftDirArg,
    FormatOpt,
    OverridesArg,
    RecipeOpt,
    check_format,
    load_beside,
    preflight_stage,
    split_positional,
)
from dspark_cli.errors import UsageError
from dspark_cli.ui import handle_errors, print_json, print_table, say

if TYPE_CHECKING:
    from dspark_cli.artifacts.results import PublishSummary


@handle_errors
def publish(
    draft_dir: DraftDirArg = None,
    overrides: OverridesArg = None,
    recipe: RecipeOpt = None,
    repo_id: Annotated[str | None, typer.Option(help="Sets publish.repo_id (`owner/name`).")] = None,
    public: Annotated[bool, typer.Option("--public", help="Create public repos (private by default).")] = False,
    hub: Annotated[
        list[str] | None,
        typer.Option("--hub", help="Sets publish.hubs (repeatable): `huggingface`, `modelscope`.", show_default=False),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Check and list what would be uploaded; upload nothing.")
    ] = False,
    output_format: FormatOpt = "text",
) -> None:
    """Upload an exported draft, with a generated model card, to Hugging Face and/or ModelScope.

    Before anything is sent, the draft must pass every static vLLM loader check and match its
    manifest's checksums, and every hub asked for must have a token (`hf auth login` or HF_TOKEN;
    `modelscope login` or MODELSCOPE_API_TOKEN). Each hub gets one commit. The draft's own recipe
    describes the draft only: the repo id, visibility and hubs come from you (flags or `--recipe`).
    """
    from dspark_cli.publish import publish_draft

    check_format(output_format)
    draft_dir, rest = split_positional(draft_dir, overrides)
    loaded = load_beside(
        recipe,
        draft_dir,
        rest,
        {"publish.repo_id": repo_id, "publish.private": False if public else None, "publish.hubs": hub or None},
    )
    if loaded is None:
        raise UsageError(
            "publish needs a draft directory exported by dspark, or --recipe",
            "dspark publish runs/NAME/draft --repo-id OWNER/NAME",
        )
    preflight_stage(loaded, ["publish"], recipe, dry_run=dry_run)
    result = publish_draft(loaded, draft_dir, dry_run=dry_run)
    if output_format == "json":
        print_json(result.to_dict())
        return
    _render(result, dry_run)


def _render(result: PublishSummary, dry_run: bool) -> None:
    visibility = "private" if result.private else "public"
    title = f"{result.repo_id} ({visibility}) on {', '.join(result.hubs)}"
    print_table(
        title + (" -- dry run, nothing uploaded" if dry_run else ""),
        ["path in repo", "bytes", "from"],
        [[f.path, f"{f.bytes:,}", f.source] for f in result.files],
    )
    if dry_run:
        say(f"model card: {result.card}; the draft passes every static vLLM loader check")
        return
    for hub_name, url in result.urls.items():
        say(f"published to {hub_name}: {url}", style="green")
