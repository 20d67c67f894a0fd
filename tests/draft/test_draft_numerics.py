"""The fast training forward, incremental drafting and the slow reference agree (fp32: 1e-5)."""

from __future__ import annotations

import pytest
import torch
from reference.dspark_reference import DSparkReference
from reference.tiny_drafts import tiny_model, tiny_sequence

from dspark_cli.draft.drafting import ContextCache, draft_block

FP32 = dict(rtol=1e-5, atol=1e-5)
ARCHS = ["mla", "gqa"]


def _reference(model, embed, lm_head):
    return DSparkReference(model.config, model.state_dict(), embed, lm_head)


def _close(actual, expected, **tol):
    torch.testing.assert_close(actual.double(), torch.as_tensor(expected).double(), **(tol or FP32))


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("block_size", [1, 3, 7])
def test_training_forward_matches_reference(arch, block_size):
    model, embed, lm_head = tiny_model(arch, block_size=block_size)
    seq_len = 14
    aux, ids = tiny_sequence(seq_len)
    anchors = torch.tensor([[0, 1, 2, 6, 12, 13]])  # near the start (a=0: empty context) and end
    out = model(aux, ids, anchors)
    ref = _reference(model, embed, lm_head)
    assert out.logits.shape == (1, 6, block_size, model.config.vocab_size)
    for j, a in enumerate(anchors[0].tolist()):
        forced = [int(ids[0, min(a + i + 1, seq_len - 1)]) for i in range(block_size)]
        step = ref.step(aux[0, :a], int(ids[0, a]), block_size, forced=forced)
        for i in range(block_size):
            assert bool(out.valid[0, j, i]) == (a + i + 1 < seq_len)
            if not out.valid[0, j, i]:
                continue
            _close(out.hidden[0, j, i], step.hidden[i])
            _close(out.logits[0, j, i], step.logits[i])
            _close(out.confidence[0, j, i], step.confidence[i])
            assert int(out.target_ids[0, j, i]) == int(ids[0, a + i + 1])


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("with_markov", [True, False])
def test_greedy_drafting_matches_reference_and_training(arch, with_markov):
    model, embed, lm_head = tiny_model(arch, block_size=5, with_markov=with_markov)
    aux, ids = tiny_sequence(16)
    ref = _reference(model, embed, lm_head)
    cache = ContextCache(model, capacity=4)  # small capacity: exercises growth
    for a in (0, 1, 9):
        slot = cache.add_request()
        if a:
            cache.append(slot, aux[0, :a])
        block = draft_block(model, cache, [slot], ids[0, a : a + 1])
        step = ref.step(aux[0, :a], int(ids[0, a]), 5)
        assert block.tokens[0].tolist() == step.tokens
        _close(block.logits[0], torch.stack(step.logits))
        _close(block.confidence[0], step.confidence)
        # the training forward, teacher-forced with the drafted tokens, gives the same slots
        forced_ids = ids.clone()
        forced_ids[0, a + 1 : a + 6] = block.tokens[0]
        out = model(aux, forced_ids, torch.tensor([[a]]))
        _close(out.logits[0, 0], block.logits[0])
        _close(out.confidence[0, 0], block.confidence[0])


@pytest.mark.parametrize("arch", ARCHS)
def test_temperature_drafting_matches_reference_given_the_same_noise(arch):
    model, embed, lm_head = tiny_model(arch, block_size=4, seed=3)
    aux, ids = tiny_sequence(10, seed=4)
    cache = ContextCache(model)
    slot = cache.add_request()
    cache.append(slot, aux[0, :7])
    block = draft_block(model, cache, [slot], ids[0, 7:8], temperature=0.7, generator=torch.Generator().manual_seed(11))
    # drafting draws torch.rand(B, V) once per slot, slot by slot (drafting.py docstring)
    gen = torch.Generator().manual_seed(11)
    noise = [-torch.log(-torch.log(torch.rand((1, 97), generator=gen)))[0].double() for _ in range(4)]
    step = _reference(model, embed, lm_head).step(aux[0, :7], int(ids[0, 7]), 4, temperature=0.7, gumbel=noise)
    assert block.tokens[0].tolist() == step.tokens
    _close(block.logits[0], torch.stack(step.logits))


def test_temperature_sampling_follows_softmax():
    """Gumbel-max at temperature T draws from softmax(logits / T)."""
    from dspark_cli.draft.drafting import sample_tokens

    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, 0.5]]).expand(20000, -1)
    temp = torch.full((20000,), 0.8)
    draws = sample_tokens(logits, temp, torch.Generator().manual_seed(0))
    freq = torch.bincount(draws, minlength=5).double() / 20000
    expected = (logits[0] / 0.8).softmax(-1).double()
    assert (freq - expected).abs().max() < 0.015  # ~4 sigma at n=20000
    greedy = sample_tokens(logits[:3], torch.zeros(3), None)
    assert greedy.tolist() == [0, 0, 0]


@pytest.mark.parametrize("arch", ARCHS)
def test_batched_drafting_equals_one_request_at_a_time(arch):
    model, _, _ = tiny_model(arch, block_size=4)
    aux, ids = tiny_sequence(12, batch=3)
    lengths = [3, 0, 11]
    cache = ContextCache(model)
    slots = [cache.add_request() for _ in lengths]
    cache.extend({s: aux[b, :n] for b, (s, n) in enumerate(zip(slots, lengths)) if n})
    anchors = torch.stack([ids[b, n] for b, n in enumerate(lengths)])
    batched = draft_block(model, cache, slots, anchors)
    for b, slot in enumerate(slots):
        single = draft_block(model, cache, [slot], anchors[b : b + 1])
        assert batched.tokens[b].tolist() == single.tokens[0].tolist()
        _close(batched.logits[b], single.logits[0])
        _close(batched.confidence[b], single.confidence[0])


@pytest.mark.parametrize("arch", ARCHS)
def test_incremental_cache_with_rollback_equals_fresh_cache(arch):
    model, _, _ = tiny_model(arch, block_size=3)
    aux, ids = tiny_sequence(14)
    other, _ = tiny_sequence(14, seed=9)
    cache = ContextCache(model, capacity=2)
    slot = cache.add_request()
    cache.append(slot, aux[0, :5])
    cache.append(slot, other[0, 5:9])  # drafts the target later rejects
    cache.truncate(slot, 5)
    cache.append(slot, aux[0, 5:8])
    cache.append(slot, aux[0, 8:10])
    incremental = draft_block(model, cache, [slot], ids[0, 10:11])
    fresh_cache = ContextCache(model)
    fresh = fresh_cache.add_request()
    fresh_cache.append(fresh, aux[0, :10])
    once = draft_block(model, fresh_cache, [fresh], ids[0, 10:11])
    assert incremental.tokens.tolist() == once.tokens.tolist()
    _close(incremental.logits, once.logits)
    with pytest.raises(ValueError):
        cache.truncate(slot, 11)


@pytest.mark.parametrize("arch", ARCHS)
def test_padded_batch_equals_rows_one_by_one(arch):
    model, _, _ = tiny_model(arch, block_size=4)
    aux, ids = tiny_sequence(12, batch=2)
    seq_lens = torch.tensor([12, 7])
    anchors = torch.tensor([[0, 5, 10], [2, 6, 0]])
    anchor_mask = torch.tensor([[True, True, True], [True, True, False]])
    batch = model(aux, ids, anchors, seq_lens=seq_lens, anchor_mask=anchor_mask)
    assert not batch.valid[1, 2].any()  # padded anchor
    assert batch.valid[1, 1].tolist() == [False] * 4  # 6 + 0 + 1 = 7: past the row's end
    for b in range(2):
        n = int(seq_lens[b])
        keep = anchor_mask[b]
        row = model(aux[b : b + 1, :n], ids[b : b + 1, :n], anchors[b : b + 1, keep])
        valid = batch.valid[b, keep]
        assert torch.equal(valid, row.valid[0])
        _close(batch.logits[b, keep][valid], row.logits[0][valid])


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize(
    "impl", ["eager", pytest.param("flex", marks=pytest.mark.slow), "blockwise"]
)  # flex: a compile
def test_attention_impls_agree(arch, impl):
    model, _, _ = tiny_model(arch, block_size=3)
    other, _, _ = tiny_model(arch, block_size=3, attn_impl=impl)
    aux, ids = tiny_sequence(10)
    anchors = torch.tensor([[0, 4, 8]])
    with torch.no_grad():  # flex has no backward on CPU
        _close(other(aux, ids, anchors).logits, model(aux, ids, anchors).logits)


@pytest.mark.parametrize("arch", ARCHS)
def test_blockwise_attention_gradients_equal_sdpa(arch):
    """Two padded rows with different context limits (one block sees no context at all): the
    blockwise products give SDPA's outputs and gradients. In float64, where both are exact to
    ~1e-15 (in fp32 their different summation orders differ by ~1e-5 relative on a few of the
    MLA gradients)."""
    model, _, _ = tiny_model(arch, block_size=3, dtype=torch.float64)
    other, _, _ = tiny_model(arch, block_size=3, dtype=torch.float64, attn_impl="blockwise")
    aux, ids = tiny_sequence(10, batch=2, dtype=torch.float64)
    anchors = torch.tensor([[0, 4, 8], [2, 3, 0]])
    seq_lens, anchor_mask = torch.tensor([10, 6]), torch.tensor([[True, True, True], [True, True, False]])
    grads = []
    for m in (model, other):
        out = m(aux, ids, anchors, seq_lens=seq_lens, anchor_mask=anchor_mask)
        (out.logits.sin().sum() + out.confidence.sum()).backward()
        grads.append({n: p.grad for n, p in m.named_parameters()})
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        _close(grads[1][name], grads[0][name], rtol=1e-10, atol=1e-12)


def test_mla_absorbed_attention_equals_materialised():
    from dspark_cli.draft.attention import BlockLayout

    model, _, _ = tiny_model("mla", block_size=3)
    aux, _ = tiny_sequence(6, batch=2)
    positions = torch.arange(6).expand(2, 6)
    ctx = model.context_kv(aux, positions)
    x = torch.randn(2, 3, 64)
    cos, sin = model.rope_angles(6 + torch.arange(3).expand(2, 3))
    layout = BlockLayout(num_ctx=6, block_size=3, ctx_limit=torch.tensor([[6], [4]]))
    attn = model.layers[0].self_attn
    _close(
        attn(x, cos, sin, ctx[0], layout, "sdpa", absorbed=True),
        attn(x, cos, sin, ctx[0], layout, "sdpa", absorbed=False),
    )


@pytest.mark.parametrize("arch", ARCHS)
def test_backward_trains_only_draft_parameters(arch):
    model, embed, lm_head = tiny_model(arch, block_size=3)
    aux, ids = tiny_sequence(10)
    out = model(aux, ids, torch.tensor([[1, 5]]))
    (out.logits.square().mean() + out.confidence.mean()).backward()
    names = {n for n, _ in model.named_parameters()}
    assert all(p.grad is not None for p in model.parameters())
    assert not any("embed" in n or "lm_head" in n for n in names | set(model.state_dict()))
    assert embed.grad is None and lm_head.grad is None


BF16_UNIT_ROUNDOFF = 2.0**-8


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("num_layers", [1, 3])
def test_bf16_agrees_within_rounding_budget(arch, num_layers):
    """bf16 forward and drafting vs the float64 reference on the same bf16-rounded weights.

    Budget: |d logits| <= 4 u (L + 2) rms(logits), u = 2^-8 the bf16 unit roundoff. Each of
    the L layers rounds its attention and MLP outputs and the residual stream to bf16
    (relative error <= u each, partly cancelling); the context projection / embeddings and the
    final norm + lm_head add about two more layers' worth; the factor 4 covers the maximum over
    all B*N*V logits (~4 sigma). Measured: 6u (L=1) to 15u (L=4), about half the budget, while
    a real bug (wrong RoPE, mask or head) moves logits by O(rms). Confidences (sigmoid) get
    u (L + 2) absolute.
    """
    model, embed, lm_head = tiny_model(arch, block_size=5, num_layers=num_layers, dtype=torch.bfloat16)
    aux, ids = tiny_sequence(16, seed=5, dtype=torch.bfloat16)
    ref = _reference(model, embed, lm_head)
    budget = 4 * BF16_UNIT_ROUNDOFF * (num_layers + 2)
    anchors = [0, 3, 9]
    out = model(aux, ids, torch.tensor([anchors]))
    cache = ContextCache(model)
    for j, a in enumerate(anchors):
        forced = [int(ids[0, min(a + i + 1, 15)]) for i in range(5)]
        step = ref.step(aux[0, :a], int(ids[0, a]), 5, forced=forced)
        expected = torch.stack(step.logits)
        tol = dict(rtol=0.0, atol=budget * float(expected.pow(2).mean().sqrt()))
        _close(out.logits[0, j], expected, **tol)
        _close(out.confidence[0, j], step.confidence, rtol=0.0, atol=BF16_UNIT_ROUNDOFF * (num_layers + 2))
        slot = cache.add_request()
        if a:
            cache.append(slot, aux[0, :a])
        block = draft_block(model, cache, [slot], ids[0, a : a + 1], block_size=5)
        greedy = ref.step(aux[0, :a], int(ids[0, a]), 5, forced=block.tokens[0].tolist())
        _close(block.logits[0], torch.stack(greedy.logits), **tol)


def test_draft_probs_and_per_request_temperatures():
    model, _, _ = tiny_model("gqa", block_size=3)
    aux, ids = tiny_sequence(8, batch=2)
    cache = ContextCache(model)
    slots = [cache.add_request(), cache.add_request()]
    cache.extend({slots[0]: aux[0, :5], slots[1]: aux[1, :5]})
    temps = torch.tensor([0.0, 1.0])
    block = draft_block(model, cache, slots, ids[:, 5], temperature=temps, generator=torch.Generator().manual_seed(0))
    greedy = draft_block(model, cache, slots[:1], ids[:1, 5])
    assert block.tokens[0].tolist() == greedy.tokens[0].tolist()  # T=0 row stays greedy
    probs = block.probs(temps)
    assert torch.equal(probs[0], torch.nn.functional.one_hot(block.tokens[0], 97).float())
    _close(probs[1], block.logits[1].softmax(-1))


def test_draft_topk_keeps_only_the_base_top_k_candidates():
    model, _, _ = tiny_model("mla", block_size=4)
    aux, ids = tiny_sequence(8)
    cache = ContextCache(model)
    slot = cache.add_request()
    cache.append(slot, aux[0, :6])
    full = draft_block(model, cache, [slot], ids[0, 6:7])
    top = draft_block(model, cache, [slot], ids[0, 6:7], draft_topk=5)
    for i in range(4):
        # with the same prefix the kept logits equal the full ones; the rest are -inf
        if top.tokens[0, :i].tolist() != full.tokens[0, :i].tolist():
            break
        base_top = model.base_logits(top.hidden[0, i]).topk(5).indices
        finite = torch.isfinite(top.logits[0, i]).nonzero().flatten()
        assert sorted(finite.tolist()) == sorted(base_top.tolist())
        _close(top.logits[0, i, finite], full.logits[0, i, finite])
        assert int(top.tokens[0, i]) in base_top.tolist()
    every = draft_block(model, cache, [slot], ids[0, 6:7], draft_topk=97)
    assert every.tokens.tolist() == full.tokens.tolist()
