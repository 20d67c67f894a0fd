"""The CUDA training path's code, run on the CPU wherever torch allows it.

    .venv/bin/python -m pytest tests/training/test_train_gpu_path.py -q        # ~1-2 min on 2 cores (flex compiles)

On a GPU training takes flex attention (compiled), static batch shapes (`train.length_buckets`),
`torch.compile` with a recompile limit, and counts FLOPs over its first step. Here: the compile helper
under torch 2.11's `torch.compile` keywords; flex attention's forward, compiled, under the loop's FLOP
counter (the count equal to an analytic one) and inside the trainer's step, eager and compiled; and
what torch cannot do on the CPU (flex's backward), named with torch's own error. bf16 autocast with
FSDP2's `MixedPrecisionPolicy` on 2 gloo processes, and a compiled run over length buckets, are whole
runs in tests/training/test_train_runs.py. The GPU-only remainder is listed in docs/status.md.
"""

from __future__ import annotations

import pytest
import torch
import train_fixtures
from reference.tiny_drafts import tiny_model, tiny_sequence

from dspark_cli.draft import attention
from dspark_cli.training.flops import attention_flops, count_flops


@pytest.fixture
def torch_211_compile(monkeypatch):
    """`torch.compile` with torch 2.11's keywords only, for this test (and dynamo's limit restored)."""
    import torch._dynamo.config as dynamo_config

    monkeypatch.setattr(torch, "compile", torch.compile)  # undone after the test
    limit = dynamo_config.recompile_limit  # (monkeypatch would delete the config entry on undo)
    train_fixtures.use_torch_211_compile()
    with pytest.raises(TypeError, match="recompile_limit"):  # as torch 2.11's own compile
        torch.compile(lambda x: x, recompile_limit=4)
    yield dynamo_config
    dynamo_config.recompile_limit = limit


@pytest.mark.slow  # a torch.compile: ~18 s loaded
def test_compiles_with_a_recompile_limit_under_torch_211_keywords(torch_211_compile, monkeypatch):
    """The trainer's static-shape compile and flex attention's compile set their recompile limits through
    dynamo's config where `torch.compile` has no `recompile_limit=` (torch < 2.13), raised, never lowered."""
    from dspark_cli.training.shapes import ShapePlan
    from dspark_cli.training.step import LossConfig, TrainStep

    torch_211_compile.recompile_limit = 8
    model, _, _ = tiny_model("gqa", block_size=3)
    plan = ShapePlan(lengths=tuple(range(16, 16 * 21, 16)), num_anchors=4, block_size=3)
    step = TrainStep(model, LossConfig(), compile=True, shapes=plan)
    assert callable(step.states_fn(torch.device("cpu")))
    assert torch_211_compile.recompile_limit == plan.max_shapes + 1 > 8
    monkeypatch.setattr(attention, "_compiled_flex", None)
    flex, _, _ = tiny_model("gqa", block_size=3, attn_impl="flex")
    aux, ids = tiny_sequence(10)
    with torch.no_grad():
        flex(aux, ids, torch.tensor([[0, 4, 8]]))
    assert torch_211_compile.recompile_limit == plan.max_shapes + 1  # flex's 16 is lower: kept


def _analytic_forward_flops(cfg, seq_len: int, anchors: list[int]) -> int:
    """FLOPs of the draft's training forward (`DSparkDraftModel.forward`, one row), from the config:
    every projection 2 * rows * in * out, attention 2 * (attended keys) * (qk + v dims) per query head."""
    t, n, heads = seq_len, cfg.block_size, cfg.num_attention_heads
    q, h = len(anchors) * n, cfg.hidden_size

    def mm(rows: int, fan_in: int, fan_out: int) -> int:
        return 2 * rows * fan_in * fan_out

    total = mm(t, cfg.target_hidden_size * cfg.num_target_layers, h)  # context projection
    if cfg.arch == "mla":
        latent, qk, v = (
            cfg.kv_lora_rank + cfg.qk_rope_head_dim,
            cfg.qk_nope_head_dim + cfg.qk_rope_head_dim,
            cfg.v_head_dim,
        )
        layer = (
            mm(t, h, latent)
            + mm(q, h, latent)  # context and own latents
            + mm(q, h, cfg.q_lora_rank)
            + mm(q, cfg.q_lora_rank, heads * qk)  # queries
            + mm(t + q, cfg.kv_lora_rank, heads * (cfg.qk_nope_head_dim + v))  # kv_b over every key
            + mm(q, heads * v, h)
        )
    else:
        qk = v = cfg.head_dim
        kv = 2 * cfg.num_key_value_heads * cfg.head_dim
        layer = mm(t, h, kv) + mm(q, h, kv) + mm(q, h, heads * qk) + mm(q, heads * v, h)
    layer += 3 * mm(q, h, cfg.intermediate_size)  # gate, up, down
    keys = sum(a + n for a in anchors)  # a block sees the context before its anchor and its own n slots
    layer += 2 * keys * n * heads * (qk + v)
    total += cfg.num_hidden_layers * layer
    total += mm(q, h, cfg.vocab_size) + mm(q, cfg.markov_rank, cfg.draft_vocab_size)  # lm_head, Markov bias
    total += mm(q, h + cfg.markov_rank, 1)  # confidence head (with the Markov embedding)
    return total


@pytest.mark.slow  # a flex compile: ~15 s
@pytest.mark.parametrize("arch", ["mla", "gqa"])
def test_flex_forward_compiled_under_the_flop_counter_counts_the_analytic_flops(arch):
    """The draft's real flex forward (compiled, as on CUDA) under the training loop's FLOP counting: it
    runs (flex's operator has no rule for a dispatch mode, so dspark runs attention outside it), gives
    SDPA's logits, and the FLOPs reported as the loop does (counted, attention added analytically; a
    forward is a third of `attention_flops`' forward + backward) equal the count from the config."""
    model, _, _ = tiny_model(arch, block_size=3)
    flex, _, _ = tiny_model(arch, block_size=3, attn_impl="flex")
    # (not 12 tokens: with 4 anchors of 3 slots, compiled flex on CPU computes wrong values at 12 queries x
    # 24 keys, even under a full mask, on torch 2.11 and 2.13 -- measured; eager flex and 28 keys are right)
    aux, ids = tiny_sequence(16)
    anchors = torch.tensor([[0, 4, 8, 9]])
    outs = []
    with torch.no_grad():  # flex has no backward on CPU (see the test below)
        counted = count_flops(lambda: outs.append(flex(aux, ids, anchors)))
        again = flex(aux, ids, anchors)  # and flex still compiles and runs after the counted call
        expected = model(aux, ids, anchors)
    torch.testing.assert_close(outs[0].logits, expected.logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(again.logits, expected.logits, rtol=1e-5, atol=1e-5)
    reported = counted + attention_flops(anchors, torch.ones_like(anchors, dtype=torch.bool), flex.config) // 3
    assert reported == _analytic_forward_flops(flex.config, 16, anchors[0].tolist())


def _examples(lengths: list[int], num_anchors: int):
    """Captured-like examples for the tiny drafts (random target states, the first 4 tokens prompt)."""
    from reference.tiny_drafts import HIDDEN, LAYER_IDS, VOCAB

    from dspark_cli.capture.types import CapturedSequence
    from dspark_cli.training.data import prepare

    gen = torch.Generator().manual_seed(0)
    out = []
    for i, length in enumerate(lengths):
        mask = torch.ones(length, dtype=torch.bool)
        mask[:4] = False
        seq = CapturedSequence(
            f"s/{i}",
            torch.randint(0, VOCAB - 1, (length,), generator=gen),
            mask,
            torch.randn(length, HIDDEN * len(LAYER_IDS), generator=gen),
            torch.randn(length, HIDDEN, generator=gen),
        )
        out.append(prepare(seq, epoch=0, index=i, seed=0, num_anchors=num_anchors, max_seq_len=max(lengths)))
    return out


@pytest.mark.slow  # compiles the block states with flex inside: ~1 min on 2 cores
def test_trainer_step_with_flex_runs_counted_then_compiled():
    """The trainer's step as on CUDA (flex attention, `train.compile` with static shapes from length
    buckets), forward only: the first call under the FLOP counter (block states eagerly, flex compiled),
    the next ones through the compiled block states with flex inside (two batches of one bucket shape);
    each loss and stats vector equals SDPA's eager step on the same padded batch (fp32: 1e-5, summation
    order only)."""
    from dspark_cli.training.data import collate
    from dspark_cli.training.shapes import CompileCounter, ShapePlan
    from dspark_cli.training.step import LossConfig, TrainStep, local_weight, trainable_slots

    plan = ShapePlan(lengths=(24, 40), num_anchors=6, block_size=3)
    flex_model, _, _ = tiny_model("gqa", block_size=3, attn_impl="flex")
    sdpa_model, _, _ = tiny_model("gqa", block_size=3)
    flex_step = TrainStep(flex_model, LossConfig(), compile=True, shapes=plan)
    sdpa_step = TrainStep(sdpa_model, LossConfig())
    batches = []
    for example in _examples([40, 36], num_anchors=6):
        batch = collate([example], torch.float32, shape=plan.shape(plan.length(example.num_tokens)))
        ok = trainable_slots(batch, 3)
        batches.append((batch, ok, local_weight(ok, 4.0)))
    assert {b.signature for b, _, _ in batches} == {(1, 40, 6)}
    counter = CompileCounter()
    with torch.no_grad():  # flex has no backward on CPU
        got = []
        flops = count_flops(lambda: got.append(flex_step(*batches[0])))
        assert flops > 0
        got += [flex_step(*b) for b in batches]
        want = [sdpa_step(*b) for b in (batches[0], *batches)]
    for (loss, stats), (loss_ref, stats_ref) in zip(got, want, strict=True):
        torch.testing.assert_close(loss, loss_ref, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(stats, stats_ref, rtol=1e-5, atol=1e-5)
    assert counter.read()["compiles"] >= 1  # the block states, once for the one shape (and flex's own)


def test_flex_backward_is_what_the_cpu_cannot_run():
    """torch's own limit, checked here so the GPU-only list in docs/status.md stays exact: flex attention
    has no backward on the CPU (PyTorch raises NotImplementedError), eager or compiled; dspark's training
    refuses it up front with one line and what to use instead."""
    from torch.nn.attention.flex_attention import flex_attention

    from dspark_cli.errors import UsageError

    q = torch.randn(1, 2, 8, 16, requires_grad=True)
    with pytest.raises(NotImplementedError, match="FlexAttention does not support backward on CPU"):
        flex_attention(q, q, q).sum().backward()
    model, _, _ = tiny_model("gqa", block_size=3, attn_impl="flex")
    aux, ids = tiny_sequence(10)
    with pytest.raises(UsageError, match="no backward on CPU"):
        model(aux, ids, torch.tensor([[0, 4]]))
