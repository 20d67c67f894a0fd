"""`dspark serve`: vLLM with the draft as speculative model, every setting taken from the draft's manifest.

    dspark serve runs/tiny/draft --dry-run                  # print the command and environment
    dspark serve runs/kimi-k3-dspark/draft --recipe kimi-k3 # run it (GPU, vLLM >= 0.33)

The command always passes `"method": "dspark"` (vLLM does not auto-detect `K3DSparkModel`), the
block size the draft was trained with as `num_speculative_tokens`, the chat-template arguments
datagen used (so serving renders prompts as the training data did), K3's
`VLLM_KIMI_K3_AUX_ATTN_RES_STREAM` as it was at capture, and `VLLM_USE_V2_MODEL_RUNNER=1`
(DSpark runs on vLLM's V2 model runner only).
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from dspark_cli.errors import DataError, DsparkError, UsageError


def draft_manifest(draft_dir: Path) -> dict[str, Any]:
    """The dspark_manifest.json of an exported draft, or a one-line UsageError (serve and publish need it)."""
    from dspark_cli.export.integrity import read_draft_manifest

    return read_draft_manifest(draft_dir)


def serve_plan(recipe: Any, draft_dir: str | Path) -> tuple[list[str], dict[str, str]]:
    """`serve_command` for a draft that passes every check (`verify_draft`: checksums, vLLM loader rules,
    the target it was trained for, its serving env); a draft dir that does not exist yet gives the
    command for the recipe alone (`--dry-run --recipe R` before training)."""
    from dspark_cli.export.integrity import verify_draft

    if Path(draft_dir).exists():
        verify_draft(draft_dir, recipe.target.model, doing="not serving it")
    return serve_command(recipe, draft_dir)


def serve_command(recipe: Any, draft_dir: str | Path, *,
                  draft_ref: str | None = None) -> tuple[list[str], dict[str, str]]:
    """(argv, extra environment) of the `vllm serve` launch for `recipe` and the draft at `draft_dir`;
    `draft_ref` names the draft in the command instead of its local path (a hub repo id, for model cards)."""
    from dspark_cli.targets.registry import resolve_target

    draft_dir = Path(draft_dir)
    manifest = draft_manifest(draft_dir) if draft_dir.exists() else {}
    serving = manifest.get("serving", {})
    serve = recipe.serve
    block = serve.num_speculative_tokens or serving.get("num_speculative_tokens") or recipe.draft.block_size
    spec: dict[str, Any] = {"method": "dspark", "model": draft_ref or str(draft_dir.resolve()),
                            "num_speculative_tokens": block,
                            "draft_sample_method": serve.draft_sample_method,
                            "rejection_sample_method": serve.rejection_sample_method}
    if serve.attention_backend:
        spec["attention_backend"] = serve.attention_backend
    if serve.enable_adaptive_verification:
        spec["enable_adaptive_verification"] = True
    local = resolve_target(recipe.target.model)
    target = str(local) if local is not None else recipe.target.model
    argv = ["vllm", "serve", target, "--host", serve.host, "--port", str(serve.port),
            "--tensor-parallel-size", str(serve.tensor_parallel_size),
            "--gpu-memory-utilization", str(serve.gpu_memory_utilization),
            "--max-model-len", str(recipe.target.max_model_len),
            "--speculative-config", json.dumps(spec)]
    if recipe.target.revision:
        argv += ["--revision", recipe.target.revision]
    if recipe.target.trust_remote_code:
        argv.append("--trust-remote-code")
    kwargs = serving.get("chat_template_kwargs", recipe.target.chat_template_kwargs)
    if kwargs:
        argv += ["--default-chat-template-kwargs", json.dumps(kwargs)]
    argv += list(serve.extra_args)
    from dspark_cli.export.integrity import serving_findings

    refused = [f for f in serving_findings(manifest) if f.severity == "error"]
    if refused:  # never hand vLLM what a draft may not ask for, whoever calls this
        raise DataError(f"{draft_dir}: {refused[0].line()}", "export the draft again")
    env = {"VLLM_USE_V2_MODEL_RUNNER": "1", **serving.get("env", {})}
    if "VLLM_KIMI_K3_AUX_ATTN_RES_STREAM" not in env and recipe.capture.aux_attn_res_stream:
        env["VLLM_KIMI_K3_AUX_ATTN_RES_STREAM"] = "1"
    return argv, env


def shell_line(argv: list[str], env: dict[str, str]) -> str:
    return " ".join([f"{k}={shlex.quote(v)}" for k, v in env.items()] + [shlex.quote(a) for a in argv])


def launch(argv: list[str], env: dict[str, str]) -> None:
    """Replace this process with vLLM (needs a CUDA GPU: DSpark runs on vLLM's V2 GPU runner)."""
    import os
    import shutil

    import torch

    if not torch.cuda.is_available():
        raise DsparkError("DSpark serving needs a CUDA GPU (vLLM's V2 model runner); none is visible here",
                          "`dspark serve --dry-run` prints the command to run on a GPU machine")
    if shutil.which(argv[0]) is None:
        raise UsageError("the `vllm` command is not installed", "pip install 'dspark[gpu]' (vLLM 0.33)")
    os.execvpe(argv[0], argv, {**os.environ, **env})
