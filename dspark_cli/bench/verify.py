"""Verification of drafted tokens by the target, with vLLM 0.33's semantics, batched over requests.

    from dspark_cli.bench.verify import verify
    out = verify(target_logits, draft_logits, draft_tokens, temperature=1.0, top_p=0.95,
                 method="block", generator=g)
    out.num_accepted, out.next_token          # [B], [B]

Shapes: `target_logits` [B, k+1, V] (the target at the anchor and at each of the k drafts),
`draft_tokens` [B, k], `draft_logits` [B, k, V] pre-temperature (vLLM caches them that way), or
None for `draft_sample_method: greedy` (vLLM then verifies the drafts as one-hot proposals).
Per request the step emits `num_accepted` drafts plus `next_token` (the resampled token after a
rejection, or the bonus token after a full accept): tau = num_accepted + 1.

What each piece does, as in vllm/v1/worker/gpu/spec_decode/rejection_sampler_utils.py:
- Temperature 0: accept while the draft equals the target's argmax; the next token is the target
  argmax (whatever the method, as vLLM's `is_greedy` path).
- Target probabilities p: logits / T, then top-p (vLLM applies temperature and top-p to the target
  logits before verification); draft probabilities q: softmax(draft_logits / T), no top-p (the
  drafter samples with temperature only).
- `standard` (Leviathan et al. 2023): accept x_i while p(x_i) > u_i q(x_i); after the first
  rejection sample from max(p - q, 0) / Z; after a full accept from p (the bonus token).
- `block` (Sun et al. 2024, "Block Verification Accelerates Speculative Decoding", Alg. 2): running
  ratio c_0 = 1, c_i = min(c_{i-1} p(x_i) / q(x_i), 1); h_i = R_i / (R_i + 1 - c_i) with
  R_i = sum_x max(c_i p_{i+1}(x) - q_{i+1}(x), 0) for i < k, h_k = c_k; tau = max{i : u_i <= h_i}
  (0 if none); the next token comes from max(c_tau p_tau - q_tau, 0) / Z, or from p_k when tau = k.
Both are lossless: the emitted tokens are distributed exactly as the target's (see the tests).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

METHODS = ("standard", "block")


@dataclass
class Verified:
    num_accepted: torch.Tensor  # [B] long, 0..k
    next_token: torch.Tensor  # [B] long: the token after the accepted drafts


def top_p_mask(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Logits with everything outside the top-p nucleus at -inf (vLLM's rule; the top token stays)."""
    if top_p >= 1.0:
        return logits
    sorted_logits, order = logits.sort(dim=-1, descending=False)
    cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    drop = cumulative <= 1.0 - top_p
    drop[..., -1] = False
    drop = drop.scatter(-1, order, drop)
    return logits.masked_fill(drop, float("-inf"))


def target_probs(logits: torch.Tensor, temperature: float, top_p: float = 1.0) -> torch.Tensor:
    """The target distribution the verifier uses at temperature > 0: softmax(top_p(logits / T))."""
    if temperature <= 0:
        raise ValueError("target_probs is for temperature > 0; temperature 0 verifies by argmax")
    return top_p_mask(logits.float() / temperature, top_p).softmax(dim=-1)


def draft_probs(
    draft_logits: torch.Tensor | None, draft_tokens: torch.Tensor, temperature: float, vocab_size: int
) -> torch.Tensor:
    """q [B, k, V]: softmax(draft_logits / T), or one-hot drafts when there are no draft logits."""
    if draft_logits is None:
        return torch.nn.functional.one_hot(draft_tokens, vocab_size).float()
    return (draft_logits.float() / temperature).softmax(dim=-1)


def _uniform(shape: tuple[int, ...], generator: torch.Generator | None, device) -> torch.Tensor:
    """Uniforms in (0, 1], as vLLM's `tl_rand32(..., includes_zero=False)` draws them."""
    return 1.0 - torch.rand(shape, generator=generator, device=device)


def _sample(weights: torch.Tensor, fallback: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row from non-negative `weights` [B, V] (rows summing to 0 use `fallback`)."""
    total = weights.sum(dim=-1, keepdim=True)
    probs = torch.where(total > 0, weights / total.clamp_min(1e-30), fallback)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def _pick(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """x [B, K, ...] at per-row position index [B] -> [B, ...]."""
    return x[torch.arange(x.shape[0], device=x.device), index]


def verify_greedy(target_logits: torch.Tensor, draft_tokens: torch.Tensor) -> Verified:
    """Temperature 0: accept the drafts that equal the target's argmax, then emit the argmax."""
    argmax = target_logits.argmax(dim=-1)  # [B, k+1]
    k = draft_tokens.shape[1]
    matches = (draft_tokens == argmax[:, :k]).long()
    accepted = matches.cumprod(dim=-1).sum(dim=-1)
    return Verified(accepted, _pick(argmax, accepted))


def verify_standard(
    p: torch.Tensor, q: torch.Tensor, draft_tokens: torch.Tensor, generator: torch.Generator | None = None
) -> Verified:
    """Token-by-token rejection sampling. p [B, k+1, V] target, q [B, k, V] draft probabilities."""
    bsz, k = draft_tokens.shape
    idx = draft_tokens.unsqueeze(-1)
    p_x = p[:, :k].gather(-1, idx).squeeze(-1)
    q_x = q.gather(-1, idx).squeeze(-1)
    u = _uniform((bsz, k), generator, p.device)
    accepted = (p_x > u * q_x).long().cumprod(dim=-1).sum(dim=-1)
    q_pad = torch.cat([q, q.new_zeros(bsz, 1, q.shape[-1])], dim=1)  # the bonus row residual is p itself
    p_at = _pick(p, accepted)
    residual = (p_at - _pick(q_pad, accepted)).clamp_min(0.0)
    return Verified(accepted, _sample(residual, p_at, generator))


def verify_block(
    p: torch.Tensor, q: torch.Tensor, draft_tokens: torch.Tensor, generator: torch.Generator | None = None
) -> Verified:
    """Block verification (Sun et al. 2024). Same inputs as `verify_standard`."""
    bsz, k = draft_tokens.shape
    idx = draft_tokens.unsqueeze(-1)
    ratio = p[:, :k].gather(-1, idx).squeeze(-1) / q.gather(-1, idx).squeeze(-1).clamp_min(1e-30)
    running = [p.new_ones(bsz)]  # c_0 .. c_k
    for i in range(k):
        running.append(torch.clamp(running[-1] * ratio[:, i], max=1.0))
    c = torch.stack(running, dim=1)  # [B, k+1]
    if k > 1:
        mass = (c[:, 1:k, None] * p[:, 1:k] - q[:, 1:k]).clamp_min(0.0).sum(dim=-1)  # R_1 .. R_{k-1}
        denom = mass + 1.0 - c[:, 1:k]
        h_inner = torch.where(denom > 0, mass / denom.clamp_min(1e-30), torch.ones_like(mass))
        h = torch.cat([h_inner, c[:, k:]], dim=1)
    else:
        h = c[:, 1:]
    u = _uniform((bsz, k), generator, p.device)
    steps = torch.arange(1, k + 1, device=p.device)
    accepted = torch.where(u <= h, steps, torch.zeros_like(steps)).amax(dim=-1) if k else p.new_zeros(bsz).long()
    q_pad = torch.cat([q, q.new_zeros(bsz, 1, q.shape[-1])], dim=1)
    p_at = _pick(p, accepted)
    residual = (_pick(c, accepted).unsqueeze(-1) * p_at - _pick(q_pad, accepted)).clamp_min(0.0)
    return Verified(accepted, _sample(residual, p_at, generator))


def verify(
    target_logits: torch.Tensor,
    draft_logits: torch.Tensor | None,
    draft_tokens: torch.Tensor,
    *,
    temperature: float,
    top_p: float = 1.0,
    method: str = "standard",
    generator: torch.Generator | None = None,
) -> Verified:
    """Verify k drafts per request (see the module docstring); k may be 0 (a plain decode step)."""
    if method not in METHODS:
        raise ValueError(f"verification method must be one of {METHODS}, got {method!r}")
    if temperature <= 0:
        return verify_greedy(target_logits, draft_tokens)
    p = target_probs(target_logits, temperature, top_p)
    q = draft_probs(draft_logits, draft_tokens, temperature, p.shape[-1])
    if draft_logits is not None and q.shape[-1] != p.shape[-1]:
        raise ValueError(f"draft vocabulary {q.shape[-1]} != target vocabulary {p.shape[-1]}")
    run = verify_block if method == "block" else verify_standard
    return run(p, q, draft_tokens, generator)


def sample_target(
    logits: torch.Tensor, temperature: float, top_p: float = 1.0, generator: torch.Generator | None = None
) -> torch.Tensor:
    """A plain (non-speculative) sample from the target: argmax at T = 0, else from `target_probs`."""
    if temperature <= 0:
        return logits.argmax(dim=-1)
    probs = target_probs(logits, temperature, top_p)
    return torch.multinomial(probs.reshape(-1, probs.shape[-1]), 1, generator=generator).view(probs.shape[:-1])


def confidence_prefix(confidence: torch.Tensor, threshold: float) -> int:
    """How many leading drafts to verify: those whose cumulative confidence (the product of the
    per-slot acceptance estimates, vLLM's "survival") stays >= threshold. threshold <= 0: all."""
    if threshold <= 0:
        return int(confidence.shape[-1])
    survival = confidence.float().cumprod(dim=-1)
    return int((survival >= threshold).long().cumprod(dim=-1).sum())
