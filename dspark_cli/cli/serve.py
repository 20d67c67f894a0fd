"""`dspark serve DRAFT`: the target with the draft in vLLM, until Ctrl-C (or the command, with --dry-run).

DRAFT is a draft directory (a dspark export, or a published draft: docs/published-drafts.md) or the hub
id of a published draft (`org/name`, downloaded by `dspark_cli.publish.draft_source` when no local path
of that name exists).
"""

from __future__ import annotations

from typing import Annotated

import typer

from dspark_cli.cli.common import (
    DraftDirArg,
    OverridesArg,
    RecipeOpt,
    draft_location,
    load_beside,
    preflight_stage,
    split_positional,
)
from dspark_cli.errors import UsageError
from dspark_cli.ui import handle_errors, say, stdout


@handle_errors
def serve(
    draft_dir: DraftDirArg = None,
    overrides: OverridesArg = None,
    recipe: RecipeOpt = None,
    port: Annotated[int | None, typer.Option(help="Sets serve.port.")] = None,
    method: Annotated[str, typer.Option(help="`dspark` (the draft), `ngram` or `none` (the target alone).")] = "dspark",
    log_file: Annotated[
        str | None, typer.Option("--log", help="Write vLLM's log to this file, not the terminal.")
    ] = None,
    ready_timeout: Annotated[float, typer.Option(help="Seconds to wait for vLLM's /health.")] = 1800.0,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the `vllm serve` command; start nothing.")] = False,
    explain: Annotated[
        bool, typer.Option("--explain", help="Show why num_speculative_tokens is recommended: throughput per k.")
    ] = False,
) -> None:
    """Serve the target with the draft in vLLM (`--speculative-config` with method dspark).

    Settings come from the draft's manifest (block size, chat-template arguments, K3's AttnRes
    stream flag) and the recipe's `serve` section; arguments after `--` go to `vllm serve` as they
    are. The draft is checked first (checksums, vLLM loader rules, its target); the draft's own
    recipe describes the draft only (host and port are yours), and its trust fields are refused
    unless you set them. A published draft (config.json + model.safetensors, no dspark_manifest.json;
    a local directory or a hub id) needs --recipe: its block size comes from its config.json,
    everything else from the recipe. vLLM runs until Ctrl-C / SIGTERM, which
    stop it and its engine processes; the endpoint and a request to paste are printed once it is
    up. `--method dspark` needs a CUDA GPU and vLLM >= 0.33; `--dry-run` prints the command.

    With the draft's acceptance profile (speculation_profile.json from `dspark bench --offline`, in the
    draft or the recipe's bench folder, for these very weights) it prints the num_speculative_tokens that
    maximises modelled throughput at serve.expected_temperature and serve.expected_concurrency (a
    recommendation: serve.num_speculative_tokens is used as set); `--explain` shows the model per k.
    """
    from dspark_cli.export import is_published
    from dspark_cli.serving.command import serve_plan, shell_line, split_vllm_args

    draft_dir, rest, vllm_args = split_vllm_args(draft_dir, overrides)
    draft_dir, rest = split_positional(draft_dir, rest)
    draft_dir = draft_location(draft_dir) if draft_dir is not None else None
    published = draft_dir is not None and is_published(draft_dir)
    # a published draft carries no recipe dspark reads: a recipe.yaml beside it is not the user's
    loaded = load_beside(recipe, None if published else draft_dir, rest, {"serve.port": port})
    if loaded is None and published:
        raise UsageError(
            f"{draft_dir} is a published draft: it records no target or serving settings",
            f"name them with a recipe: dspark serve {draft_dir} --recipe R [target.model=...]",
        )
    if loaded is None:
        raise UsageError(
            "serve needs a draft directory exported by dspark, or --recipe", "dspark serve runs/NAME/draft"
        )
    argv, env = serve_plan(loaded, draft_dir or loaded.stage_dir("export"), method=method, vllm_args=vllm_args)
    preflight_stage(loaded, ["serve"], recipe, serve_method=method, dry_run=dry_run)  # the draft is checked first
    if method == "dspark":
        _advise(loaded, draft_dir or loaded.stage_dir("export"), explain)
    if dry_run:
        stdout.print(shell_line(argv, env), markup=False, highlight=False)
        return
    from dspark_cli.serving.launcher import serve_draft

    code = serve_draft(
        loaded,
        argv,
        env,
        method=method,
        log_file=log_file,
        ready_timeout=ready_timeout,
        on_line=lambda text, ready: say(text, style="green" if ready else None),
    )
    raise typer.Exit(code)


def _advise(loaded, draft_dir, explain: bool) -> None:
    """The recommended num_speculative_tokens from the draft's acceptance profile, on stderr (stdout is the command)."""
    from pathlib import Path

    from dspark_cli.artifacts.draft import draft_block_size
    from dspark_cli.bench.profile import advice_lines
    from dspark_cli.ui import stderr

    if not (Path(draft_dir) / "config.json").is_file():  # a plan for a draft not exported yet: nothing to advise
        return
    serve = loaded.serve
    for line in advice_lines(
        draft_dir,
        loaded.stage_dir("bench"),
        cost_spec=loaded.bench.cost_model,
        temperature=serve.expected_temperature,
        concurrency=serve.expected_concurrency,
        configured=serve.num_speculative_tokens,
        block_size=draft_block_size(draft_dir),
        explain=explain,
    ):
        stderr.print(line, markup=False, highlight=False)
