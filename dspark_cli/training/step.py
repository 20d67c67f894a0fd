"""`TrainStep`: the draft and its objective as one module, so FSDP2 sees every parameter use.

    step = TrainStep(draft, LossConfig(ce=0.1, l1=0.9, confidence=1.0, gamma=4.0))
    ok = trainable_slots(batch, block_size)                 # [B, A, N] bool, from the data only
    loss, stats = step(batch, ok, global_weight, scale)     # stats: sums, see metrics.STATS

The draft's own forward gives the block hidden states (`compute_logits=False`); the vocabulary
part runs only on trainable slots through `loss.vocab_loss`. `global_weight` is the sum of slot
weights over all ranks, so every rank's loss is a share of one global mean; `scale` (= world size)
undoes FSDP2's gradient averaging, which makes N ranks compute the gradient 1 rank would.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from dspark_cli.training.data import Batch
from dspark_cli.training.loss import slot_weights, vocab_loss
from dspark_cli.training.metrics import stats_vector


@dataclass(frozen=True)
class LossConfig:
    ce: float = 0.1
    l1: float = 0.9
    confidence: float = 1.0
    gamma: float = 4.0


def label_positions(anchors: torch.Tensor, block_size: int) -> torch.Tensor:
    """[B, A, N]: position of the token slot i predicts, a + i + 1."""
    return anchors.unsqueeze(-1) + torch.arange(1, block_size + 1, device=anchors.device)


def trainable_slots(batch: Batch, block_size: int) -> torch.Tensor:
    """[B, A, N] bool: real anchor, label inside the sequence, and the label trainable."""
    bsz, num_anchors = batch.anchors.shape
    width = batch.input_ids.shape[1]
    pos = label_positions(batch.anchors, block_size)
    inside = pos < batch.seq_lens.view(bsz, 1, 1)
    ok = batch.label_ok.gather(1, pos.clamp(max=width - 1).view(bsz, -1)).view(bsz, num_anchors, block_size)
    return ok & inside & batch.anchor_mask.unsqueeze(-1)


def local_weight(ok: torch.Tensor, gamma: float) -> torch.Tensor:
    return (ok.float() * slot_weights(ok.shape[-1], gamma, ok.device)).sum()


class TrainStep(nn.Module):
    def __init__(self, draft: nn.Module, loss: LossConfig) -> None:
        super().__init__()
        self.draft = draft
        self.loss_config = loss

    def forward(self, batch: Batch, ok: torch.Tensor, global_weight: torch.Tensor, scale: float = 1.0):
        draft, cfg = self.draft, self.loss_config
        n = draft.config.block_size
        out = draft(batch.aux, batch.input_ids, batch.anchors, seq_lens=batch.seq_lens,
                    anchor_mask=batch.anchor_mask, compute_logits=False)
        bsz, num_anchors = batch.anchors.shape
        width, hidden_size = batch.input_ids.shape[1], out.hidden.shape[-1]
        flat = ok.reshape(-1).nonzero().squeeze(1)  # [S] trainable slots
        hidden = out.hidden.reshape(-1, hidden_size)[flat]
        prev, labels = out.prev_ids.reshape(-1)[flat], out.target_ids.reshape(-1)[flat]
        markov = draft.markov_head.embed(prev)
        # target distribution of slot i: the target's prediction at position a + i
        rows = torch.arange(bsz, device=ok.device).view(bsz, 1, 1) * width
        keys = (rows + label_positions(batch.anchors, n) - 1).reshape(-1)[flat]
        unique_keys, target_index = torch.unique(keys, return_inverse=True)
        target_hidden = batch.last_hidden.reshape(-1, batch.last_hidden.shape[-1])[unique_keys]
        w_slot = slot_weights(n, cfg.gamma, ok.device).expand(bsz, num_anchors, n).reshape(-1)[flat]
        w = w_slot / global_weight
        loss, per_slot = vocab_loss(hidden, markov, draft.markov_head.markov_w2.weight, draft.target_lm_head,
                                    target_hidden, target_index, labels, cfg.ce * w, cfg.l1 * w)
        accept_t1 = (1.0 - per_slot[:, 1] / 2).clamp(0.0, 1.0)
        bce = conf = None
        if draft.confidence_head is not None:
            logit = draft.confidence_head(hidden, markov)
            bce = F.binary_cross_entropy_with_logits(logit, accept_t1, reduction="none")
            loss = loss + cfg.confidence * (w * bce).sum()
            conf = torch.sigmoid(logit.detach())
        stats = stats_vector(ok, flat, w_slot, per_slot, accept_t1, bce, conf)
        return loss * scale, stats
