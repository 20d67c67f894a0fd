"""A draft on disk, read back: a training output or an exported draft directory, and its manifest.

Accepted inputs (`dspark export CHECKPOINT`):
- a training output directory (`runs/tiny/train`): its consolidated `final/` is used, or with
  `select="best"` its `best/` when training kept one (the validation's choice; else `final/`), and its
  `manifest.json` (`artifacts.train.read_train_manifest`) supplies the contract and the training summary;
- a directory holding `model.safetensors` + `config.json` (a `final/` or `best/` dir, or an exported draft).

    draft = load_draft_dir("runs/tiny/train")       # -> LoadedDraft(config, state_dict, manifest)
    model = build_model(draft.config, draft.state_dict)
    manifest = read_draft_manifest("runs/tiny/draft")  # dspark_manifest.json of an export, or one-line error
    block = draft_block_size("runs/tiny/draft")         # tokens drafted per pass, from its config.json
    recipe_file = recipe_of_dir("runs/tiny/draft")      # the recipe it carries (recipe.trust decides what counts)

Every stage that loads a draft (training's evaluation, bench, serve, publish) reads it here; the
checks an exported draft must pass before it is trusted are `dspark_cli.export.verify_draft`.
The block size is the draft's config.json's, as vLLM reads it (`draft.speculators.block_size_of`):
`dspark_manifest.json` repeats it for people and the model card, and `verify_draft` refuses a
draft whose copies disagree.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dspark_cli.errors import DataError, UsageError
from dspark_cli.recipe.bounded import read_json

WEIGHTS = "model.safetensors"
CONFIG = "config.json"
DRAFT_MANIFEST = "dspark_manifest.json"  # what export writes next to the draft's files
# what export writes, besides it; the acceptance profile (artifacts/profile.py) is copied in after the manifest is
# written, so the manifest never checksums it (its fingerprint names the weights it measured)
DRAFT_FILES = ("config.json", "model.safetensors", "recipe.yaml", "speculation_profile.json")


def read_draft_manifest(draft_dir: str | Path) -> dict[str, Any]:
    """The draft's dspark_manifest.json; one-line UsageError when absent, DataError when unreadable."""
    path = Path(draft_dir) / DRAFT_MANIFEST
    if not path.is_file():
        raise UsageError(
            f"{draft_dir} is not a dspark draft directory (no {DRAFT_MANIFEST})",
            "export one first: dspark export runs/NAME/train -o DIR",
        )
    try:
        data = read_json(path)  # nested too deeply or not UTF-8: a ValueError too
    except (ValueError, OSError) as exc:
        raise DataError(f"{path}: unreadable ({exc})", "export the draft again") from None
    if not isinstance(data, dict) or data.get("kind") != "dspark.draft":
        raise DataError(f"{path} is not the manifest of a dspark draft", "export the draft again")
    return data


def draft_block_size(draft_dir: str | Path) -> int:
    """Tokens drafted per pass by the draft at `draft_dir`: its config.json's block size (`block_size_of`,
    as vLLM reads it); one-line DataError when config.json does not give one."""
    from dspark_cli.draft.speculators import block_size_of

    path = Path(draft_dir) / CONFIG
    try:
        config = read_json(path)
    except (ValueError, OSError) as exc:
        raise DataError(f"{path}: unreadable ({exc})", "export the draft again") from None
    block = block_size_of(config) if isinstance(config, dict) else None
    if not isinstance(block, int) or isinstance(block, bool) or block < 1:
        raise DataError(f"{path}: no block size (block_size: {block!r})", "export the draft again")
    return block


def recipe_of_dir(directory: str | Path) -> str | None:
    """The recipe file a draft dir carries: its recipe.yaml, else its manifest's recipe written to a temp file;
    None when it has neither. A manifest that is there but broken is its reader's one-line error."""
    import yaml

    directory = Path(directory)
    if (directory / "recipe.yaml").is_file():
        return str(directory / "recipe.yaml")
    if not (directory / DRAFT_MANIFEST).is_file():
        return None
    recipe = read_draft_manifest(directory).get("recipe")
    if not isinstance(recipe, dict) or not recipe:
        return None
    handle = tempfile.NamedTemporaryFile("w", prefix="dspark-draft-recipe-", suffix=".yaml", delete=False)  # noqa: SIM115
    with handle:
        yaml.safe_dump(recipe, handle, sort_keys=False)
    return handle.name


@dataclass
class LoadedDraft:
    source: Path
    config: Any  # DSparkDraftConfig
    state_dict: dict[str, Any]  # name -> torch.Tensor (as stored)
    train_manifest: dict[str, Any] = field(default_factory=dict)

    @property
    def selected(self) -> dict[str, Any] | None:
        """Which draft of its training run this is: {checkpoint: best, step, metric, value} for `best/`,
        {checkpoint: final, step} for `final/`; None for a directory outside a training run."""
        from dspark_cli.artifacts.train import BEST_DIR, best_record

        if not self.train_manifest:
            return None
        if self.source.name == BEST_DIR:
            return {"checkpoint": BEST_DIR, **(best_record(self.train_manifest) or {})}
        return {"checkpoint": "final", "step": (self.train_manifest.get("summary") or {}).get("steps")}


def draft_config_from_vllm_dict(data: dict[str, Any]) -> Any:
    """The inverse of `vllm_config_dict`: a DSparkDraftConfig from an exported config.json (either format)."""
    from dspark_cli.draft.config import DraftConfigError, DSparkDraftConfig
    from dspark_cli.draft.speculators import BLOCK_SIZE_KEYS, block_size_of, from_speculators, is_speculators

    block_size = block_size_of(data)
    if is_speculators(data):  # `dspark export --export-format speculators`: read as vLLM reads it
        try:
            data = from_speculators(data)
        except ValueError as exc:
            raise UsageError(
                f"config.json: not a speculators config vLLM reads ({exc})", "export the draft again"
            ) from None
    if block_size is None:  # vLLM would need num_speculative_tokens on every launch; nothing here guesses it
        raise DraftConfigError(
            f"config.json: no block size ({' or '.join(BLOCK_SIZE_KEYS)})",
            "write the block size the draft was trained with, or export the draft again",
        )
    architectures = data.get("architectures") or []
    if "K3DSparkModel" in architectures:
        arch = "mla"
    elif "Qwen3DSparkModel" in architectures:
        arch = "gqa"
    else:
        raise UsageError(
            f"config.json architectures {architectures} is not a DSpark draft",
            "expected K3DSparkModel (MLA) or Qwen3DSparkModel (GQA)",
        )
    keep = {k: v for k, v in data.items() if k not in BLOCK_SIZE_KEYS}
    keep["block_size"] = block_size
    for key in (
        "architectures",
        "model_type",
        "torch_dtype",
        "dtype",
        "n_routed_experts",
        "n_shared_experts",
        "num_experts_per_tok",
        "attention_bias",
        "use_sliding_window",
        "sliding_window",
        "layer_types",
        "transformers_version",
        "rope_theta",
    ):
        keep.pop(key, None)
    if arch == "mla":
        keep.pop("num_key_value_heads", None)
        keep.pop("head_dim", None)
    return DSparkDraftConfig(arch=arch, **keep)


def _resolve(path: Path, select: str = "final") -> tuple[Path, dict[str, Any]]:
    """(directory with weights + config, training manifest or {}).

    A training output directory must hold the manifest of a finished run, and so must the parent of
    a `final/` or `best/` directory passed itself; `select="best"` takes its `best/` when the manifest
    records one. Any other directory of weights (an exported draft, a copy) takes a training run's
    manifest.json beside it or in its parent when there is one, and ignores any other file of that
    name (another tool's)."""
    from dspark_cli.artifacts.files import MANIFEST_NAME, manifest_kind
    from dspark_cli.artifacts.train import BEST_DIR, KIND, best_record, read_train_manifest

    if (path / "final" / WEIGHTS).is_file():
        manifest = read_train_manifest(path)
        if select == BEST_DIR and best_record(manifest) is not None and (path / BEST_DIR / WEIGHTS).is_file():
            return path / BEST_DIR, manifest
        return path / "final", manifest
    if (path / WEIGHTS).is_file():
        if path.name in ("final", BEST_DIR) and (path.parent / MANIFEST_NAME).is_file():
            return path, read_train_manifest(path.parent)
        beside = next((d for d in (path, path.parent) if manifest_kind(d) == KIND), None)
        return path, read_train_manifest(beside) if beside is not None else {}
    if (path / "checkpoints").is_dir():
        raise UsageError(
            f"{path} has checkpoints but no consolidated final/ draft (training did not finish)",
            "finish it with `dspark train --resume auto`, then export",
        )
    raise UsageError(f"{path}: no {WEIGHTS} here or in final/", "pass a training output dir or a draft dir")


def load_draft_dir(path: str | Path, select: str = "final") -> LoadedDraft:
    """Read config + weights of a trained or exported draft (any dtype; nothing is cast here); of a training
    run, `final/`, or with `select="best"` its `best/` when it kept one."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    source = Path(path)
    if not source.exists():
        raise UsageError(f"checkpoint not found: {source}", "pass the training output directory (e.g. runs/NAME/train)")
    directory, manifest = _resolve(source, select)
    config_file = directory / CONFIG
    if not config_file.is_file():
        raise DataError(f"{directory}: {CONFIG} missing next to {WEIGHTS}")
    try:
        data = read_json(config_file)
    except json.JSONDecodeError as exc:
        raise DataError(
            f"{config_file}: invalid JSON ({exc.msg} at line {exc.lineno})", "re-export or re-train"
        ) from None
    if not isinstance(data, dict):
        raise DataError(f"{config_file}: not a JSON object (a {type(data).__name__})", "re-export or re-train")
    config = draft_config_from_vllm_dict(data)
    try:
        state_dict = load_file(str(directory / WEIGHTS))
    except (SafetensorError, OSError) as exc:
        raise DataError(f"{directory / WEIGHTS}: unreadable ({exc})", "re-export or re-train") from None
    return LoadedDraft(directory, config, state_dict, manifest)


def build_model(config: Any, state_dict: dict[str, Any], dtype: Any = None) -> Any:
    """A DSparkDraftModel holding `state_dict` (strict: every name must match)."""

    from dspark_cli.draft.model import meta_model

    model = meta_model(config)
    # clone(): tensors read by safetensors may sit at unaligned addresses, and CPU matmul kernels then
    # take other code paths whose rounding differs in the last bit; owned copies make loads bitwise stable.
    own = {k: v.clone() for k, v in state_dict.items() if not k.endswith(("embed_tokens.weight", "lm_head.weight"))}
    model.load_state_dict(own, strict=True, assign=True)
    if dtype is not None:
        model = model.to(dtype)
    return model
