"""Teacher-forced acceptance metrics of a draft on captured sequences, without training it.

    from dspark_cli.training.evaluate import evaluate_draft, load_trained_draft
    model = load_trained_draft("runs/tiny/train", target_dir)       # final/ + the target's embeddings
    evaluate_draft(model, sequences, num_anchors=10_000)             # {"tau_greedy": .., "tau_t1": .., ...}

The numbers are the ones training logs (`metrics.summarize`): per-slot accuracy and acceptance, and
the expected acceptance length tau under greedy and T=1 verification. With every position as an
anchor they are the teacher-forced estimate of what speculative decoding measures on the same text.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from dspark_cli.training.data import collate, prepare
from dspark_cli.training.metrics import stats_size, summarize
from dspark_cli.training.step import LossConfig, TrainStep, local_weight, trainable_slots
from dspark_cli.training.target import load_target_embeddings


def load_trained_draft(train_dir: str | Path, target_dir: str | Path) -> Any:
    """The consolidated draft of a training run (`final/`), with the target's embeddings attached."""
    from dspark_cli.export.source import build_model, load_draft_dir

    loaded = load_draft_dir(train_dir)
    model = build_model(loaded.config, loaded.state_dict)
    embed, lm_head = load_target_embeddings(target_dir)
    model.set_target_embeddings(embed, lm_head)
    return model


@torch.no_grad()
def evaluate_draft(model: Any, sequences: Iterable[Any], *, num_anchors: int = 512, max_seq_len: int = 4096,
                   batch_size: int = 8, loss: LossConfig | None = None, seed: int = 0) -> dict[str, Any]:
    """Sum the training statistics over `sequences` (anchors drawn as training does) and summarize."""
    loss = loss or LossConfig()
    step = TrainStep(model, loss).eval()
    n = model.config.block_size
    dtype = next(model.parameters()).dtype
    totals = torch.zeros(stats_size(n))
    examples = [e for i, s in enumerate(sequences)
                if (e := prepare(s, epoch=0, index=i, seed=seed, num_anchors=num_anchors, max_seq_len=max_seq_len))]
    for start in range(0, len(examples), batch_size):
        batch = collate(examples[start:start + batch_size], dtype)
        ok = trainable_slots(batch, n)
        _, stats = step(batch, ok, local_weight(ok, loss.gamma))
        totals += stats.float().cpu()
    return {"sequences": len(examples), **summarize(totals.tolist(), n, loss)}
