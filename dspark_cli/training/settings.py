"""Which recipe settings make a training result, so a rerun never mixes two runs' settings.

    now = result_settings(recipe, data="<capture fingerprint>")    # flat {"train.lr": 0.003, ...}
    check_same_settings(meta["settings"], now, where=checkpoint)    # one-line UsageError naming changes

Rule: every `draft.*` and `train.*` field shapes the checkpoint, except those that only change how
a run is observed or laid out -- `IGNORED` (logging, metrics sinks, checkpoint interval, processes;
DCP reshards a checkpoint to another process count), plus `capture.max_seq_len` and `capture.mode`
and the identity of the data (the capture manifest's fingerprint, which covers the datagen output,
the target and the capture settings). Sections of later stages (export, serve, bench, publish) never
count. A field added to draft/train later counts unless listed here: refusing is the safe default.

A rerun into a directory whose checkpoint was made with other settings is refused (the checkpoint
and its recorded recipe stay as they are); the fix is a new `train.output_dir`, or starting over.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dspark_cli.errors import UsageError

if TYPE_CHECKING:
    from dspark_cli.recipe.schema import Recipe

IGNORED = frozenset(
    {
        "train.log_every",
        "train.metrics",
        "train.wandb_project",
        "train.checkpoint_every",
        "train.output_dir",
        "train.nproc_per_node",
        "train.nnodes",
        "train.rdzv_endpoint",
        "train.compile",  # the same math through inductor (tests/training/test_train_runs.py: 1e-8 relative)
        "train.length_buckets",  # padding that is masked out: the same math (tests/training/test_train_units.py)
        "draft.attention",  # kernel choice, not the model
    }
)


def _flatten(prefix: str, value: Any, out: dict[str, Any]) -> None:
    if isinstance(value, dict):
        for key, sub in value.items():
            _flatten(f"{prefix}.{key}", sub, out)
    else:
        out[prefix] = value


def result_settings(recipe: Recipe, data: str | None = None) -> dict[str, Any]:
    """The recipe's result-affecting settings, flat and JSON-able; `data` identifies the training data."""
    flat: dict[str, Any] = {}
    dumped = recipe.model_dump(mode="json")
    for section in ("draft", "train"):
        _flatten(section, dumped[section], flat)
    flat = {k: v for k, v in flat.items() if k not in IGNORED and not any(k.startswith(i + ".") for i in IGNORED)}
    flat["capture.max_seq_len"] = dumped["capture"]["max_seq_len"]
    flat["capture.mode"] = dumped["capture"]["mode"]
    flat["data"] = data
    return flat


def changed_settings(before: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """`key before -> now` for every setting that differs (a key missing on one side counts)."""
    out = []
    for key in sorted(set(before) | set(now)):
        if before.get(key, "<unset>") != now.get(key, "<unset>"):
            if key == "data":
                out.append("training data (the capture output was made again or from other data)")
            else:
                out.append(f"{key} {before.get(key, '<unset>')} -> {now.get(key, '<unset>')}")
    return out


def check_same_settings(before: dict[str, Any] | None, now: dict[str, Any], *, where: Any, out_dir: Any) -> None:
    """One-line UsageError when the checkpoint at `where` was trained with other settings."""
    if before is None:
        raise UsageError(
            f"{where}: checkpoint does not record its training settings (an older dspark)",
            f"train into a new directory with -o DIR, or move {out_dir} away to start over",
        )
    changes = changed_settings(before, now)
    if changes:
        shown = ", ".join(changes[:4]) + (f" (+{len(changes) - 4} more)" if len(changes) > 4 else "")
        raise UsageError(
            f"{out_dir} holds a training run with other settings: {shown}",
            f"train into a new directory with -o DIR, go back to the old settings, or move "
            f"{out_dir} away to start over",
        )
