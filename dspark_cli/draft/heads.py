"""The DSpark heads that follow the backbone (vLLM 0.33 `qwen3_dspark.py`, shared by K3).

- Markov head: `markov_w1` (Embedding, vocab x r) embeds the previous token, `markov_w2`
  (r -> vocab, no bias) turns it into a logit bias: logits_i = lm_head(h_i) + w2(w1[prev_i]).
- Confidence head: `proj` (input -> 1, with bias) in fp32 (vLLM builds it with
  params_dtype=float32 and casts its input with .float()); sigmoid(proj(cat(h_i, w1[prev_i])))
  with `confidence_head_with_markov`, sigmoid(proj(h_i)) without.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class MarkovHead(nn.Module):
    def __init__(self, vocab_size: int, draft_vocab_size: int, rank: int) -> None:
        super().__init__()
        self.markov_w1 = nn.Embedding(vocab_size, rank)
        self.markov_w2 = nn.Linear(rank, draft_vocab_size, bias=False)

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.markov_w1(token_ids)

    def bias(self, markov_embed: torch.Tensor) -> torch.Tensor:
        return self.markov_w2(markov_embed)


class ConfidenceHead(nn.Module):
    def __init__(self, hidden_size: int, markov_rank: int, with_markov: bool) -> None:
        super().__init__()
        self.with_markov = with_markov
        input_dim = hidden_size + (markov_rank if with_markov else 0)
        self.proj = nn.Linear(input_dim, 1, bias=True, dtype=torch.float32)

    def forward(self, hidden: torch.Tensor, markov_embed: torch.Tensor) -> torch.Tensor:
        """Acceptance logit (fp32, before the sigmoid) per position: [...]."""
        x = torch.cat([hidden, markov_embed], dim=-1) if self.with_markov else hidden
        return F.linear(x.float(), self.proj.weight.float(), self.proj.bias.float()).squeeze(-1)
