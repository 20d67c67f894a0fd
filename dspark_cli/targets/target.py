"""The target of a recipe, asked in one place: `Target`, which every stage asks for what it needs of it.

    from dspark_cli.targets import Target
    target = Target.of(recipe)             # the recipe's `target` section; Target.named(path) for a bare name
    target.location                        # "/.../tiny/tiny-mla" (bundled or local), or the hub id as written
    target.local                           # its local directory (files checked), or None for a hub id
    target.directory()                     # a local directory: its own, or its hub-cache snapshot
    target.config()                        # the (text) config.json as a dict when local, else None
    target.full_config()                   # the whole config.json when local (a broken one raises), else None
    target.snapshot_config()               # the whole config.json of directory() (local or hub-cache snapshot)
    target.transformers_config()           # the same as transformers' AutoConfig reads it
    target.geometry()                      # TargetGeometry: depth, width, vocab, model type, fingerprint
    target.draft_arch(recipe.draft.arch)   # "mla" or "gqa": the choice, or inferred from the model type
    target.tokenizer()                     # transformers tokenizer (target.tokenizer, else the target's)
    target.mask_token_id(recipe.draft.mask_token_id)   # the override, else the tokenizer's mask token
    Target.stop_ids(tokenizer, model.generation_config)  # the token ids that end a turn (datagen, bench)
    target.embeddings()                    # its frozen (embed_tokens, lm_head), read from the safetensors
    target.causal_lm(dtype="auto")         # (transformers model on its device, device): capture, datagen, bench

The chat template is applied by `ChatFormat` (targets/chat.py) on the tokenizer returned here; a bare
name resolves with `resolve_target` (registry.py). Import-light: torch, transformers and huggingface_hub
are imported inside the methods that need them.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dspark_cli.errors import ContractError, DsparkError, UsageError
from dspark_cli.targets.files import check_target_files, read_target_config
from dspark_cli.targets.registry import resolve_target

if TYPE_CHECKING:
    import torch

    from dspark_cli.recipe.schema import Recipe, TargetSection

MLA_MODEL_TYPES = ("deepseek_v3", "deepseek_v2", "kimi_k2", "kimi_k3", "kimi_linear")


@dataclass(frozen=True)
class TargetGeometry:
    """What the stages need to know about the target, from its config.json, else from the recipe.

    `num_hidden_layers` / `hidden_size` are None only from `Target.geometry(strict=False)`.
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


def config_sha256(config: dict[str, Any]) -> str:
    """Fingerprint of a target's whole config.json (the contract's `target_config_sha256`): key order and
    whitespace do not count."""
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()


def _text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's part of a config (`text_config` of a multimodal one), with the outer model_type."""
    inner = config.get("text_config")
    if not isinstance(inner, dict):
        return dict(config)
    text = dict(inner)
    text.setdefault("model_type", config.get("model_type"))
    return text


class Target:
    """A recipe's `target` section and everything the stages read of the model it names."""

    def __init__(self, section: TargetSection) -> None:
        self.section = section

    @classmethod
    def of(cls, recipe: Recipe) -> Target:
        return cls(recipe.target)

    @classmethod
    def named(cls, model: str, *, revision: str | None = None, trust_remote_code: bool = False) -> Target:
        """A target known by name or path only (a manifest's, an engine's), with the recipe defaults."""
        from dspark_cli.recipe.schema import TargetSection

        return cls(TargetSection(model=model, revision=revision, trust_remote_code=trust_remote_code))

    @property
    def name(self) -> str:
        """The target as the recipe writes it (bundled name, path or hub id)."""
        return self.section.model

    @cached_property
    def local(self) -> Path | None:
        """Its local directory, files checked (`resolve_target`); None for a hub id."""
        return resolve_target(self.section.model)

    @property
    def location(self) -> str:
        """Local directory of the target (bundled name or path), or its hub repo id."""
        return str(self.local) if self.local is not None else self.section.model

    def directory(self) -> Path:
        """A local directory holding the target's config and weights: its own, or its hub-cache snapshot."""
        if self.local is not None:
            return self.local
        try:
            from huggingface_hub import snapshot_download

            return Path(
                snapshot_download(
                    self.section.model,
                    revision=self.section.revision,
                    local_files_only=True,
                    allow_patterns=["*.json", "*.safetensors"],
                )
            )
        except Exception:  # noqa: BLE001 - any hub/cache failure means the same thing to the user
            raise UsageError(
                f"target {self.section.model} is not available locally",
                f"download it first: hf download {self.section.model}",
            ) from None

    def full_config(self) -> dict[str, Any] | None:
        """The whole config.json of a target on this machine, else None (hub id); a broken one raises."""
        return None if self.local is None else check_target_files(self.local)

    def snapshot_config(self) -> dict[str, Any]:
        """The whole config.json of `directory()`: the local target's, or its hub-cache snapshot's."""
        return read_target_config(self.directory())

    def config(self) -> dict[str, Any] | None:
        """The target's (text) config.json as a dict when it is local, else None.

        None too when the target is unusable (unknown, no config.json, corrupt files): `dspark validate`
        reports that as the recipe's problem, so the checks that only need geometry stay quiet.
        """
        try:
            config = self.full_config()
        except DsparkError:
            return None
        return None if config is None else _text_config(config)

    def transformers_config(self) -> Any:
        """The target's config as transformers reads it (`AutoConfig`, a multimodal one whole)."""
        from transformers import AutoConfig

        return AutoConfig.from_pretrained(
            self.location, revision=self.section.revision, trust_remote_code=self.section.trust_remote_code
        )

    def geometry(self, *, strict: bool = True) -> TargetGeometry:
        """Depth and width of the target from its local config.json, else from the recipe's declared values.

        strict (every stage): unknown depth or width is a UsageError, a declaration that contradicts the
        config a ContractError. Not strict (`dspark validate`'s checks): unknown values are None and a
        broken target reads as a hub id (the checks report both as recipe problems of their own).
        """
        declared = self.section
        try:
            local = self.local
        except DsparkError:
            if strict:
                raise
            local = None
        config = {} if local is None else _text_config(check_target_files(local))
        depth = config.get("num_hidden_layers", declared.num_hidden_layers)
        width = config.get("hidden_size", declared.hidden_size)
        if strict:
            if depth is None or width is None:
                raise UsageError(
                    f"target {declared.model}: depth and hidden size unknown (not a local model directory)",
                    "download it to a directory, or declare target.num_hidden_layers and target.hidden_size",
                )
            for name, value, found in (
                ("num_hidden_layers", declared.num_hidden_layers, depth),
                ("hidden_size", declared.hidden_size, width),
            ):
                if value is not None and value != found:
                    raise ContractError(
                        f"target.{name}: the recipe declares {value}, the target's config.json has {found}",
                        f"remove target.{name} or fix it",
                    )
        return TargetGeometry(
            location=str(local) if local is not None else declared.model,
            model_type=config.get("model_type"),
            num_hidden_layers=None if depth is None else int(depth),
            hidden_size=None if width is None else int(width),
            rms_norm_eps=config.get("rms_norm_eps"),
            config_sha256=None if local is None else config_sha256(check_target_files(local)),
            vocab_size=config.get("vocab_size", declared.vocab_size),
        )

    def draft_arch(self, choice: str = "auto") -> str | None:
        """`mla` or `gqa`: `choice` (draft.arch) unless `auto`, else inferred from the model type (None if unknown)."""
        if choice != "auto":
            return choice
        model_type = self.geometry(strict=False).model_type
        if model_type is None:
            return None
        return "mla" if model_type in MLA_MODEL_TYPES else "gqa"

    def tokenizer(self) -> Any:
        """The target's tokenizer (or `target.tokenizer`); one-line UsageError when it cannot be loaded."""
        from transformers import AutoTokenizer

        name = self.section.tokenizer or self.location
        try:
            return AutoTokenizer.from_pretrained(
                name, revision=self.section.revision, trust_remote_code=self.section.trust_remote_code
            )
        except (OSError, ValueError) as exc:
            raise UsageError(
                f"cannot load the tokenizer of {name}: {str(exc).splitlines()[0][:200]}",
                "check target.model / target.tokenizer (offline: a local directory)",
            ) from None

    def mask_token_id(self, override: int | None = None) -> int | None:
        """`override` (draft.mask_token_id), else the tokenizer's mask token id (None when it has none)."""
        if override is not None:
            return override
        try:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(self.section.tokenizer or str(self.directory()))
        except (OSError, ValueError):
            return None
        return tokenizer.mask_token_id

    @staticmethod
    def stop_ids(tokenizer: Any, generation_config: Any = None, *, required: bool = False) -> frozenset[int]:
        """The token ids that end the target's turn: its generation config's `eos_token_id` (one or a list)
        and the tokenizer's. Empty when neither names one, or a UsageError when `required` (datagen)."""
        ids: set[int] = set()
        for source in (getattr(generation_config, "eos_token_id", None), tokenizer.eos_token_id):
            if isinstance(source, int):
                ids.add(source)
            elif isinstance(source, (list, tuple)):
                ids.update(int(i) for i in source)
        if required and not ids:
            raise UsageError(
                "the target's tokenizer defines no end-of-sequence token", "set eos_token in its tokenizer_config.json"
            )
        return frozenset(ids)

    def embeddings(self, dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(embed_tokens [V, H], lm_head [V, H]) of the target, frozen, cast to `dtype` (float32 by default)."""
        import torch

        from dspark_cli.targets.weights import load_embeddings

        return load_embeddings(self.directory(), dtype or torch.float32)

    def final_norm(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The gain of the target's final RMSNorm [H], cast to `dtype` (float32 by default)."""
        import torch

        from dspark_cli.targets.weights import load_final_norm

        return load_final_norm(self.directory(), dtype or torch.float32)

    def causal_lm(self, *, dtype: str = "auto", device: str | None = None) -> tuple[Any, str]:
        """The target as a transformers causal LM, moved to `device`, and that device: the one place a stage
        loads the target with transformers (capture's hf backend, datagen's hf engine, bench's reference
        engine). `device` None: CUDA where there is one, else the CPU; `dtype` `auto`: bfloat16 on CUDA,
        float32 on the CPU."""
        import torch
        from transformers import AutoModelForCausalLM

        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        torch_dtype = {
            "auto": torch.bfloat16 if device.startswith("cuda") else torch.float32,
            "float32": torch.float32,
            "bfloat16": torch.bfloat16,
            "float16": torch.float16,
        }[dtype]
        model = AutoModelForCausalLM.from_pretrained(
            self.location,
            dtype=torch_dtype,
            trust_remote_code=self.section.trust_remote_code,
            revision=self.section.revision,
        )
        return model.to(device), device
