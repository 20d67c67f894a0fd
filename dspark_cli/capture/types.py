"""The unit of captured data the trainer consumes: one tokenised sample with its target hidden states.

from dspark_cli.capture import iter_captured
for seq in iter_captured("runs/tiny/hidden", expect=contract):   # CapturedSequence objects
    seq.aux_hidden.shape   # [T, len(target_layer_ids) * H] bfloat16
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class CapturedSequence:
    """One datagen sample (`f"{record_id}/{sample_index}"`) and what the target computed on it."""

    id: str
    input_ids: torch.Tensor  # [T] int64
    loss_mask: torch.Tensor  # [T] bool
    aux_hidden: torch.Tensor  # [T, len(target_layer_ids) * H] bfloat16, layers concatenated in id order
    last_hidden: torch.Tensor  # [T, H] bfloat16, post-final-norm; rows where loss_mask is False are zeros

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_loss_tokens(self) -> int:
        return int(self.loss_mask.sum())
