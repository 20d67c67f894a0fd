"""Losslessness of verification (standard and block), checked statistically against exact target laws.

    .venv/bin/python -m pytest tests/bench/test_bench_verify.py -q

Set-up: a vocabulary of 3 tokens and k = 3 drafts after a fixed context. The target and the draft are
random tables of logits indexed by the whole prefix (so every position's distribution depends on
what came before, as in a language model). One verification step emits tau = a + 1 tokens; the test
completes each output to L = k + 1 tokens by sampling the rest from the target itself (what the
next engine steps would emit if they were lossless), so the completed sequence must follow the
target's exact joint law over 3^4 = 81 sequences, computed by enumeration.

Statistics: Pearson chi-square over the sequences the target can produce (all 81 without top-p,
fewer with it; df = cells - 1), 200,000 independent trials per case, one fixed seed (deterministic).
A correct verifier fails at level alpha = 1e-3 with probability 1e-3 over seeds (measured p-values:
0.16 to 0.95); the negative controls (a textbook mistake each) give chi2 > 24,000 at the same sample
size (p = 0 in double precision), so the test has power far beyond what alpha costs.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from dspark_cli.bench.verify import (
    Verified,
    confidence_prefix,
    target_probs,
    top_p_mask,
    verify,
    verify_greedy,
    verify_standard,
)

V, K = 3, 3
L = K + 1
TRIALS = 200_000
ALPHA = 1e-3

pytestmark = pytest.mark.usefixtures("one_thread")


def prefix_index(prefix: tuple[int, ...]) -> int:
    """Row of the logit table for a prefix (all prefixes of length 0..K, in length-major order)."""
    offset = sum(V**n for n in range(len(prefix)))
    return offset + sum(t * V ** (len(prefix) - 1 - i) for i, t in enumerate(prefix))


NUM_PREFIXES = sum(V**n for n in range(K + 1))


def tables(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    target = 1.5 * torch.randn(NUM_PREFIXES, V, generator=gen)
    draft = target + 1.2 * torch.randn(NUM_PREFIXES, V, generator=gen)  # related, but not equal
    return target, draft


def rows_for(tokens: torch.Tensor) -> torch.Tensor:
    """Table rows of every prefix of each row of tokens [B, n] -> [B, n + 1] (lengths 0..n)."""
    bsz, n = tokens.shape
    rows = [torch.zeros(bsz, dtype=torch.long)]
    code = torch.zeros(bsz, dtype=torch.long)
    for i in range(n):
        code = code * V + tokens[:, i]
        rows.append(sum(V**m for m in range(i + 1)) + code)
    return torch.stack(rows, dim=1)


def draw(probs: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """One sample per row of probs [B, V] by inverse CDF (faster than multinomial for 200k tiny rows)."""
    u = torch.rand(probs.shape[0], 1, generator=gen, dtype=probs.dtype)
    return (probs.cumsum(-1) <= u).sum(-1).clamp(max=probs.shape[-1] - 1)


def one_step(
    target_table, draft_table, *, temperature, top_p, probabilistic, method, gen, verifier=None, complete=True
):
    """Draft K tokens from the draft table, verify; return (completed sequences [B, L], accepted [B])."""
    drafts = torch.zeros(TRIALS, K, dtype=torch.long)
    for i in range(K):
        logits = draft_table[rows_for(drafts[:, :i])[:, -1]]
        if probabilistic:
            drafts[:, i] = draw((logits / temperature).softmax(-1), gen)
        else:
            drafts[:, i] = logits.argmax(-1)
    rows = rows_for(drafts)  # [B, K + 1]
    target_logits = target_table[rows]  # [B, K + 1, V]
    draft_logits = draft_table[rows[:, :K]] if probabilistic else None
    if verifier is None:
        out = verify(
            target_logits, draft_logits, drafts, temperature=temperature, top_p=top_p, method=method, generator=gen
        )
    else:
        p = target_probs(target_logits, temperature, top_p)
        q = (draft_logits / temperature).softmax(-1)
        out = verifier(p, q, drafts, gen)
    if not complete:
        return None, out.num_accepted
    seqs = torch.zeros(TRIALS, L, dtype=torch.long)
    seqs[:, :K] = drafts
    seqs[torch.arange(TRIALS), out.num_accepted] = out.next_token
    # complete every sequence past its emitted tokens with plain target sampling
    for j in range(1, L):
        todo = out.num_accepted + 1 <= j
        logits = target_table[rows_for(seqs[:, :j])[:, -1]]
        fresh = draw(target_probs(logits, temperature, top_p), gen)
        seqs[:, j] = torch.where(todo, fresh, seqs[:, j])
    return seqs, out.num_accepted


def exact_law(target_table, temperature, top_p) -> torch.Tensor:
    """P(s) for all V^L sequences s, in lexicographic order."""
    probs = target_probs(target_table, temperature, top_p)
    law = []
    for seq in itertools.product(range(V), repeat=L):
        value = 1.0
        for j, token in enumerate(seq):
            value *= float(probs[prefix_index(seq[:j]), token])
        law.append(value)
    return torch.tensor(law, dtype=torch.float64)


def chi_square_pvalue(seqs: torch.Tensor, law: torch.Tensor) -> tuple[float, float]:
    code = torch.zeros(seqs.shape[0], dtype=torch.long)
    for j in range(L):
        code = code * V + seqs[:, j]
    observed = torch.bincount(code, minlength=V**L).double()
    expected = law * seqs.shape[0]
    keep = expected > 0
    assert observed[~keep].sum() == 0, "a sequence the target can never produce was emitted"
    stat = float(((observed[keep] - expected[keep]) ** 2 / expected[keep]).sum())
    df = int(keep.sum()) - 1
    return stat, float(
        torch.special.gammaincc(
            torch.tensor(df / 2.0, dtype=torch.float64), torch.tensor(stat / 2.0, dtype=torch.float64)
        )
    )


CASES = [  # (method, probabilistic drafts, temperature, top_p)
    ("standard", True, 1.0, 1.0),
    ("block", True, 1.0, 1.0),
    ("standard", True, 0.7, 0.9),
    ("block", True, 0.7, 0.9),
    ("standard", False, 1.0, 0.9),
    ("block", False, 1.0, 0.9),
]


@pytest.mark.parametrize(("method", "probabilistic", "temperature", "top_p"), CASES)
def test_verification_is_lossless(method, probabilistic, temperature, top_p):
    target, draft = tables(seed=1)
    gen = torch.Generator().manual_seed(2)
    seqs, accepted = one_step(
        target, draft, temperature=temperature, top_p=top_p, probabilistic=probabilistic, method=method, gen=gen
    )
    stat, pvalue = chi_square_pvalue(seqs, exact_law(target, temperature, top_p))
    assert 0.3 < accepted.float().mean() < K - 0.3, "the case must exercise partial acceptance"
    assert pvalue > ALPHA, f"{method}: chi2 = {stat:.1f}, p = {pvalue:.2e}"


def _residual_is_target(p, q, drafts, gen):  # the classic bug: resample from p, not from max(p - q, 0)
    out = verify_standard(p, q, drafts, gen)
    bsz = drafts.shape[0]
    p_at = p[torch.arange(bsz), out.num_accepted]
    return Verified(out.num_accepted, torch.multinomial(p_at, 1, generator=gen).squeeze(-1))


def _block_acceptance_is_running_ratio(p, q, drafts, gen):  # block with h_i = c_i, no residual mass
    bsz, k = drafts.shape
    idx = drafts.unsqueeze(-1)
    ratio = p[:, :k].gather(-1, idx).squeeze(-1) / q.gather(-1, idx).squeeze(-1)
    running = [p.new_ones(bsz)]
    for i in range(k):
        running.append(torch.clamp(running[-1] * ratio[:, i], max=1.0))
    c = torch.stack(running, dim=1)
    u = 1.0 - torch.rand(bsz, k, generator=gen)
    steps = torch.arange(1, k + 1)
    at = torch.where(u <= c[:, 1:], steps, torch.zeros_like(steps)).amax(dim=-1)
    rows = torch.arange(bsz)
    q_pad = torch.cat([q, q.new_zeros(bsz, 1, V)], dim=1)
    residual = (c[rows, at].unsqueeze(-1) * p[rows, at] - q_pad[rows, at]).clamp_min(0)
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, p[rows, at])
    return Verified(at, torch.multinomial(residual, 1, generator=gen).squeeze(-1))


@pytest.mark.parametrize("broken", [_residual_is_target, _block_acceptance_is_running_ratio])
def test_the_test_catches_lossy_verifiers(broken):
    target, draft = tables(seed=1)
    gen = torch.Generator().manual_seed(2)
    seqs, _ = one_step(
        target, draft, temperature=1.0, top_p=1.0, probabilistic=True, method="standard", gen=gen, verifier=broken
    )
    stat, pvalue = chi_square_pvalue(seqs, exact_law(target, 1.0, 1.0))
    assert pvalue < 1e-12, f"chi2 = {stat:.1f}: the test cannot tell this lossy verifier apart"


@pytest.mark.parametrize("probabilistic", [True, False])
def test_block_accepts_at_least_as_many_tokens(probabilistic):
    target, draft = tables(seed=3)
    means = {}
    for method in ("standard", "block"):
        gen = torch.Generator().manual_seed(4)
        _, accepted = one_step(
            target,
            draft,
            temperature=1.0,
            top_p=1.0,
            probabilistic=probabilistic,
            method=method,
            gen=gen,
            complete=False,
        )
        means[method] = (accepted.double().mean().item(), accepted.double().std().item() / TRIALS**0.5)
    (std_mean, std_se), (blk_mean, blk_se) = means["standard"], means["block"]
    assert blk_mean > std_mean - 3 * (std_se**2 + blk_se**2) ** 0.5, means


def test_greedy_verification_matches_argmax_rule():
    logits = torch.tensor([[[0.0, 5.0, 1.0], [3.0, 0.0, 1.0], [0.0, 0.0, 9.0], [1.0, 2.0, 0.0]]])
    out = verify_greedy(logits, torch.tensor([[1, 0, 1]]))  # third draft differs from argmax 2
    assert out.num_accepted.tolist() == [2] and out.next_token.tolist() == [2]
    out = verify_greedy(logits, torch.tensor([[1, 0, 2]]))  # all accepted: the bonus is argmax of row 3
    assert out.num_accepted.tolist() == [3] and out.next_token.tolist() == [1]
    out = verify(logits[:, :1], None, torch.zeros(1, 0, dtype=torch.long), temperature=0.0)
    assert out.num_accepted.tolist() == [0] and out.next_token.tolist() == [1]


def test_top_p_keeps_the_smallest_nucleus():
    logits = torch.log(torch.tensor([[0.5, 0.05, 0.3, 0.15]]))
    kept = torch.isfinite(top_p_mask(logits, 0.8))
    assert kept.tolist() == [[True, False, True, False]]  # 0.5 + 0.3 reach 0.8
    kept = torch.isfinite(top_p_mask(logits, 0.81))
    assert kept.tolist() == [[True, False, True, True]]
    assert torch.isfinite(top_p_mask(logits, 0.01)).sum() == 1  # the top token always stays


def test_confidence_prefix_counts_the_surviving_drafts():
    conf = torch.tensor([0.9, 0.8, 0.5, 0.9])  # survival 0.9, 0.72, 0.36, 0.324
    assert confidence_prefix(conf, 0.0) == 4
    assert confidence_prefix(conf, 0.7) == 2
    assert confidence_prefix(conf, 0.95) == 0
    assert confidence_prefix(conf, 0.3) == 4
