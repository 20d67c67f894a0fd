"""What capture will do, decided before any model is loaded: target geometry, layer ids, contract, shards.

    from dspark_cli.capture import plan_capture
    plan_capture(load_recipe("tiny"))     # sequences, tokens, bytes/token, offline cache size, output dir

Only the standard library (and the recipe / contract modules) is imported here, so `dspark train
--dry-run` can print the plan without torch. The plan reads the finished datagen output (JSONL) to
count tokens; the shard split it makes is deterministic, which is what makes capture resumable.

`validation_plan(recipe)` is the same plan over the datagen validation split (`<datagen dir>/validation/`):
captured apart, offline into `<capture dir>/validation/` and online by producer 0 under the stream's
`validation/` keys, never into the training shards.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from dspark_cli.artifacts.datagen import datagen_manifest, iter_records, validation_ids
from dspark_cli.contract import Contract
from dspark_cli.errors import ContractError, DataError, UsageError
from dspark_cli.recipe import Recipe
from dspark_cli.targets import Target, TargetGeometry

log = logging.getLogger(__name__)
# How many target layers feed the draft when the recipe does not list them (Kimi-K3-DSpark reads 5).
# Bytes per captured token besides the hidden states: input id (int32) + loss mask (bool).
ID_BYTES, MASK_BYTES, HIDDEN_BYTES = 4, 1, 2
SEQ_LEN_BYTES = 4  # one int32 length per sequence
VALIDATION_DIR = "validation"  # the validation split's capture, under the capture directory
Split = Literal["train", "validation"]


def resolve_layer_ids(recipe: Recipe, num_hidden_layers: int) -> list[int]:
    """`draft.target_layer_ids`, or the default spread; one-line ContractError when beyond the target."""
    ids = recipe.draft.target_layer_ids
    if ids is None:
        from dspark_cli.contract import default_target_layer_ids

        return default_target_layer_ids(num_hidden_layers)
    if not ids or sorted(set(ids)) != list(ids) or ids[0] < 0:
        raise UsageError(
            f"draft.target_layer_ids: must be unique, increasing and >= 0, got {ids}",
            "list 0-based target layers, e.g. [1, 9, 17, 25, 33]",
        )
    if ids[-1] >= num_hidden_layers:
        raise ContractError(
            f"draft.target_layer_ids: layer {ids[-1]} is beyond the target's {num_hidden_layers} layers "
            f"(0-based: 0..{num_hidden_layers - 1}; output of layer k = transformers hidden_states[k+1])",
            "use ids below the target's depth, or remove the field for the default spread",
        )
    return list(ids)


def contract_for_recipe(
    recipe: Recipe, *, geometry: TargetGeometry | None = None, datagen: dict[str, Any] | None = None
) -> Contract:
    """The contract captured hidden states of this recipe must carry (what `iter_captured(expect=...)` checks)."""
    geometry = geometry or Target.of(recipe).geometry()
    datagen = datagen if datagen is not None else datagen_manifest(recipe)
    extra: dict[str, Any] = {}
    if geometry.is_kimi_k3:
        extra["aux_attn_res_stream"] = recipe.capture.aux_attn_res_stream
    return Contract(
        target=recipe.target.model,
        target_config_sha256=geometry.config_sha256,
        target_layer_ids=tuple(resolve_layer_ids(recipe, geometry.num_hidden_layers)),
        chat_template_sha256=(datagen or {}).get("chat_template_sha256"),
        extra=extra,
    )


def shard_tensor_bytes(tokens: int, loss_tokens: int, sequences: int, num_layers: int, hidden: int) -> int:
    """Exact tensor bytes of a shard: aux states, post-norm states of loss tokens, ids, masks, lengths."""
    hidden_bytes = HIDDEN_BYTES * hidden * (num_layers * tokens + loss_tokens)
    return hidden_bytes + (ID_BYTES + MASK_BYTES) * tokens + SEQ_LEN_BYTES * sequences


def goal_bytes_per_token(num_layers: int, hidden: int) -> int:
    """The issue's budget: bf16 for (n_layers + 1) states per token, plus id and mask."""
    return HIDDEN_BYTES * (num_layers + 1) * hidden + ID_BYTES + MASK_BYTES


@dataclass
class ShardPlan:
    index: int
    ids: list[str] = field(default_factory=list)
    tokens: int = 0
    loss_tokens: int = 0


@dataclass
class CapturePlan:
    recipe: Recipe
    geometry: TargetGeometry
    layer_ids: list[int]
    contract: Contract
    datagen_dir: Path
    datagen: dict[str, Any]
    shards: list[ShardPlan]
    truncated: int
    skipped_no_loss: int
    fingerprint: str
    split: Split = "train"  # which datagen split it captures

    @property
    def num_sequences(self) -> int:
        return sum(len(s.ids) for s in self.shards)

    @property
    def num_tokens(self) -> int:
        return sum(s.tokens for s in self.shards)

    @property
    def num_loss_tokens(self) -> int:
        return sum(s.loss_tokens for s in self.shards)

    def shard_bytes(self, shard: ShardPlan) -> int:
        return shard_tensor_bytes(
            shard.tokens, shard.loss_tokens, len(shard.ids), len(self.layer_ids), self.geometry.hidden_size
        )

    @property
    def num_workers(self) -> int:
        """Offline capture processes (each with its engine) this plan runs: `capture.workers`, but never more
        than the plan has shards -- a worker without a shard would start for nothing."""
        return max(1, min(self.recipe.capture.workers, len(self.shards)))

    def worker_shards(self, worker: int, workers: int) -> list[ShardPlan]:
        """The shards capture worker `worker` of `workers` owns: a deterministic, disjoint share whose
        union over the workers is the whole plan (shard i belongs to worker i % workers)."""
        if not 0 <= worker < workers:
            raise ValueError(f"worker {worker} is not one of 0..{workers - 1}")
        return [shard for shard in self.shards if shard.index % workers == worker]

    def samples(self) -> Iterator[tuple[int, str, list[int], list[int]]]:
        """(shard index, sequence id, input ids, loss mask) in plan order, streamed from the datagen shards."""
        owner = {seq_id: shard.index for shard in self.shards for seq_id in shard.ids}
        limit = self.recipe.capture.max_seq_len
        for record in iter_records(self.datagen_dir, split=self.split):
            for number, sample in enumerate(record["samples"]):
                seq_id = f"{record['id']}/{number}"
                if seq_id in owner:
                    yield owner[seq_id], seq_id, sample["input_ids"][:limit], sample["loss_mask"][:limit]


def build_plan(recipe: Recipe, *, split: Split = "train") -> CapturePlan:
    """Read the finished datagen output and split its samples into shards of ~`capture.shard_tokens` tokens.

    `split="validation"`: the held-out conversations instead (`validation_plan`); a plan without shards
    is allowed there (none of them has a loss token left), never for training."""
    datagen_dir = Path(recipe.stage_dir("datagen"))
    datagen = datagen_manifest(recipe)
    if datagen is None:
        raise UsageError(
            f"{datagen_dir}: no finished datagen output to capture from",
            "run `dspark datagen RECIPE` first (capture reads its conversations)",
        )
    geometry = Target.of(recipe).geometry()
    contract = contract_for_recipe(recipe, geometry=geometry, datagen=datagen)
    layer_ids = list(contract.target_layer_ids)
    capture = recipe.capture
    if capture.backend_here() == "hf" and geometry.is_kimi_k3 and capture.aux_attn_res_stream:
        raise UsageError(
            "capture.aux_attn_res_stream: only the vllm backend captures Kimi-K3's attention-residual stream",
            "set capture.backend=vllm, or aux_attn_res_stream=false (and serve with the same)",
        )
    made_by = (datagen.get("target") or {}).get("path")
    if made_by and made_by != geometry.location:
        log.warning(
            "capture: %s was generated by %s, capturing with %s (off-policy unless it is the same model)",
            datagen_dir,
            made_by,
            geometry.location,
        )
    shards: list[ShardPlan] = []
    current = ShardPlan(0)
    truncated = skipped = max_id = 0
    for record in iter_records(datagen_dir, split=split):
        for number, sample in enumerate(record["samples"]):
            ids, mask = sample["input_ids"], sample["loss_mask"]
            if len(ids) != len(mask):
                raise DataError(
                    f"{datagen_dir}: record {record['id']} sample {number} has {len(ids)} ids "
                    f"but {len(mask)} mask entries",
                    "re-run `dspark datagen`",
                )
            if len(ids) > capture.max_seq_len:
                truncated += 1
                ids, mask = ids[: capture.max_seq_len], mask[: capture.max_seq_len]
            max_id = max(max_id, max(ids, default=0))
            loss = sum(1 for m in mask if m)
            if loss == 0:
                skipped += 1  # nothing to learn from: no assistant token survives truncation
                continue
            if current.ids and current.tokens + len(ids) > capture.shard_tokens:
                shards.append(current)
                current = ShardPlan(len(shards))
            current.ids.append(f"{record['id']}/{number}")
            current.tokens += len(ids)
            current.loss_tokens += loss
    if current.ids:
        shards.append(current)
    if not shards and split == "train":
        raise UsageError(
            f"{datagen_dir}: no sample has a loss-masked token", "check datagen output and capture.max_seq_len"
        )
    if geometry.vocab_size is not None and max_id >= geometry.vocab_size:
        raise ContractError(
            f"{datagen_dir}: token id {max_id} is outside the target's vocabulary ({geometry.vocab_size})",
            "the data was tokenised for another model; re-run `dspark datagen` with this target",
        )
    source = datagen["shards"] if split == "train" else (datagen.get("validation") or {}).get("shards", [])
    blob = json.dumps(
        {
            "datagen": datagen.get("fingerprint"),
            "datagen_shards": [s["sha256"] for s in source],
            **({"split": split} if split != "train" else {}),
            "contract": contract.to_dict(),
            "max_seq_len": capture.max_seq_len,
            "shard_tokens": capture.shard_tokens,
            "backend": capture.backend_here(),
            "dtype": recipe.target.dtype,
            "format": 1,
        },
        sort_keys=True,
    )
    return CapturePlan(
        recipe,
        geometry,
        layer_ids,
        contract,
        datagen_dir,
        datagen,
        shards,
        truncated,
        skipped,
        hashlib.sha256(blob.encode()).hexdigest(),
        split,
    )


def validation_dir(recipe: Recipe) -> Path:
    """Where an offline capture puts the validation split: `<capture dir>/validation`."""
    return Path(recipe.stage_dir("capture")) / VALIDATION_DIR


def validation_plan(recipe: Recipe) -> CapturePlan | None:
    """The capture plan of the datagen validation split; None when the datagen output holds none out."""
    datagen = datagen_manifest(recipe)
    if datagen is None or not validation_ids(datagen):
        return None
    return build_plan(recipe, split="validation")


def workers_beyond_shards(workers: int, plan: CapturePlan) -> str | None:
    """The line for `capture.workers` above the plan's shard count (None when it is not): what the
    preflight refuses, and what a capture run warns before it starts only `plan.num_workers`."""
    shards = len(plan.shards)
    if workers <= shards:
        return None
    return (
        f"capture.workers: {workers:,} workers but the capture plan has {shards} shard{'s' if shards > 1 else ''} "
        f"({plan.num_tokens:,} tokens at capture.shard_tokens={plan.recipe.capture.shard_tokens:,}), and a worker "
        f"captures whole shards; set capture.workers<={shards}, or lower capture.shard_tokens for more shards"
    )


def plan_capture(recipe: Recipe) -> dict[str, Any]:
    """The plan as a dict (no model is loaded): sizes of the offline cache and of the online stream."""
    geometry = Target.of(recipe).geometry()
    layer_ids = resolve_layer_ids(recipe, geometry.num_hidden_layers)
    n, hidden = len(layer_ids), geometry.hidden_size
    out = {
        "output_dir": recipe.stage_dir("capture"),
        "datagen_dir": recipe.stage_dir("datagen"),
        "backend": recipe.capture.backend_here(),
        "mode": recipe.capture.mode,
        "target": geometry.location,
        "num_hidden_layers": geometry.num_hidden_layers,
        "hidden_size": hidden,
        "target_layer_ids": layer_ids,
        "goal_bytes_per_token": goal_bytes_per_token(n, hidden),
    }
    if recipe.capture.backend_here() == "vllm":
        from dspark_cli.capture.vllm import vllm_layout

        out["vllm_aux_layer_ids"] = vllm_layout(layer_ids, geometry.num_hidden_layers).aux_ids
    if datagen_manifest(recipe) is None:
        out.update(
            {
                "datagen_ready": False,
                "sequences": None,
                "tokens": None,
                "total_bytes": None,
                "note": "run `dspark datagen` first; sizes are known once its conversations exist",
            }
        )
        return out
    plan = build_plan(recipe)
    total = sum(plan.shard_bytes(s) for s in plan.shards)
    biggest = max(plan.shard_bytes(s) for s in plan.shards)
    out.update(
        {
            "datagen_ready": True,
            "sequences": plan.num_sequences,
            "tokens": plan.num_tokens,
            "loss_tokens": plan.num_loss_tokens,
            "truncated": plan.truncated,
            "skipped_no_loss": plan.skipped_no_loss,
            "shards": len(plan.shards),
            "bytes_per_token": round(total / plan.num_tokens, 2),
            "total_bytes": total,
            "online_peak_bytes": biggest * min(recipe.capture.queue_max_shards, len(plan.shards)),
            "already_done": _already_done(recipe, plan),
        }
    )
    return out


def _already_done(recipe: Recipe, plan: CapturePlan) -> int:
    """Shards a capture of this very plan has already listed in its output directory (finished or not)."""
    from dspark_cli.artifacts.files import MANIFEST_NAME, read_manifest

    directory = Path(recipe.stage_dir("capture"))
    if not (directory / MANIFEST_NAME).is_file():
        return 0
    manifest = read_manifest(directory)
    return len(manifest.get("shards", [])) if manifest.get("fingerprint") == plan.fingerprint else 0
