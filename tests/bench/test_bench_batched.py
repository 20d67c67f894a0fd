"""The batched reference engine computes what the sequential one does, request for request.

    .venv/bin/python -m pytest tests/bench/test_bench_batched.py -q

On the bundled tiny targets (tiny-gqa: Qwen3; tiny-mla: DeepseekV3) with an exported random DSpark draft,
the n-gram baseline, an oracle drafter that proposes the target's own greedy text with every third draft
corrupted (so most steps accept some drafts and roll the rest back: the case a cache bug shows in), and
plain decoding: prompts of different lengths, at T = 0 and T = 1, batch sizes below the number of
requests (requests leave and join mid-run). Every request's tokens, accepted and verified counts must
equal the sequential engine's. Both engines run fp32; batching changes float summation order only
(1e-6 level on these logits), and no argmax or sampling decision flipped on these cases.
Then `run_offline` with bench.batch_size 1 and 4 writes the same report numbers.
"""

from __future__ import annotations

import hashlib

import pytest
import torch
from bench_support import export_random_draft

from dspark_cli.bench.baselines import NgramDrafter
from dspark_cli.bench.batched import BatchedEngine, BatchTarget, EachRequest, batch_drafter
from dspark_cli.bench.engine import DSparkDrafter, Proposal, Request, Sampling, Speculation, SpeculativeEngine
from dspark_cli.recipe import load_recipe

pytestmark = pytest.mark.usefixtures("one_thread")

LENGTHS = (3, 11, 26, 7, 40, 18)
MAX_TOKENS = 24


class OracleDrafter:
    """Drafts the target's greedy continuation of the request's prompt, every third draft corrupted by a
    hash of (context length, slot): deterministic, so both engines see the same proposals."""

    has_confidence = False

    def __init__(self, references: dict[tuple[int, ...], list[int]], vocab: int) -> None:
        self.references, self.vocab = references, vocab

    def begin(self, aux):
        pass

    def accept(self, aux):
        pass

    def end(self):
        pass

    def propose(self, anchor, *, temperature, greedy, num_tokens, generator, history=None):
        prompt = next(p for p in self.references if tuple(history[: len(p)]) == p)
        done = len(history) - len(prompt)  # output tokens so far, the anchor included
        truth = self.references[prompt][done : done + num_tokens]
        drafts = []
        for i, token in enumerate(truth):
            digest = hashlib.sha256(f"{len(history)}:{i}".encode()).digest()[0]
            drafts.append(token if digest % 3 else (token + 1) % self.vocab)
        return Proposal(torch.tensor(drafts, dtype=torch.long), None, None)


@pytest.fixture(scope="module", params=["tiny-gqa", "tiny-mla"])
def setup(request, tmp_path_factory):
    name = request.param
    recipe = load_recipe("tiny", [f"target.model={name}", f"draft.arch={'mla' if name == 'tiny-mla' else 'gqa'}"])
    draft = export_random_draft(recipe, tmp_path_factory.mktemp(name) / "draft")
    from dspark_cli.bench.offline import BenchDraft, BenchTarget

    shared = BenchTarget(recipe)
    loaded = BenchDraft.read(draft, recipe.target.model)
    target = shared.reader(list(loaded.loaded.config.target_layer_ids))
    drafter = DSparkDrafter.from_loaded(loaded.loaded, target)
    gen = torch.Generator().manual_seed(0)
    vocab = target.vocab_size
    prompts = [torch.randint(2, vocab, (n,), generator=gen).tolist() for n in LENGTHS]
    plain = SpeculativeEngine(target)
    references = {
        tuple(p): [p[-1], *plain.generate(p, Sampling(0.0, max_tokens=MAX_TOKENS + 8)).token_ids] for p in prompts
    }
    # the oracle's reference starts at the last prompt token: history[len(prompt) - 1 + done] is the anchor
    references = {p[:-1]: ref for p, ref in references.items()}
    return target, drafter, prompts, references, shared.stop_ids


def _compare(target, drafter, spec, prompts, temperature, stop_ids, batch_size):
    sampling = Sampling(temperature, 1.0, MAX_TOKENS, frozenset(stop_ids), 512)
    requests = [Request(p, sampling, seed=100 + i) for i, p in enumerate(prompts)]
    sequential = SpeculativeEngine(target, drafter, spec).generate_many(requests)
    batched_drafter = batch_drafter(drafter) if isinstance(drafter, (DSparkDrafter, NgramDrafter)) else None
    if drafter is not None and batched_drafter is None:
        batched_drafter = EachRequest(drafter)
    batched = BatchedEngine(target, batched_drafter, spec, batch_size=batch_size).generate_many(requests)
    for one, many in zip(sequential, batched, strict=True):
        assert many.token_ids == one.token_ids
        assert many.accepted == one.accepted
        assert many.verified == one.verified
        assert many.finish_reason == one.finish_reason
    return sequential


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_batched_engine_equals_sequential(setup, temperature):
    target, drafter, prompts, references, stop_ids = setup
    block = Speculation(4, "probabilistic", "block")
    runs = {
        "dspark": _compare(target, drafter, block, prompts, temperature, stop_ids, 4),
        "oracle": _compare(
            target,
            OracleDrafter(references, target.vocab_size),
            Speculation(4, "greedy", "standard"),
            prompts,
            temperature,
            stop_ids,
            3,
        ),
        "ngram": _compare(
            target, NgramDrafter(1, 3), Speculation(4, "greedy", "standard"), prompts, temperature, stop_ids, 4
        ),
        "plain": _compare(target, None, None, prompts, temperature, stop_ids, 4),
    }
    accepted = {name: sum(a for out in outs for a in out.accepted) for name, outs in runs.items()}
    verified = {name: sum(v for out in outs for v in out.verified) for name, outs in runs.items()}
    assert 0 < sum(accepted.values()) < sum(verified.values()), f"partial acceptance: {accepted} of {verified}"
    if temperature == 0.0:  # the oracle drafts the greedy text (2 of 3 drafts right): most steps accept some
        assert verified["oracle"] / 4 < accepted["oracle"] < verified["oracle"]
        for out, plain in zip(runs["oracle"], runs["plain"], strict=True):
            assert out.token_ids == plain.token_ids  # lossless at T = 0, batched too


def test_batch_cache_rolls_back_to_a_fresh_forward(setup):
    """After steps with rejections and compaction, each row's logits for the next token equal a fresh
    one-request forward over that request's accepted tokens."""
    target, _, prompts, _, _ = setup
    batch = BatchTarget(target)
    texts = [list(p) for p in prompts[:3]]
    for text in texts:
        _, _, kv = batch.prefill(text)
        batch.add(kv, len(text))
    gen = torch.Generator().manual_seed(1)
    for step in range(12):
        blocks = [torch.randint(2, target.vocab_size, (1 + (step + b) % 5,), generator=gen).tolist() for b in range(3)]
        batch.step(blocks)
        kept = [1 + (step * 7 + b) % len(block) for b, block in enumerate(blocks)]
        batch.keep(kept)
        for text, block, k in zip(texts, blocks, kept, strict=True):
            text += block[:k]
        batch._compact() if step % 4 == 3 else None
    probe = [[7], [8], [9]]
    logits, _ = batch.step(probe)
    for b, text in enumerate(texts):
        target.reset()
        fresh, _ = target.forward([*text, probe[b][0]], last_only=True)
        torch.testing.assert_close(logits[b, 0], fresh[-1], rtol=1e-4, atol=1e-4)
    target.reset()


@pytest.mark.slow  # run_offline twice (main runs at two temperatures, both baselines) on tiny-mla: ~25 s loaded
def test_run_offline_batched_equals_sequential(tmp_path):
    from dspark_cli.bench.offline import run_offline

    base = [
        "target.model=tiny-mla",
        "draft.arch=mla",
        "bench.datasets=[mt_bench]",
        "bench.num_prompts=3",
        "bench.max_tokens=24",
        "bench.temperatures=[0.0, 1.0]",
        "bench.confidence_thresholds=[0.0, 0.5]",
        "bench.model_concurrency=[1, 4]",
    ]
    recipe = load_recipe("tiny", base)
    draft = export_random_draft(recipe, tmp_path / "draft")
    results = {size: run_offline(load_recipe("tiny", [*base, f"bench.batch_size={size}"]), draft) for size in (1, 4)}

    def numbers(result):
        keep = ("tau", "num_steps", "output_tokens", "acceptance_per_position", "verified_per_step", "num_turns")
        runs = [{k: r[k] for k in keep if k in r} for r in result["runs"]]
        baselines = [{k: b[k] for k in ("name", "tau", "num_steps")} for b in result["baselines"]]
        return runs, baselines, [(s["threshold"], s["tau"]) for s in result["confidence_sweep"]]

    assert numbers(results[4]) == numbers(results[1])
    assert results[1]["runs"][0]["num_turns"] == 6  # 3 MT-Bench questions x 2 turns
