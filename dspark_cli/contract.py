"""The DSpark contract: what target, data, hidden states, draft and serving must agree on.

A draft that breaks the contract still loads and runs -- it just never gets a token accepted --
so every artifact records its part (in its manifest) and every stage checks it at the boundary:

    contract = contract_for_recipe(recipe)      # dspark_cli.capture: what this run expects
    contract.check_against(manifest["contract"], "runs/tiny/hidden")   # ContractError, one line

Conventions (one everywhere, translated per engine in one place):
- `target_layer_ids` are 0-based and mean *the output of decoder layer k*, i.e. transformers
  `hidden_states[k+1]`. vLLM's aux-hidden-state ids are the same numbers + 1 (see `vllm_aux_layer_ids`).
- the L1 target is the target's *post-final-norm* last hidden state (transformers 5.x
  `hidden_states[-1]`; vLLM's capture gives the pre-norm state, to which capture applies the norm).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from dspark_cli.errors import ContractError

LAYER_CONVENTION = "output_of_layer_k == transformers hidden_states[k+1]"
LAST_HIDDEN = "post_final_norm"


DEFAULT_NUM_TARGET_LAYERS = 5  # as Kimi-K3-DSpark and DFlash/DeepSpec Qwen3 drafts: five target layers


def spread_layer_ids(num_target_layers: int, count: int) -> list[int]:
    """`count` 0-based target layer ids, DFlash/DeepSpec's rule: evenly from layer 1 to L-3
    (one id: the middle layer; a very shallow target: its whole depth).
    Qwen3-8B (36 layers, 5 ids): [1, 9, 17, 25, 33]; Llama-3.1-8B (32): [1, 8, 15, 22, 29]."""
    if not 1 <= count <= num_target_layers:
        raise ContractError(
            f"draft.target_layer_ids: cannot pick {count} distinct layers of a {num_target_layers}-layer target",
            "list the ids explicitly",
        )
    if count == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    if end - start + 1 < count:
        start, end = 0, num_target_layers - 1
    return [round(start + i * (end - start) / (count - 1)) for i in range(count)]


def default_target_layer_ids(num_target_layers: int) -> list[int]:
    """The layers a draft reads when the recipe leaves `draft.target_layer_ids` empty: five of them
    (fewer for a shallower target), spread by `spread_layer_ids`, whatever the draft's own depth.
    Capture, training, export and `--meta` dry runs all use this one rule."""
    return spread_layer_ids(num_target_layers, min(DEFAULT_NUM_TARGET_LAYERS, num_target_layers))


def vllm_aux_layer_ids(target_layer_ids: list[int]) -> list[int]:
    """vLLM numbers aux hidden states by the layer *input* they are read at: our id + 1."""
    return [i + 1 for i in target_layer_ids]


@dataclass(frozen=True)
class Contract:
    """What every artifact of one DSpark run must agree on. Fields left None are not checked."""

    target: str  # recipe target.model (bundled name, path or hub id)
    target_config_sha256: str | None
    target_layer_ids: tuple[int, ...]
    layer_convention: str = LAYER_CONVENTION
    last_hidden: str = LAST_HIDDEN
    chat_template_sha256: str | None = None
    mask_token_id: int | None = None
    block_size: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # e.g. {"aux_attn_res_stream": false} for K3

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["target_layer_ids"] = list(self.target_layer_ids)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Contract:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        known["target_layer_ids"] = tuple(known.get("target_layer_ids", ()))
        return cls(**known)

    def differences(self, other: Contract) -> list[str]:
        """`field: ours vs theirs` for every field both sides set and disagree on."""
        diffs = []
        mine, theirs = self.to_dict(), other.to_dict()
        for key, value in mine.items():
            if key == "extra":
                for name, sub in value.items():
                    if name in theirs["extra"] and theirs["extra"][name] != sub:
                        diffs.append(f"{name}: {sub!r} here vs {theirs['extra'][name]!r}")
                continue
            if value is None or theirs.get(key) is None or key == "target":
                continue
            if value != theirs[key]:
                diffs.append(f"{key}: {value!r} here vs {theirs[key]!r}")
        return diffs

    def check_against(self, found: dict[str, Any] | Contract, where: str) -> None:
        """Raise ContractError (one line) when the artifact at `where` was made under another contract."""
        other = found if isinstance(found, Contract) else Contract.from_dict(found)
        diffs = self.differences(other)
        if diffs:
            more = f" (+{len(diffs) - 1} more)" if len(diffs) > 1 else ""
            raise ContractError(
                f"{where} was made under a different contract: {diffs[0]}{more}",
                "use the recipe it was made with, or regenerate it with this one",
            )
