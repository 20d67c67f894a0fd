"""The reference engine: lossless end to end (statistics on table models), token-exact at T = 0 with a
real transformers target, and its KV-cache / context bookkeeping checked against full recomputation.

    .venv/bin/python -m pytest tests/bench/test_bench_engine.py -q

Engine-level losslessness: prompt [0], 4 generated tokens, a vocabulary of 3 (81 sequences), blocks of
2 drafts, so every generation runs the prefill sample plus 1-2 speculative steps with rollbacks. The
target's next-token law depends on position and the two previous tokens, so feeding it a wrong
prefix after a rejection (a cropping or bookkeeping bug) changes the output law. 6,000 generations
per case; Pearson chi-square on 80 df at alpha = 1e-3 with fixed seeds (deterministic);
tests/bench/test_bench_verify.py shows this size of test rejects textbook-lossy verifiers by a wide margin.
"""

from __future__ import annotations

import random

import pytest
import torch
from bench_support import (
    TINY_LAYER_IDS,
    TableDrafter,
    TableLM,
    TableTarget,
    chi_square_pvalue,
    table_law,
    tiny_random_target,
    write_random_draft,
)

from dspark_cli.bench.engine import (
    DSparkDrafter,
    HFTarget,
    Proposal,
    Sampling,
    Speculation,
    SpeculativeEngine,
)

pytestmark = pytest.mark.usefixtures("one_thread")

ALPHA = 1e-3


def table_pair(seed: int = 1) -> tuple[TableLM, TableLM]:
    target = TableLM(3, seed)
    draft = TableLM(3, seed + 1)
    noise = torch.randn(target.table.shape, generator=torch.Generator().manual_seed(seed + 2))
    draft.table = target.table + 1.0 * noise  # correlated with the target: partial acceptance
    return target, draft


@pytest.mark.slow  # a chi-square test of the output law: thousands of generations, 15-40 s each loaded
@pytest.mark.parametrize(
    ("method", "draft_method", "temperature", "top_p"),
    [
        ("standard", "probabilistic", 1.0, 1.0),
        ("block", "probabilistic", 1.0, 1.0),
        ("block", "greedy", 0.8, 0.9),
    ],
)
def test_engine_output_law_is_the_targets(method, draft_method, temperature, top_p):
    target_lm, draft_lm = table_pair()
    target, drafter = TableTarget(target_lm), TableDrafter(draft_lm)
    engine = SpeculativeEngine(target, drafter, Speculation(2, draft_method, method))
    sampling = Sampling(temperature=temperature, top_p=top_p, max_tokens=4)
    counts = torch.zeros(81)
    accepted = steps = 0
    for seed in range(6000):
        out = engine.generate([0], sampling, seed=seed)
        assert len(out.token_ids) == 4
        # the drafter's context is the verified prefix: prompt + every emitted token but the last (the
        # last step may have verified more than max_tokens lets through)
        emitted = [0, *out.token_ids]
        assert len(drafter.context) >= len(emitted) - 1
        assert drafter.context[: len(emitted) - 1] == emitted[:-1]
        code = 0
        for token in out.token_ids:
            code = code * 3 + token
        counts[code] += 1
        accepted += sum(out.accepted)
        steps += out.num_steps
    stat, df, pvalue = chi_square_pvalue(counts, 6000 * table_law(target_lm, [0], 4, temperature, top_p))
    assert 0.2 < accepted / steps < 1.8, "the case must exercise partial acceptance"
    print(
        f"{method}/{draft_method} T={temperature} top_p={top_p}: chi2 {stat:.1f} on {df} df, p = {pvalue:.3f}, "
        f"accepted per step {accepted / steps:.2f}"
    )
    assert pvalue > ALPHA, f"chi2 = {stat:.1f} on {df} df, p = {pvalue:.2e}"


class ReplayDrafter:
    """Proposes the reference continuation with every third draft corrupted: partial acceptance at T = 0."""

    has_confidence = False

    def __init__(self, prompt: list[int], reference: list[int], vocab: int) -> None:
        self.sequence = [*prompt, *reference]
        self.vocab = vocab
        self.rows: list[torch.Tensor] = []
        self.rng = random.Random(0)

    def begin(self, aux):
        self.rows = [aux]

    def accept(self, aux):
        self.rows.append(aux)

    def end(self):
        pass

    def propose(self, anchor, *, temperature, greedy, num_tokens, generator, history=None):
        start = sum(r.shape[0] for r in self.rows) + 1  # the context ends before the anchor
        truth = self.sequence[start : start + num_tokens]
        truth += [0] * (num_tokens - len(truth))
        drafts = [t if self.rng.random() > 0.3 else (t + 1) % self.vocab for t in truth]
        return Proposal(torch.tensor(drafts), None, None)


def test_t0_output_equals_target_greedy_and_context_states_match_recompute():
    model = tiny_random_target()
    prompt = [5, 17, 33, 2, 9, 41]
    reference = model.generate(
        torch.tensor([prompt]),
        attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
        max_new_tokens=48,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
    )[0, len(prompt) :]
    reference = reference.tolist()
    target = HFTarget(model, TINY_LAYER_IDS)
    drafter = ReplayDrafter(prompt, reference, model.config.vocab_size)
    engine = SpeculativeEngine(target, drafter, Speculation(4, "greedy", "standard"))
    out = engine.generate(prompt, Sampling(temperature=0.0, max_tokens=48))
    assert out.token_ids == reference
    assert 0 < sum(out.accepted) < sum(out.verified), "partial acceptance must have happened"
    # every verified position's target states, in order, equal a fresh full forward's layer outputs
    full = [*prompt, *out.token_ids]
    states = torch.cat(drafter.rows)
    with torch.no_grad():
        hidden = model(torch.tensor([full]), output_hidden_states=True).hidden_states
    # all but the last emitted token were verified (the last step may verify past max_tokens)
    assert states.shape[0] >= len(full) - 1
    states = states[: len(full) - 1].split(model.config.hidden_size, dim=-1)
    for k, got in zip(TINY_LAYER_IDS, states, strict=True):
        if k < model.config.num_hidden_layers - 1:
            torch.testing.assert_close(got, hidden[k + 1][0, : len(full) - 1], rtol=1e-4, atol=1e-4)
        else:  # the last layer: its raw (pre-norm) output, which transformers returns only after the norm
            torch.testing.assert_close(model.model.norm(got), hidden[-1][0, : len(full) - 1], rtol=1e-4, atol=1e-4)
            assert not torch.allclose(got, hidden[-1][0, : len(full) - 1], atol=1e-2)


@pytest.mark.parametrize("method", ["standard", "block"])
def test_dspark_drafter_runs_and_random_draft_accepts_little(tmp_path, method):
    model = tiny_random_target()
    target = HFTarget(model, TINY_LAYER_IDS)
    drafter = DSparkDrafter.from_dir(str(write_random_draft(tmp_path / "draft")), target)
    engine = SpeculativeEngine(target, drafter, Speculation(4, "probabilistic", method))
    prompt = [5, 17, 33, 2, 9, 41]
    greedy = engine.generate(prompt, Sampling(temperature=0.0, max_tokens=24))
    plain = SpeculativeEngine(target).generate(prompt, Sampling(temperature=0.0, max_tokens=24))
    assert greedy.token_ids == plain.token_ids
    sampled = engine.generate(prompt, Sampling(temperature=1.0, max_tokens=24), seed=3)
    assert len(sampled.token_ids) == 24 and sampled.num_steps >= 1
    assert 1.0 <= sampled.tau < 2.0


def test_confidence_threshold_shortens_verified_blocks(tmp_path):
    model = tiny_random_target()
    target = HFTarget(model, TINY_LAYER_IDS)
    drafter = DSparkDrafter.from_dir(str(write_random_draft(tmp_path / "draft", confidence_bias=0.0)), target)
    prompt = [5, 17, 33, 2, 9, 41]
    runs = {}
    for threshold in (0.0, 0.3, 0.99):
        engine = SpeculativeEngine(target, drafter, Speculation(4, "probabilistic", "block", threshold))
        runs[threshold] = engine.generate(prompt, Sampling(temperature=0.0, max_tokens=16))
    assert set(runs[0.0].verified) == {4}
    assert set(runs[0.99].verified) == {0}  # sigmoid(~0) ~ 0.5 < 0.99: plain decoding
    assert all(0 <= k <= 4 for k in runs[0.3].verified)
    assert runs[0.0].token_ids == runs[0.3].token_ids == runs[0.99].token_ids  # lossless at T = 0
