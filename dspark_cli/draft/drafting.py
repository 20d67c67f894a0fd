"""Drafting one DSpark block per request, as vLLM 0.33's DSpark speculator does.

    cache = ContextCache(model)
    slot = cache.add_request()
    cache.append(slot, aux_states)        # [n, F] target states of newly verified positions
    block = draft_block(model, cache, [slot], torch.tensor([anchor_id]), temperature=0.0)
    block.tokens, block.logits, block.confidence     # [B, N], [B, N, V], [B, N]
    cache.truncate(slot, new_len)         # roll back positions the target did not verify

Per request, the context cache holds every draft layer's K/V of the verified positions
0 .. len-1 (MLA: the normalised latent kv_c and rotated k_pe, exactly what vLLM writes to its
latent cache; GQA: normed+rotated k and v). Appending computes K/V for the new rows only, so a
step costs projections for N block tokens plus attention over the cached context.

A step for request b (anchor = last accepted / bonus token, at position p = len_b):
query block [anchor, mask x (N-1)] at positions p .. p+N-1 attends to the cached context and
to itself non-causally; final norm; target lm_head; then sequential Markov sampling
(`prev = anchor`; logits_i = base_i + markov_w2(markov_w1[prev]); x_i = sample(logits_i);
prev = x_i) and confidence sigmoid(proj(cat(h_i, markov_w1[prev_i]))).

Sampling follows vLLM's `gumbel_sample` (is_drafting=True): temperature 0 -> argmax; else
argmax(logits / T + Gumbel noise). vLLM's noise is a murmur3 hash of (seed, position, token);
ours comes from `torch.rand(B, V, generator=generator)` drawn once per slot, slot by slot, when
any temperature is > 0 — the same distribution, a different random stream. `logits` are
returned before temperature, as vLLM caches them for probabilistic verification.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from dspark_cli.draft.attention import BlockLayout
from dspark_cli.draft.model import DSparkDraftModel


class ContextCache:
    """Growable per-request context K/V for every draft layer, one slot per request."""

    def __init__(self, model: DSparkDraftModel, capacity: int = 256) -> None:
        self.model = model
        self.capacity = capacity
        self.lengths: list[int] = []
        self.free_slots: list[int] = []
        self.tensors: list[list[torch.Tensor]] | None = None  # per layer: [K, V] [S, cap, ...]

    def add_request(self) -> int:
        if self.free_slots:
            slot = self.free_slots.pop()
            self.lengths[slot] = 0
            return slot
        self.lengths.append(0)
        return len(self.lengths) - 1

    def release(self, slot: int) -> None:
        self.lengths[slot] = -1
        self.free_slots.append(slot)

    def length(self, slot: int) -> int:
        if self.lengths[slot] < 0:
            raise KeyError(f"context cache slot {slot} was released")
        return self.lengths[slot]

    def truncate(self, slot: int, length: int) -> None:
        """Forget positions >= length (tokens the target rejected)."""
        if not 0 <= length <= self.length(slot):
            raise ValueError(f"cannot truncate slot {slot} of length {self.length(slot)} to {length}")
        self.lengths[slot] = length

    def append(self, slot: int, aux_states: torch.Tensor) -> None:
        """Add the target states [n, F] of the next n verified positions of one request."""
        self.extend({slot: aux_states})

    @torch.no_grad()
    def extend(self, new_states: Mapping[int, torch.Tensor]) -> None:
        """Append several requests' new rows with one projection pass: {slot: [n_slot, F]}."""
        slots = list(new_states)
        if not slots:
            return
        rows = torch.cat([new_states[s] for s in slots], dim=0)
        positions = torch.cat(
            [torch.arange(self.length(s), self.length(s) + new_states[s].shape[0], device=rows.device) for s in slots]
        )
        per_layer = self.model.context_kv(rows, positions)  # per layer (K [n, ...], V [n, ...])
        self._reserve(max(self.length(s) + new_states[s].shape[0] for s in slots), per_layer)
        start = 0
        for s in slots:
            n, begin = new_states[s].shape[0], self.length(s)
            for layer_store, layer_new in zip(self.tensors, per_layer, strict=True):
                for store, new in zip(layer_store, layer_new, strict=True):
                    store[s, begin : begin + n] = new[start : start + n]
            self.lengths[s] = begin + n
            start += n

    def _reserve(self, needed: int, example: list[tuple[torch.Tensor, ...]]) -> None:
        num_slots = len(self.lengths)
        if self.tensors is None:
            self.capacity = max(self.capacity, needed)
            self.tensors = [[t.new_zeros((num_slots, self.capacity, *t.shape[1:])) for t in layer] for layer in example]
            return
        cur_slots, cur_cap = self.tensors[0][0].shape[:2]
        new_cap = cur_cap if needed <= cur_cap else max(2 * cur_cap, needed)
        if num_slots <= cur_slots and new_cap == cur_cap:
            return
        new_slots = max(num_slots, cur_slots)
        for layer in self.tensors:
            for i, t in enumerate(layer):
                grown = t.new_zeros((new_slots, new_cap, *t.shape[2:]))
                grown[:cur_slots, :cur_cap] = t
                layer[i] = grown
        self.capacity = new_cap

    def _empty_example(self) -> list[tuple[torch.Tensor, ...]]:
        weight = next(self.model.parameters())
        features = self.model.config.target_hidden_size * self.model.config.num_target_layers
        rows = weight.new_zeros((0, features))
        return self.model.context_kv(rows, torch.zeros(0, dtype=torch.long, device=rows.device))

    def gather(self, slots: Sequence[int]) -> tuple[list[tuple[torch.Tensor, ...]], torch.Tensor]:
        """Padded context of the given requests: per layer tensors [B, L, ...], lengths [B]."""
        lengths = [self.length(s) for s in slots]
        max_len = max(lengths)
        if self.tensors is None or self.tensors[0][0].shape[0] < len(self.lengths):
            self._reserve(max_len, self._empty_example())
        index = torch.tensor(slots, device=self.tensors[0][0].device)
        ctx = [tuple(t[index, :max_len] for t in layer) for layer in self.tensors]
        return ctx, torch.tensor(lengths, device=index.device)


@dataclass
class DraftBlock:
    tokens: torch.Tensor  # [B, N] drafted token ids
    logits: torch.Tensor  # [B, N, V] base + Markov bias of the sampled prefix, pre-temperature
    confidence: torch.Tensor | None  # [B, N] fp32 acceptance estimates, None without the head
    hidden: torch.Tensor  # [B, N, H] final-normed backbone output

    def probs(self, temperature: float | torch.Tensor) -> torch.Tensor:
        """The draft distribution verification uses: softmax(logits / T), one-hot at T = 0."""
        temp = _as_temperature(temperature, self.logits)
        greedy = torch.nn.functional.one_hot(self.tokens, self.logits.shape[-1]).float()
        scaled = (self.logits.float() / temp.clamp_min(1e-6).view(-1, 1, 1)).softmax(-1)
        return torch.where((temp == 0).view(-1, 1, 1), greedy, scaled)


def _as_temperature(temperature: float | torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    temp = torch.as_tensor(temperature, dtype=torch.float32, device=logits.device)
    return temp.expand(logits.shape[0]) if temp.dim() == 0 else temp


def sample_tokens(
    logits: torch.Tensor, temperature: torch.Tensor, generator: torch.Generator | Sequence[torch.Generator] | None
) -> torch.Tensor:
    """[B, V] logits, [B] temperatures -> [B] ids: argmax at T = 0, Gumbel-max at T > 0. A sequence of
    generators (one per row) draws each row at T > 0 from its own, [1, V] as that row would alone."""
    greedy = logits.argmax(dim=-1)
    if not bool((temperature > 0).any()):
        return greedy
    if generator is None or isinstance(generator, torch.Generator):
        u = torch.rand(logits.shape, generator=generator, device=logits.device, dtype=torch.float32)
    else:
        rows = [
            torch.rand((1, logits.shape[-1]), generator=g, device=logits.device, dtype=torch.float32)
            if t > 0
            else torch.full((1, logits.shape[-1]), 0.5, device=logits.device)
            for g, t in zip(generator, temperature.tolist(), strict=True)
        ]
        u = torch.cat(rows)
    gumbel = -torch.log(-torch.log(u))
    scaled = logits.float() / temperature.clamp_min(1e-6).unsqueeze(-1)
    return torch.where(temperature > 0, (scaled + gumbel).argmax(dim=-1), greedy)


@torch.no_grad()
def draft_block(
    model: DSparkDraftModel,
    cache: ContextCache,
    slots: Sequence[int],
    anchor_ids: torch.Tensor,
    *,
    temperature: float | torch.Tensor = 0.0,
    generator: torch.Generator | Sequence[torch.Generator] | None = None,
    block_size: int | None = None,
    attn_impl: str = "sdpa",
    draft_topk: int | None = None,
) -> DraftBlock:
    """Draft N tokens for each request in `slots`; anchors [B] sit at position cache.length.

    `temperature` 0 (or vLLM's `draft_sample_method: greedy`) drafts greedily. `draft_topk`
    mirrors vLLM's `dspark_draft_topk`: each slot keeps only its top-k base-logit candidates
    (chosen before the Markov bias) and every other logit is -inf.

    `attn_impl` defaults to "sdpa" whatever the model trains with: the context length changes
    every step (flex would rebuild its BlockMask and recompile), and one block per request
    has no empty tiles for flex to skip.
    """
    n = block_size or model.config.block_size
    ctx, lengths = cache.gather(slots)
    device = lengths.device
    anchor_ids = anchor_ids.to(device)
    bsz = len(slots)
    positions = lengths.unsqueeze(-1) + torch.arange(n, device=device)  # [B, N]
    block_ids = torch.full((bsz, n), model.config.mask_token_id, device=device)
    block_ids[:, 0] = anchor_ids
    layout = BlockLayout(num_ctx=int(ctx[0][0].shape[1]), block_size=n, ctx_limit=lengths.unsqueeze(-1))
    hidden = model.backbone(model.embed(block_ids), positions, ctx, layout, absorbed=True, attn_impl=attn_impl)
    base = model.base_logits(hidden)  # [B, N, V]
    temp = _as_temperature(temperature, base)
    keep = None
    if draft_topk is not None:
        keep = torch.zeros_like(base, dtype=torch.bool).scatter_(-1, base.topk(draft_topk, dim=-1).indices, True)

    prev, tokens, logits, embeds = anchor_ids, [], [], []
    for i in range(n):  # the sequential Markov stage
        embed = model.markov_head.embed(prev)
        logits_i = base[:, i] + model.markov_head.bias(embed)
        if keep is not None:
            logits_i = logits_i.masked_fill(~keep[:, i], float("-inf"))
        prev = sample_tokens(logits_i, temp, generator)
        tokens.append(prev)
        logits.append(logits_i)
        embeds.append(embed)
    confidence = None
    if model.confidence_head is not None:
        confidence = torch.sigmoid(model.confidence_head(hidden, torch.stack(embeds, dim=1)))
    return DraftBlock(torch.stack(tokens, dim=1), torch.stack(logits, dim=1), confidence, hidden)
