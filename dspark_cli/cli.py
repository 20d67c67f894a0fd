"""The `dspark` command line: one small function per command, heavy imports inside them.

    dspark init tiny                      # copy a template recipe to ./dspark.yaml
    dspark validate dspark.yaml train.lr=3e-4
    dspark run templates/recipes/tiny.yaml

`dspark --help`, `dspark CMD --help` and shell completion import only typer, rich, yaml and
pydantic; torch, transformers and vllm are imported by the library functions a command calls.
Every command accepts `section.key=value` overrides after its positional arguments;
precedence is defaults < recipe file < overrides < flags.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from dspark_cli import __version__
from dspark_cli.errors import UsageError
from dspark_cli.ui import handle_errors, print_json, print_table, say, stdout

app = typer.Typer(
    name="dspark",
    help="Train, export, serve, benchmark and publish DSpark speculative-decoding drafts for vLLM.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    rich_markup_mode="markdown",
    context_settings={"help_option_names": ["-h", "--help"]},
)

RecipeArg = Annotated[str, typer.Argument(help="Recipe YAML file, or a template name (`tiny`, `kimi-k3`, ...).")]
OverridesArg = Annotated[
    list[str] | None,
    typer.Argument(help="Overrides `section.key=value`, e.g. `train.lr=3e-4 draft.num_layers=2` "
                        "(list items by index: `datagen.sources[0].max_samples=8`).", show_default=False),
]
RecipeOpt = Annotated[str | None, typer.Option("--recipe", "-r", help="Recipe file or template name.")]
DryRunOpt = Annotated[bool, typer.Option("--dry-run", help="Show the plan; write nothing.")]
FormatOpt = Annotated[str, typer.Option("--format", help="Output: `text` (tables) or `json` (machines).")]


def _version(value: bool) -> None:
    if value:
        say(f"dspark {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """Train, export, serve, benchmark and publish DSpark speculative-decoding drafts for vLLM.

    Set `DSPARK_DEBUG=1` to see tracebacks.
    """


def _split_positional(first: str | None, overrides: list[str] | None) -> tuple[str | None, list[str]]:
    """For commands whose first positional is optional: `key=value` there is an override, not a path."""
    rest = list(overrides or [])
    if first is not None and "=" in first and not Path(first).exists():
        return None, [first, *rest]
    return first, rest


def _recipe_beside(recipe: str | None, directory: str | None) -> str | None:
    """`recipe` if given, else the resolved recipe.yaml a dspark stage wrote into `directory` (if any)."""
    if recipe is None and directory is not None and (Path(directory) / "recipe.yaml").is_file():
        return str(Path(directory) / "recipe.yaml")
    return recipe


def _load_beside(recipe: str | None, directory: str | None, overrides: list[str], flags: dict[str, Any] | None = None):
    """The user's `recipe`, else the one draft `directory` carries, minus its trust (serving/trust.py); None if neither."""
    from dspark_cli.serving.trust import load_beside

    return load_beside(recipe, directory, overrides, lambda path: _load(path, overrides, flags))


def _load(recipe: str | None, overrides: list[str] | None, flags: dict[str, Any] | None = None):
    """Load and fully check a recipe; every problem at once, exit 2."""
    from dspark_cli.errors import RecipeError
    from dspark_cli.recipe import load_recipe
    from dspark_cli.recipe.checks import check_recipe

    loaded = load_recipe(recipe, overrides or [], flags)
    problems = check_recipe(loaded)
    if problems:
        raise RecipeError(problems, f"fix {recipe or 'the overrides'} and run `dspark validate` again")
    return loaded


def _check_format(output_format: str) -> None:
    if output_format not in ("text", "json"):
        raise UsageError(f"--format must be text or json, got {output_format!r}")


@app.command()
@handle_errors
def init(
    template: Annotated[str, typer.Argument(help="Template to copy: `tiny`, `qwen3-8b`, `llama-3.1-8b`, `kimi-k3`.")] = "tiny",
    output: Annotated[Path, typer.Option("--output", "-o", help="Where to write the recipe.")] = Path("dspark.yaml"),
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing file.")] = False,
) -> None:
    """Copy a template recipe to edit (`dspark init qwen3-8b -o my.yaml`)."""
    from dspark_cli.recipe.loader import copy_template

    copy_template(template, output, force=force)
    say(f"wrote {output} (from template {template}); next: dspark validate {output}")


@app.command()
@handle_errors
def validate(
    recipe: RecipeArg,
    overrides: OverridesArg = None,
    show: Annotated[bool, typer.Option("--print", help="Print the resolved recipe.")] = False,
    output_format: FormatOpt = "text",
) -> None:
    """Check a recipe: types, ranges, unknown keys and cross-stage rules, all problems at once.

    `--format json` prints the resolved recipe, or `{"ok": false, "problems": [...], "hint": ...}`
    (exit 2) when there are problems.
    """
    from dspark_cli.errors import DsparkError, RecipeError
    from dspark_cli.recipe import dump_recipe

    _check_format(output_format)
    try:
        loaded = _load(recipe, overrides)
    except DsparkError as exc:
        if output_format == "json":
            problems = exc.problems if isinstance(exc, RecipeError) else [exc.message]
            print_json({"ok": False, "recipe": recipe, "problems": problems, "hint": exc.hint})
        raise
    if output_format == "json":
        print_json(loaded.model_dump(mode="json"))
        return
    if show:
        stdout.print(dump_recipe(loaded), markup=False)
    say(f"{recipe}: ok", style="green")


@app.command()
@handle_errors
def datagen(
    recipe: RecipeArg,
    overrides: OverridesArg = None,
    output_dir: Annotated[str | None, typer.Option("--output-dir", "-o", help="Sets datagen.output_dir.")] = None,
    engine: Annotated[str | None, typer.Option(help="Sets datagen.engine: `vllm` or `hf`.")] = None,
    dry_run: DryRunOpt = False,
) -> None:
    """Regenerate responses with the target itself (on-policy training data), resumably."""
    from dspark_cli.datagen.run import run_datagen
    from dspark_cli.ui import progress_bar

    loaded = _load(recipe, overrides, {"datagen.output_dir": output_dir, "datagen.engine": engine})
    if dry_run:
        plan = run_datagen(loaded, dry_run=True)
        rows = [[source, plan["counts"]["read"].get(source, 0), kept] for source, kept in plan["counts"]["kept"].items()]
        print_table("datagen plan (nothing written)", ["source", "read", "kept"], rows)
        for reason, counts in plan["counts"]["dropped"].items():
            say(f"dropped ({reason}): {sum(counts.values())}")
        say(f"{plan['conversations']} conversations, {plan['turns']} assistant turns to generate, "
            f"{plan['shards']} shards ({plan['already_done']} already done) -> {plan['output_dir']}")
        return
    with progress_bar("datagen", unit="conversations") as update:
        summary = run_datagen(loaded, on_progress=lambda done, total, tokens: update(done, total, tokens=tokens))
    say(f"datagen: {summary['conversations']} conversations, {summary['generated_tokens']} tokens generated "
        f"({summary['tokens_per_second']} tokens/s) -> {summary['output_dir']}", style="green")


@app.command()
@handle_errors
def train(
    recipe: RecipeArg,
    overrides: OverridesArg = None,
    output_dir: Annotated[str | None, typer.Option("--output-dir", "-o", help="Sets train.output_dir.")] = None,
    resume: Annotated[str, typer.Option(help="`auto` (latest checkpoint if any), `never`, or a checkpoint path.")] = "auto",
    nproc: Annotated[int | None, typer.Option(help="Sets train.nproc_per_node; >1 launches torchrun.")] = None,
    dry_run: DryRunOpt = False,
) -> None:
    """Capture hidden states and train the draft (FSDP2; torchrun when several processes)."""
    # --resume auto continues from the latest checkpoint (a crash costs at most train.checkpoint_every
    # steps); --nproc N > 1 relaunches this command under torchrun, whose children train.
    import os
    import subprocess

    loaded = _load(recipe, overrides, {"train.output_dir": output_dir, "train.nproc_per_node": nproc})
    if dry_run:
        from dspark_cli.training.run import plan_train

        plan = plan_train(loaded)
        cap = plan["capture"]
        disk = f"{cap['total_bytes'] / 2**30:.2f} GiB" if cap.get("total_bytes") else "unknown (run datagen first)"
        rows = [["steps", plan["num_steps"]], ["tokens per step (all ranks)", plan["tokens_per_step"]],
                ["sequences per epoch", plan.get("num_sequences")], ["tokens per epoch", plan.get("num_tokens")],
                ["sequences per step", round(plan.get("sequences_per_step", 0) or 0, 2) or "-"],
                ["processes", plan["world_size"]], ["anchors per sequence", plan["num_anchors"]],
                ["block size", plan["block_size"]], [f"capture cache ({cap['mode']}) disk", disk],
                ["output", plan["output_dir"]]]
        print_table(f"train plan ({'exact' if plan['exact'] else 'estimated'}; nothing written)", ["", "value"], rows)
        return
    from dspark_cli.training.host import bind_threads, under_torchrun

    if loaded.train.nproc_per_node == 1:  # one process on every core: keep its threads on their cores
        bind_threads()
    from dspark_cli.training.distributed import torchrun_command

    if loaded.train.nproc_per_node > 1 and not under_torchrun():
        # flags travel as key=value overrides or --flag=value: torchrun's parser would take `--nproc` as
        # an abbreviation of its own --nproc-per-node
        args = ["train", recipe, *(overrides or []), f"train.nproc_per_node={loaded.train.nproc_per_node}",
                f"--resume={resume}"]
        args += [f"train.output_dir={output_dir}"] if output_dir else []
        cmd = torchrun_command(args, nproc=loaded.train.nproc_per_node, nnodes=loaded.train.nnodes,
                               rdzv_endpoint=loaded.train.rdzv_endpoint, run_id=loaded.name)
        say(f"launching {loaded.train.nproc_per_node} processes: {' '.join(cmd[1:5])} ...")
        raise typer.Exit(subprocess.run(cmd, check=False).returncode)
    from dspark_cli.training.metrics import format_line
    from dspark_cli.training.run import run_train
    from dspark_cli.ui import progress_bar

    main_rank = os.environ.get("RANK", "0") == "0"
    if main_rank and stdout.is_terminal:
        seen = {"tokens": 0}
        with progress_bar("train", unit="steps") as update:
            def show(record):
                seen["tokens"] += record["tokens"]
                say(format_line(record))
                update(record["step"], record["num_steps"], tokens=seen["tokens"])
            summary = run_train(loaded, resume=resume, on_log=show)
    else:
        summary = run_train(loaded, resume=resume, on_log=lambda record: say(format_line(record)))
    if main_rank:
        final = summary.get("final_metrics") or {}
        say(f"train: {summary['steps']} steps, {summary['tokens']} tokens, loss {final.get('loss', float('nan')):.4f}, "
            f"tau {final.get('tau_greedy', float('nan')):.2f} greedy / {final.get('tau_t1', float('nan')):.2f} T=1 "
            f"-> {summary['final']}; next: dspark export {summary['output_dir']}", style="green")


@app.command()
@handle_errors
def export(
    checkpoint: Annotated[str | None, typer.Argument(help="Training checkpoint directory.", show_default=False)] = None,
    overrides: OverridesArg = None,
    output: Annotated[str | None, typer.Option("--output", "-o", help="Sets export.output_dir.")] = None,
    recipe: RecipeOpt = None,
    export_format: Annotated[str | None, typer.Option("--export-format", help="Sets export.format: `vllm` or `speculators`.")] = None,
    meta: Annotated[bool, typer.Option("--meta", help="Build the draft on the meta device (no weights, no memory).")] = False,
    check: Annotated[str | None, typer.Option("--check", help="Only validate an existing draft directory.")] = None,
    target: Annotated[str | None, typer.Option("--target", help="Target to check the draft against (name or path).")] = None,
    dtype: Annotated[str | None, typer.Option(help="Sets export.dtype: bfloat16, float32 or float16.")] = None,
    include_embeddings: Annotated[
        bool, typer.Option("--include-embeddings", help="Also write the target's embed_tokens/lm_head.")
    ] = False,
    force: Annotated[bool, typer.Option("--force", help="Replace an earlier export (never any other directory).")] = False,
    dry_run: DryRunOpt = False,
    output_format: FormatOpt = "text",
) -> None:
    """Write a vLLM-native draft directory (or, with --dry-run, list every tensor it would hold).

    `dspark export --recipe kimi-k3 --meta --dry-run --format json` lists the config.json and every
    tensor (name, shape, dtype) of the draft a recipe describes, without weights or memory.
    """
    _check_format(output_format)
    checkpoint, rest = _split_positional(checkpoint, overrides)
    if check is not None:
        _export_check(check, target, output_format)
        return
    if checkpoint is None and recipe is None:
        raise UsageError("export needs a CHECKPOINT, or --recipe with --meta --dry-run, or --check DIR")
    flags = {"export.output_dir": output, "export.format": export_format, "export.dtype": dtype,
             "export.include_embeddings": include_embeddings or None}
    recipe = _recipe_beside(recipe, checkpoint)  # the resolved recipe training wrote
    loaded = _load(recipe, rest, flags) if recipe else None
    if meta:
        if loaded is None or not dry_run:
            raise UsageError("--meta builds the draft from a recipe without weights: use --recipe R --meta --dry-run")
        _export_meta_dry_run(loaded, output_format)
        return
    if checkpoint is None:
        raise UsageError("export needs a CHECKPOINT (a training output directory) unless --meta --dry-run")
    _export_checkpoint(checkpoint, loaded, output, dtype, export_format, include_embeddings, target, force,
                       dry_run, output_format)


def _export_checkpoint(checkpoint, loaded, output, dtype, export_format, include_embeddings, target, force,
                       dry_run, output_format) -> None:
    from dspark_cli.export.writer import export_draft

    if loaded is not None:
        output = output or loaded.stage_dir("export")
        dtype, export_format = loaded.export.dtype, loaded.export.format
        include_embeddings = loaded.export.include_embeddings
    result = export_draft(checkpoint, output, recipe=loaded, dtype=dtype or "bfloat16", fmt=export_format or "vllm",
                          include_embeddings=include_embeddings, target=target, dry_run=dry_run, force=force)
    if output_format == "json":
        print_json(result)
        return
    if dry_run:
        rows = [[t["name"], "x".join(map(str, t["shape"])), t["dtype"]] for t in result["tensors"]]
        print_table(f"{result['architecture']} from {result['source']} (dry run, nothing written)",
                    ["tensor", "shape", "dtype"], rows)
        say(f"files: {', '.join(result['files'])}; {result['num_tensors']} tensors, {result['num_bytes']:,} bytes")
        for line in result["findings"]:
            say(f"finding: {line}", style="red")
        return
    for line in result["warnings"]:
        say(f"warning: {line}", style="yellow")
    say(f"exported {result['architecture']} ({result['num_tensors']} tensors, {result['num_bytes']:,} bytes) "
        f"-> {result['output_dir']}; checked against vLLM 0.33's loader rules", style="green")


def _export_check(directory: str, target: str | None, output_format: str) -> None:
    from dspark_cli.errors import DsparkError
    from dspark_cli.export.integrity import draft_findings

    findings = draft_findings(directory, target, require_manifest=False)[1]
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


def _export_meta_dry_run(loaded, output_format: str) -> None:
    from dspark_cli.export.roster import export_dry_run
    from dspark_cli.targets import target_config

    if loaded.export.format != "vllm":
        raise UsageError(f"--meta --dry-run lists the vllm format; export.format is {loaded.export.format}")
    local = target_config(loaded)
    config = None
    if local is not None:
        from transformers import AutoConfig

        from dspark_cli.targets import resolve_target

        config = AutoConfig.from_pretrained(resolve_target(loaded.target.model))
    plan = export_dry_run(loaded.draft.model_dump(), loaded.target.model_dump(), config, loaded.export.dtype)
    if output_format == "json":
        print_json(plan)
        return
    rows = [[t["name"], "x".join(map(str, t["shape"])), t["dtype"]] for t in plan["tensors"]]
    print_table(f"{plan['architecture']}: model.safetensors (dry run, nothing written)", ["tensor", "shape", "dtype"], rows)
    say(f"{plan['num_tensors']} tensors, {plan['num_parameters']:,} parameters, {plan['num_bytes'] / 2**30:.2f} GiB; "
        "config.json: `--format json` prints it")


@app.command()
@handle_errors
def serve(
    draft_dir: Annotated[str | None, typer.Argument(help="Exported draft directory.", show_default=False)] = None,
    overrides: OverridesArg = None,
    recipe: RecipeOpt = None,
    port: Annotated[int | None, typer.Option(help="Sets serve.port.")] = None,
    method: Annotated[str, typer.Option(help="`dspark` (the draft), `ngram` or `none` (the target alone).")] = "dspark",
    log_file: Annotated[str | None, typer.Option("--log", help="Write vLLM's log to this file, not the terminal.")] = None,
    ready_timeout: Annotated[float, typer.Option(help="Seconds to wait for vLLM's /health.")] = 1800.0,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the `vllm serve` command; start nothing.")] = False,
) -> None:
    """Serve the target with the draft in vLLM (`--speculative-config` with method dspark).

    Settings come from the draft's manifest (block size, chat-template arguments, K3's AttnRes
    stream flag) and the recipe's `serve` section; arguments after `--` go to `vllm serve` as they
    are. The draft is checked first (checksums, vLLM loader rules, its target); trust fields of the
    draft's own recipe are refused unless you set them. vLLM runs until Ctrl-C / SIGTERM, which
    stop it and its engine processes; the endpoint and a request to paste are printed once it is
    up. `--method dspark` needs a CUDA GPU and vLLM >= 0.33; `--dry-run` prints the command.
    """
    from dspark_cli.serving.launch import serve_plan, shell_line, split_vllm_args

    draft_dir, rest, vllm_args = split_vllm_args(draft_dir, overrides)
    draft_dir, rest = _split_positional(draft_dir, rest)
    loaded = _load_beside(recipe, draft_dir, rest, {"serve.port": port})
    if loaded is None:
        raise UsageError("serve needs a draft directory exported by dspark, or --recipe", "dspark serve runs/NAME/draft")
    argv, env = serve_plan(loaded, draft_dir or loaded.stage_dir("export"), method=method, vllm_args=vllm_args)
    if dry_run:
        stdout.print(shell_line(argv, env), markup=False, highlight=False)
        return
    from dspark_cli.serving.launcher import curl_request, preflight, run_server

    vllm = preflight(method, loaded.serve.host, loaded.serve.port)

    def ready(info) -> None:
        say(f"vLLM is up (pid {info.pid}; processes {' '.join(map(str, info.pids))}): {info.url}/v1  "
            f"model {info.model}", style="green")
        say(curl_request(info.url, info.model))
        say("Ctrl-C stops it")

    say(f"starting: {shell_line(vllm.command(argv), env)}" + (f" (log: {log_file})" if log_file else ""))
    code = run_server(vllm, argv, env, host=loaded.serve.host, port=loaded.serve.port, log_file=log_file,
                      ready_timeout=ready_timeout, on_ready=ready)
    say("vLLM stopped; no process left")
    raise typer.Exit(code)


@app.command()
@handle_errors
def bench(
    draft_dir: Annotated[str | None, typer.Argument(help="Exported draft directory.", show_default=False)] = None,
    overrides: OverridesArg = None,
    recipe: RecipeOpt = None,
    offline: Annotated[bool, typer.Option("--offline", help="Run dspark's reference engine (no server).")] = False,
    endpoint: Annotated[str | None, typer.Option(help="Sets bench.endpoint (an OpenAI-compatible server).")] = None,
    baseline_endpoint: Annotated[str | None, typer.Option(
        help="Sets bench.baseline_endpoint: the same target without speculation (`dspark serve --method none`).")] = None,
    output_format: FormatOpt = "text",
) -> None:
    """Measure acceptance length (tau) offline, or throughput and tau of a running server.

    `dspark bench DRAFT_DIR --offline` runs dspark's reference engine (the recipe the draft was made
    with, unless `--recipe`); `dspark bench --endpoint URL` drives a server (`--baseline-endpoint URL`
    or `bench.baseline_report=FILE` adds speedups: tau, tokens/s, TTFT and speedup in one report). Writes bench.json, bench.md and plots to
    `bench.output_dir`.
    """
    from dspark_cli.bench.report import terminal_tables
    from dspark_cli.bench.run import run_bench
    from dspark_cli.ui import progress_bar

    _check_format(output_format)
    draft_dir, rest = _split_positional(draft_dir, overrides)
    if draft_dir is not None and not Path(draft_dir).is_dir():
        raise UsageError(f"draft directory not found: {draft_dir}", "pass the directory `dspark export` wrote")
    flags = {"bench.endpoint": endpoint, "bench.baseline_endpoint": baseline_endpoint}
    loaded = _load_beside(recipe, draft_dir, rest, flags) or _load(recipe, rest, flags)
    offline = offline or (draft_dir is not None and loaded.bench.endpoint is None)
    if output_format == "json":
        print_json(run_bench(loaded, draft_dir=draft_dir, offline=offline))
        return
    with progress_bar("bench", unit="turns") as update:
        result = run_bench(loaded, draft_dir=draft_dir, offline=offline, on_progress=update)
    for title, columns, rows in terminal_tables(result):
        print_table(title, columns, rows)
    for warning in result["warnings"]:
        say(f"warning: {warning}", style="yellow")
    files = result["files"]
    say(f"report: {files['markdown']} and {files['json']}, {len(files['plots'])} plot(s)", style="green")


@app.command()
@handle_errors
def publish(
    draft_dir: Annotated[str | None, typer.Argument(help="Exported draft directory.", show_default=False)] = None,
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
    `modelscope login` or MODELSCOPE_API_TOKEN). Each hub gets one commit. The recipe is the one
    the draft was exported with, unless `--recipe`.
    """
    from dspark_cli.publish import publish_draft

    _check_format(output_format)
    draft_dir, rest = _split_positional(draft_dir, overrides)
    loaded = _load_beside(recipe, draft_dir, rest, {"publish.repo_id": repo_id, "publish.private": False if public
                                                    else None, "publish.hubs": hub or None})
    if loaded is None:
        raise UsageError("publish needs a draft directory exported by dspark, or --recipe",
                         "dspark publish runs/NAME/draft --repo-id OWNER/NAME")
    result = publish_draft(loaded, draft_dir, dry_run=dry_run)
    if output_format == "json":
        print_json(result)
        return
    visibility = "private" if result["private"] else "public"
    title = f"{result['repo_id']} ({visibility}) on {', '.join(result['hubs'])}"
    print_table(title + (" -- dry run, nothing uploaded" if dry_run else ""), ["path in repo", "bytes", "from"],
                [[f["path"], f"{f['bytes']:,}", f["source"]] for f in result["files"]])
    if dry_run:
        say(f"model card: {result['card']}; the draft passes every static vLLM loader check")
        return
    for hub_name, url in result["urls"].items():
        say(f"published to {hub_name}: {url}", style="green")


@app.command()
@handle_errors
def run(
    recipe: RecipeArg,
    overrides: OverridesArg = None,
    publish: Annotated[bool, typer.Option(
        "--publish", help="Also publish at the end (repo and tokens are checked before the first stage).")] = False,
) -> None:
    """Run the whole pipeline from one recipe: datagen, capture, train, export, bench (and publish)."""
    from dspark_cli.errors import NotBuiltError
    from dspark_cli.pipeline import STAGES, run_pipeline

    loaded = _load(recipe, overrides)
    if publish:  # a destination and tokens now, not after hours of training
        from dspark_cli.publish import preflight

        preflight(loaded)
    say(f"dspark run: {loaded.name} on target {loaded.target.model}")
    wanted = [s.name for s in STAGES if s.name != "publish" or publish]
    from dspark_cli.ui import progress_bar

    results = run_pipeline(loaded, stages=wanted, on_stage=lambda r: say(f"  {r.name}: {r.status} {r.detail}".rstrip()),
                           progress=lambda stage, unit: progress_bar(f"  {stage}", unit=unit),
                           log_line=lambda line: say(f"  train: {line}"))
    print_table("stages", ["stage", "status", "detail"], [[r.name, r.status, r.detail] for r in results])
    _say_results({r.name: r.outputs for r in results if r.status == "done"})
    missing = [r.name for r in results if r.status == "not built"]
    if missing:
        raise NotBuiltError(
            f"pipeline incomplete: stage {missing[0]} is not built yet; later stages were skipped",
            "the stages marked done ran for real",
        )


def _say_results(outputs: dict[str, Any]) -> None:
    """The few numbers a finished run is for: where the draft is and its acceptance length."""
    if "export" in outputs:
        say(f"draft: {outputs['export']['output_dir']} ({outputs['export']['architecture']})")
    bench_result = outputs.get("bench") or {}
    for run_ in (bench_result.get("offline") or {}).get("runs", []):
        if run_.get("threshold", 0.0) == 0.0:
            low, high = run_["tau"]["ci95"]
            say(f"tau on {run_['dataset']} at T={run_['temperature']:g}: {run_['tau']['mean']:.2f} "
                f"[{low:.2f}, {high:.2f}] tokens per verification step", style="green")
    if bench_result.get("files"):
        say(f"report: {bench_result['files']['markdown']}")


def entrypoint() -> None:
    """Console-script entry point (`dspark`)."""
    import os

    # transformers' per-file "Loading weights" bars would interleave with dspark's own progress lines.
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    app()


if __name__ == "__main__":
    entrypoint()
