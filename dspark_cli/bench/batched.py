"""The reference engine over many requests at once: batched verification steps, as vLLM batches them.

    from dspark_cli.bench.batched import BatchedEngine, batch_drafter
    from dspark_cli.bench.engine import Request, Sampling, Speculation
    engine = BatchedEngine(target, batch_drafter(drafter), Speculation(7, "probabilistic", "block"), batch_size=16)
    outs = engine.generate_many([Request(prompt_ids, Sampling(1.0, max_tokens=128), seed=s) for ...])

Request for request it computes what `SpeculativeEngine.generate` computes (the same prompts, seeds and
settings give the same tokens, accepted counts and tau), up to float noise: each request is prefilled
alone (exactly as the sequential engine), keeps its own `torch.Generator` and draws from it in the same
order (its draft noise, then its verification's uniforms and resample, each at batch size 1), and is
verified on its own rows of the batched target logits. What is batched is the expensive part: one
target forward over every active request's [anchor, drafts] block, and one draft forward per step.

The target's KV cache is one transformers `DynamicCache` of shape [B, H, C, D] per layer with a
validity mask [B, C]: each step appends the padded blocks as new columns of every row, then marks a
row's rejected drafts (and its padding) invalid; the attention mask hides them and explicit position
ids keep every token at its request's position, so a rejected draft is rolled back exactly. When the
holes grow, the valid columns are gathered to the left (`_compact`). A finished request leaves the
batch and the next waiting one joins (its prefilled cache left-padded to the batch's width).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from dspark_cli.bench.engine import (
    DSparkDrafter,
    Generation,
    HFTarget,
    Proposal,
    Request,
    Sampling,
    Speculation,
    SpeculativeEngine,
)
from dspark_cli.bench.verify import confidence_prefix, sample_target, verify
from dspark_cli.errors import UsageError

# hole columns tolerated beyond the longest row before `_compact`: every step's attention (and MLA's latent
# expansion) reads them; gathering costs one cache copy (tiny-mla, batch 16: 32 and 128 ran within noise)
COMPACT_SLACK = 64


class BatchTarget:
    """An `HFTarget`'s model over a batch of requests, one cache row each (see the module docstring)."""

    def __init__(self, target: HFTarget) -> None:
        self.target = target
        self.cache: Any = None  # DynamicCache, [B, H, C, D] per layer
        self.valid = torch.zeros(0, 0, dtype=torch.bool, device=target.device)  # [B, C]
        self.lengths: list[int] = []  # per row: positions held (valid columns)
        self._width = 0  # the last step's block width

    def prefill(self, prompt_ids: list[int]) -> tuple[torch.Tensor, torch.Tensor, list[tuple[torch.Tensor, ...]]]:
        """The prompt alone, as the sequential engine reads it -> (last logits [1, V], aux [m, F], its cache)."""
        self.target.reset()
        logits, aux = self.target.forward(list(prompt_ids), last_only=True)
        layers = self.target.cache.layers
        if any(type(layer).__name__ != "DynamicLayer" for layer in layers):
            raise UsageError(
                f"{type(self.target.model).__name__}: the batched bench engine needs full-attention KV caches",
                "set bench.batch_size=1 (the sequential engine) for this target",
            )
        kv: list[tuple[torch.Tensor, ...]] = [(layer.keys, layer.values) for layer in layers]
        self.target.cache, self.target.length = None, 0
        return logits, aux, kv

    def add(self, kv: list[tuple[torch.Tensor, ...]], length: int) -> None:
        """A new last row holding a prefilled request's cache (`prefill`), left-padded to the batch's width."""
        from transformers import DynamicCache

        if self.cache is None or not self.lengths:
            self.cache = DynamicCache(config=self.target.model.config)
            for layer, (k, v) in zip(self.cache.layers, kv, strict=True):
                layer.update(k, v)
            self.valid = torch.ones(1, length, dtype=torch.bool, device=self.target.device)
            self.lengths = [length]
            return
        width = self.valid.shape[1]
        if length > width:
            self._left_pad(length - width)
            width = length
        for layer, (k, v) in zip(self.cache.layers, kv, strict=True):
            layer.keys = torch.cat([layer.keys, _left_pad(k, width - length)], dim=0)
            layer.values = torch.cat([layer.values, _left_pad(v, width - length)], dim=0)
        row = torch.zeros(1, width, dtype=torch.bool, device=self.valid.device)
        row[0, width - length :] = True
        self.valid = torch.cat([self.valid, row])
        self.lengths.append(length)

    def remove(self, rows: Sequence[int]) -> None:
        """Drop the given rows (finished requests)."""
        if not rows:
            return
        keep = [r for r in range(len(self.lengths)) if r not in set(rows)]
        if not keep:
            self.cache, self.lengths = None, []
            self.valid = self.valid[:0]
            return
        index = torch.tensor(keep, device=self.valid.device)
        for layer in self.cache.layers:
            layer.keys, layer.values = layer.keys[index], layer.values[index]
        self.valid = self.valid[index]
        self.lengths = [self.lengths[r] for r in keep]

    @torch.inference_mode()
    def step(self, blocks: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Row b reads `blocks[b]` at its next positions -> logits [B, W, V] fp32, aux [B, W, F] (W: the
        longest block; a row's columns past its block are padding). Every block stays cached until `keep`."""
        bsz, width = len(blocks), max(len(b) for b in blocks)
        self._width = width
        device = self.target.device
        ids = torch.zeros(bsz, width, dtype=torch.long)
        new_valid = torch.zeros(bsz, width, dtype=torch.bool)
        for b, block in enumerate(blocks):
            ids[b, : len(block)] = torch.tensor(block)
            new_valid[b, : len(block)] = True
        positions = torch.tensor(self.lengths).unsqueeze(-1) + torch.arange(width)
        self.valid = torch.cat([self.valid, new_valid.to(device)], dim=1)
        self.target._captured.clear()
        out = self.target.model(
            input_ids=ids.to(device),
            position_ids=positions.to(device),
            attention_mask=self.valid.long(),
            past_key_values=self.cache,
            use_cache=True,
        )
        self.cache = out.past_key_values
        aux = torch.cat([self.target._captured[k] for k in self.target.layer_ids], dim=-1)
        return out.logits.float(), aux

    def keep(self, kept: list[int]) -> None:
        """After `step`: row b keeps the first kept[b] tokens of its block (the rest is rolled back)."""
        width = self._width
        cols = torch.arange(width, device=self.valid.device)
        new = cols < torch.tensor(kept, device=self.valid.device).unsqueeze(-1)
        self.valid = torch.cat([self.valid[:, : self.valid.shape[1] - width], new], dim=1)
        self.lengths = [n + k for n, k in zip(self.lengths, kept, strict=True)]
        if self.valid.shape[1] > max(self.lengths) + COMPACT_SLACK:
            self._compact()

    def _compact(self) -> None:
        """Gather each row's valid columns to the right end of a narrower cache (left padding)."""
        width = max(self.lengths)
        order = torch.sort(self.valid.long(), dim=1, stable=True).indices[:, -width:]  # valid columns last, in order
        for layer in self.cache.layers:
            index = order[:, None, :, None]
            layer.keys = layer.keys.gather(2, index.expand(-1, layer.keys.shape[1], -1, layer.keys.shape[3]))
            layer.values = layer.values.gather(2, index.expand(-1, layer.values.shape[1], -1, layer.values.shape[3]))
        self.valid = self.valid.gather(1, order)

    def _left_pad(self, extra: int) -> None:
        for layer in self.cache.layers:
            layer.keys, layer.values = _left_pad(layer.keys, extra), _left_pad(layer.values, extra)
        self.valid = torch.cat([self.valid.new_zeros(self.valid.shape[0], extra), self.valid], dim=1)


def _left_pad(x: torch.Tensor, extra: int) -> torch.Tensor:
    """[B, H, L, D] -> [B, H, extra + L, D], zeros first."""
    if extra == 0:
        return x
    return torch.cat([x.new_zeros(x.shape[0], x.shape[1], extra, x.shape[3]), x], dim=2)


class BatchDrafter(Protocol):
    """A drafter serving many requests at once, each by the handle `open` gave."""

    has_confidence: bool

    def open(self, aux: torch.Tensor) -> int: ...
    # `temperatures`: per request, 0 to draft greedily (then its Proposal has no logits)
    def propose(
        self,
        handles: list[int],
        anchors: list[int],
        *,
        temperatures: list[float],
        num_tokens: int,
        generators: list[torch.Generator],
        histories: list[list[int]],
    ) -> list[Proposal]: ...
    def accept(self, rows: dict[int, torch.Tensor]) -> None: ...
    def close(self, handle: int) -> None: ...


class DSparkBatch:
    """A `DSparkDrafter`'s model drafting one block for every request in one forward (one context-cache
    slot each; every request's draft noise from its own generator, as `draft_block` draws it alone)."""

    def __init__(self, drafter: DSparkDrafter) -> None:
        self.drafter = drafter
        self.has_confidence = drafter.has_confidence

    def open(self, aux: torch.Tensor) -> int:
        slot = self.drafter.cache.add_request()
        self.drafter.cache.append(slot, aux.to(self.drafter.dtype))
        return slot

    @torch.inference_mode()
    def propose(self, handles, anchors, *, temperatures, num_tokens, generators, histories) -> list[Proposal]:
        from dspark_cli.draft.drafting import draft_block

        block = draft_block(
            self.drafter.model,
            self.drafter.cache,
            handles,
            torch.tensor(anchors),
            temperature=torch.tensor(temperatures),
            generator=generators,
            block_size=num_tokens,
            draft_topk=self.drafter.draft_topk,
        )
        return [
            Proposal(
                block.tokens[b],
                None if temperatures[b] <= 0 else block.logits[b].float(),
                block.confidence[b] if block.confidence is not None else None,
            )
            for b in range(len(handles))
        ]

    def accept(self, rows: dict[int, torch.Tensor]) -> None:
        self.drafter.cache.extend({slot: aux.to(self.drafter.dtype) for slot, aux in rows.items()})

    def close(self, handle: int) -> None:
        self.drafter.cache.release(handle)


class EachRequest:
    """A drafter that keeps no state between steps (prompt lookup) asked once per request."""

    def __init__(self, drafter: Any) -> None:
        self.drafter = drafter
        self.has_confidence = drafter.has_confidence
        self._next = 0

    def open(self, aux: torch.Tensor) -> int:
        self._next += 1
        return self._next

    def propose(self, handles, anchors, *, temperatures, num_tokens, generators, histories) -> list[Proposal]:
        return [
            self.drafter.propose(a, temperature=t, greedy=t <= 0, num_tokens=num_tokens, generator=g, history=h)
            for a, t, g, h in zip(anchors, temperatures, generators, histories, strict=True)
        ]

    def accept(self, rows: dict[int, torch.Tensor]) -> None:
        pass

    def close(self, handle: int) -> None:
        pass


def batch_drafter(drafter: Any) -> BatchDrafter:
    """The batched face of an engine drafter: `DSparkDrafter` or the stateless `NgramDrafter`."""
    from dspark_cli.bench.baselines import NgramDrafter

    if isinstance(drafter, DSparkDrafter):
        return DSparkBatch(drafter)
    if isinstance(drafter, NgramDrafter):
        return EachRequest(drafter)
    raise TypeError(f"no batched form of {type(drafter).__name__}; run it with SpeculativeEngine")


@dataclass
class _Live:
    """One request in flight."""

    index: int  # in the caller's list
    request: Request
    out: Generation
    generator: torch.Generator
    limit: int
    token: int  # the anchor: emitted, not yet read by the target
    handle: int = -1  # the drafter's


class BatchedEngine:
    """`SpeculativeEngine.generate` over up to `batch_size` requests at a time (see the module docstring)."""

    def __init__(
        self,
        target: HFTarget,
        drafter: BatchDrafter | None = None,
        speculation: Speculation | None = None,
        *,
        batch_size: int = 16,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        # the sequential engine validates the drafter / speculation pairing (and serves `generate`)
        self.single = SpeculativeEngine(target, drafter, speculation)  # type: ignore[arg-type]
        self.target, self.drafter, self.speculation = target, drafter, speculation
        self.batch_size = batch_size
        self._done: list[_Live] = []  # every request admitted by the running `generate_many`

    def generate(self, prompt_ids: list[int], sampling: Sampling, *, seed: int = 0) -> Generation:
        return self.generate_many([Request(list(prompt_ids), sampling, seed)])[0]

    @torch.no_grad()  # not inference mode: the drafter's context cache is shared with the sequential engine
    def generate_many(self, requests: Sequence[Request]) -> list[Generation]:
        """Every request's Generation, in order; each one's `seconds` is its share of the batched wall time."""
        batch = BatchTarget(self.target)
        results: list[Generation] = [Generation([], "length") for _ in requests]
        waiting, live = deque(enumerate(requests)), list[_Live]()
        try:
            while waiting or live:
                while waiting and len(live) < self.batch_size:
                    joined = self._admit(batch, *waiting.popleft())
                    if joined is not None:
                        live.append(joined)
                if not live:
                    continue
                started = time.perf_counter()
                finished = self._step(batch, live)
                share = (time.perf_counter() - started) / len(live)
                for r in live:
                    r.out.seconds += share
                batch.remove(finished)
                for row in finished:
                    self._close(live[row])
                live = [r for row, r in enumerate(live) if row not in finished]
        finally:
            for r in live:
                self._close(r)
        for r in self._done:
            results[r.index] = r.out
        self._done = []
        return results

    def _admit(self, batch: BatchTarget, index: int, request: Request) -> _Live | None:
        """Prefill a request alone and sample its first token -> it, in the batch (None: done already)."""
        started = time.perf_counter()
        sampling = request.sampling
        generator = torch.Generator(device=self.target.device).manual_seed(request.seed)
        logits, aux, kv = batch.prefill(request.prompt_ids)
        token = int(sample_target(logits[-1], sampling.temperature, sampling.top_p, generator))
        limit = sampling.max_tokens
        if sampling.max_model_len is not None:
            limit = min(limit, sampling.max_model_len - len(request.prompt_ids))
        live = _Live(index, request, Generation([], "length"), generator, limit, token)
        self._done.append(live)
        done = self._emit(live, [token])
        live.out.seconds = time.perf_counter() - started
        if done:
            return None
        batch.add(kv, len(request.prompt_ids))
        if self.drafter is not None:
            live.handle = self.drafter.open(aux)
        return live

    def _close(self, live: _Live) -> None:
        if self.drafter is not None and live.handle >= 0:
            self.drafter.close(live.handle)
            live.handle = -1

    def _step(self, batch: BatchTarget, live: list[_Live]) -> list[int]:
        """One batched step (a plain decode step without a drafter) -> the rows whose request is done."""
        if self.drafter is None:
            logits, _ = batch.step([[r.token] for r in live])
            batch.keep([1] * len(live))
            done = []
            for row, r in enumerate(live):
                s = r.request.sampling
                r.token = int(sample_target(logits[row, 0], s.temperature, s.top_p, r.generator))
                if self._emit(r, [r.token]):
                    done.append(row)
            return done
        spec = self.speculation
        assert spec is not None
        histories = [[*r.request.prompt_ids, *r.out.token_ids] for r in live]
        greedy = spec.draft_sample_method == "greedy"
        proposals = self.drafter.propose(
            [r.handle for r in live],
            [r.token for r in live],
            temperatures=[0.0 if greedy else max(r.request.sampling.temperature, 0.0) for r in live],
            num_tokens=spec.num_speculative_tokens,
            generators=[r.generator for r in live],
            histories=histories,
        )
        drafts = []
        for r, history, proposal in zip(live, histories, proposals, strict=True):
            k = min(spec.num_speculative_tokens, len(proposal.tokens))
            if spec.confidence_threshold > 0 and proposal.confidence is not None:
                k = min(k, confidence_prefix(proposal.confidence, spec.confidence_threshold))
            if r.request.sampling.max_model_len is not None:
                k = max(0, min(k, r.request.sampling.max_model_len - len(history)))
            drafts.append(proposal.tokens[:k])
        logits, aux = batch.step([[r.token, *d.tolist()] for r, d in zip(live, drafts, strict=True)])
        kept, rows, done = [], {}, []
        for row, (r, history, proposal, d) in enumerate(zip(live, histories, proposals, drafts, strict=True)):
            k, s = len(d), r.request.sampling
            draft_logits = proposal.logits[:k].unsqueeze(0) if proposal.logits is not None else None
            result = verify(
                logits[row, : k + 1].unsqueeze(0),
                draft_logits,
                d.unsqueeze(0).to(logits.device),
                temperature=s.temperature,
                top_p=s.top_p,
                method=spec.rejection_sample_method,
                generator=r.generator,
            )
            accepted = int(result.num_accepted[0])
            kept.append(accepted + 1)
            rows[r.handle] = aux[row, : accepted + 1]
            r.out.verified.append(k)
            r.out.accepted.append(accepted)
            r.out.confidences.append(proposal.confidence.float().tolist() if proposal.confidence is not None else None)
            r.out.contexts.append(len(history))
            r.token = int(result.next_token[0])
            if self._emit(r, [*d[:accepted].tolist(), r.token]):
                done.append(row)
        batch.keep(kept)
        self.drafter.accept(rows)
        return done

    def _emit(self, live: _Live, tokens: list[int]) -> bool:
        return self.single._emit(live.out, tokens, live.request.sampling.stop_ids, live.limit)
