"""The target of a recipe, asked in one place: where it is, its config, its geometry, its tokenizer.

    from dspark_cli.targets import target_location, target_geometry, load_tokenizer
    target_location(recipe)          # "/.../tiny/tiny-mla" (bundled or local), or the hub id as written
    target_directory(recipe)         # a local directory: the target's, or its hub-cache snapshot
    target_config(recipe)            # the (text) config.json as a dict when local, else None
    target_geometry(recipe)          # TargetGeometry: depth, width, vocab, model type (from config or recipe)
    draft_arch(recipe)               # "mla" or "gqa": draft.arch, or inferred from the target's model type
    stop_ids(tokenizer, model.generation_config)   # the token ids that end a turn (datagen, bench)
    load_tokenizer(recipe)           # transformers tokenizer (target.tokenizer or the target)
    load_causal_lm(path, dtype="auto")  # (transformers model on its device, device): capture, datagen, bench

Every stage asks these (and `resolve_target` for a bare name); the chat template is applied by
`ChatFormat` (targets/chat.py) on the tokenizer returned here. Import-light: transformers and
huggingface_hub are imported inside the functions that need them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dspark_cli.errors import ContractError, DsparkError, UsageError
from dspark_cli.targets.files import check_target_files
from dspark_cli.targets.registry import resolve_target

if TYPE_CHECKING:
    from dspark_cli.recipe.schema import Recipe


def target_location(recipe: Recipe) -> str:
    """Local directory of the target (bundled name or path), or its hub repo id."""
    local = resolve_target(recipe.target.model)
    return str(local) if local is not None else recipe.target.model


def target_directory(recipe: Recipe) -> Path:
    """A local directory holding the target's config and weights: its own, or its hub-cache snapshot."""
    path = resolve_target(recipe.target.model)
    if path is not None:
        return path
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(recipe.target.model, revision=recipe.target.revision, local_files_only=True,
                                      allow_patterns=["*.json", "*.safetensors"]))
    except Exception:  # noqa: BLE001 - any hub/cache failure means the same thing to the user
        raise UsageError(f"target {recipe.target.model} is not available locally",
                         f"download it first: hf download {recipe.target.model}") from None


def local_config(target: str | None) -> dict[str, Any] | None:
    """The whole config.json of a target on this machine (bundled name or local path), else None (hub id)."""
    if target is None:
        return None
    directory = resolve_target(target)
    return None if directory is None else check_target_files(directory)


def _text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's part of a config (`text_config` of a multimodal one), with the outer model_type."""
    inner = config.get("text_config")
    if not isinstance(inner, dict):
        return dict(config)
    text = dict(inner)
    text.setdefault("model_type", config.get("model_type"))
    return text


def target_config(recipe: Recipe) -> dict[str, Any] | None:
    """The target's (text) config.json as a dict when it is local, else None.

    None too when the target is unusable (unknown, no config.json, corrupt files): `dspark validate`
    reports that as the recipe's problem, so the checks that only need geometry stay quiet.
    """
    try:
        config = local_config(recipe.target.model)
    except DsparkError:
        return None
    return None if config is None else _text_config(config)


@dataclass(frozen=True)
class TargetGeometry:
    """What the stages need to know about the target, from its config.json, else from the recipe.

    `num_hidden_layers` / `hidden_size` are None only from `target_geometry(recipe, strict=False)`.
    """

    location: str  # local directory, or a hub id
    model_type: str | None
    num_hidden_layers: int | None
    hidden_size: int | None
    rms_norm_eps: float | None
    config_sha256: str | None
    vocab_size: int | None = None

    @property
    def is_kimi_k3(self) -> bool:
        name = f"{self.model_type or ''} {self.location}".lower().replace("_", "-")
        return "kimi-k3" in name


def target_geometry(recipe: Recipe, *, strict: bool = True) -> TargetGeometry:
    """Depth and width of the target from its local config.json, else from the recipe's declared values.

    strict (every stage): unknown depth or width is a UsageError, a declaration that contradicts the
    config a ContractError. Not strict (`dspark validate`'s checks): unknown values are None and a
    broken target reads as a hub id (the checks report both as recipe problems of their own).
    """
    from dspark_cli.contract import config_sha256

    declared = recipe.target
    try:
        local = resolve_target(declared.model)
    except DsparkError:
        if strict:
            raise
        local = None
    config = {} if local is None else _text_config(check_target_files(local))
    depth = config.get("num_hidden_layers", declared.num_hidden_layers)
    width = config.get("hidden_size", declared.hidden_size)
    if strict:
        if depth is None or width is None:
            raise UsageError(f"target {declared.model}: depth and hidden size unknown (not a local model directory)",
                             "download it to a directory, or declare target.num_hidden_layers and target.hidden_size")
        for name, value, found in (("num_hidden_layers", declared.num_hidden_layers, depth),
                                   ("hidden_size", declared.hidden_size, width)):
            if value is not None and value != found:
                raise ContractError(f"target.{name}: the recipe declares {value}, the target's config.json has {found}",
                                    f"remove target.{name} or fix it")
    return TargetGeometry(
        location=str(local) if local is not None else declared.model,
        model_type=config.get("model_type"),
        num_hidden_layers=None if depth is None else int(depth),
        hidden_size=None if width is None else int(width),
        rms_norm_eps=config.get("rms_norm_eps"),
        config_sha256=config_sha256(local),
        vocab_size=config.get("vocab_size", declared.vocab_size),
    )


def load_tokenizer(recipe: Recipe) -> Any:
    """The target's tokenizer (or `target.tokenizer`); one-line UsageError when it cannot be loaded."""
    from transformers import AutoTokenizer

    name = recipe.target.tokenizer or target_location(recipe)
    try:
        return AutoTokenizer.from_pretrained(name, revision=recipe.target.revision,
                                             trust_remote_code=recipe.target.trust_remote_code)
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot load the tokenizer of {name}: {str(exc).splitlines()[0][:200]}",
                         "check target.model / target.tokenizer (offline: a local directory)") from None


def load_causal_lm(path: str, *, dtype: str = "auto", device: str | None = None, trust_remote_code: bool = False,
                   revision: str | None = None) -> tuple[Any, str]:
    """The target as a transformers causal LM, moved to `device`, and that device: the one place a stage
    loads the target with transformers (capture's hf backend, datagen's hf engine, bench's reference
    engine). `device` None: CUDA where there is one, else the CPU; `dtype` `auto`: bfloat16 on CUDA,
    float32 on the CPU (what each of the three loads it replaces did)."""
    import torch
    from transformers import AutoModelForCausalLM

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    torch_dtype = {"auto": torch.bfloat16 if device.startswith("cuda") else torch.float32,
                   "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype, trust_remote_code=trust_remote_code,
                                                 revision=revision)
    return model.to(device), device


def mask_token_id(recipe: Recipe, target_dir: Path) -> int | None:
    """`draft.mask_token_id`, else the target tokenizer's mask token id (None when it has none)."""
    if recipe.draft.mask_token_id is not None:
        return recipe.draft.mask_token_id
    try:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(recipe.target.tokenizer or str(target_dir))
    except (OSError, ValueError):
        return None
    return tokenizer.mask_token_id


MLA_MODEL_TYPES = ("deepseek_v3", "deepseek_v2", "kimi_k2", "kimi_k3", "kimi_linear")


def draft_arch(recipe: Recipe) -> str | None:
    """`mla` or `gqa`: the recipe's choice, or inferred from the target's model type (None if unknown)."""
    if recipe.draft.arch != "auto":
        return recipe.draft.arch
    model_type = target_geometry(recipe, strict=False).model_type
    if model_type is None:
        return None
    return "mla" if model_type in MLA_MODEL_TYPES else "gqa"


def stop_ids(tokenizer: Any, generation_config: Any = None) -> frozenset[int]:
    """The token ids that end the target's turn: its generation config's `eos_token_id` (one or a list) and
    the tokenizer's; empty when neither names one."""
    ids: set[int] = set()
    for source in (getattr(generation_config, "eos_token_id", None), tokenizer.eos_token_id):
        if isinstance(source, int):
            ids.add(source)
        elif isinstance(source, (list, tuple)):
            ids.update(int(i) for i in source)
    return frozenset(ids)
