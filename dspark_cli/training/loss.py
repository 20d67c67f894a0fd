"""The DSpark objective, with the vocabulary-sized work fused into one chunked pass.

Per trainable slot k of a block (docs/concepts.md, Training objective; weights from recipe `train.loss`):

    w_k  = exp(-k / gamma)
    CE   = -log softmax(z)[label]                   z = lm_head(h) + markov_w2(markov_w1[prev])
           (train.loss.ce_target=target: -sum_v q_v log softmax(z)_v, CE against the target's distribution;
            train.loss.ce_argmax=a: against (1 - a) onehot(label) or (1 - a) q, plus a onehot(argmax q))
    L1   = sum_v |softmax(z)_v - q_v|               q = softmax(target lm_head(last_hidden[a+k]))
    BCE  = bce(sigmoid(conf), clamp(1 - L1/2, 0, 1))     (the target is detached)
    loss = sum_slots w_k (ce * CE + l1 * L1 + confidence * BCE) / sum_slots w_k

`1 - L1/2 = sum_v min(p_v, q_v)` is exactly the probability that T=1 rejection sampling accepts
the slot's draft, which is why it is the confidence head's target and the T=1 acceptance metric.

Why fused: the [slots, vocab] tensors dominate a DSpark step (the backbone is small). `vocab_loss`
walks the slots in chunks that stay in cache and, in the same pass, computes the logits, both
losses, the metrics and the gradient w.r.t. the logits in closed form
(CE: p - y for its target y; L1: p * (s - sum_v p_v s_v) with s = sign(p - q)), then turns it into the
gradients of the hidden states, the Markov embeddings and markov_w2 with three matmuls. Nothing of
size [slots, vocab] is kept for backward, and the frozen lm_head gets no gradient. The target's
distribution is computed once per distinct (row, position) rather than once per slot (blocks of
neighbouring anchors overlap), unless that table would not fit in `TABLE_BYTES`. In fp32 on CPU the
row-wise part (everything between the logits matmul and the gradient matmuls) is one C kernel,
`dspark_cli/kernels/vocab.py`; elsewhere it is the torch code below, which is also the kernel's fallback.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dspark_cli.kernels.vocab import vocab_kernel

TABLE_BYTES = 256 << 20  # largest target-probability table kept; beyond it q is recomputed per chunk
NUM_SLOT_STATS = 4  # per slot: CE, L1, draft top-1 == label, draft top-1 == target top-1


def chunk_rows(vocab_size: int, device: torch.device) -> int:
    """Slots per chunk: ~4 MiB of fp32 logits on CPU, ~128 MiB on a GPU. On CPU bigger chunks make
    bigger matmuls, which split better over threads, up to about 4 MiB, past which the chunk leaves
    the cache (timings in docs/train.md, Speed)."""
    budget = (1 << 25) if device.type == "cuda" else (1 << 20)
    return max(8, budget // vocab_size)


def slot_weights(block_size: int, gamma: float, device: torch.device | None = None) -> torch.Tensor:
    return torch.exp(-torch.arange(block_size, dtype=torch.float32, device=device) / gamma)


@torch.no_grad()
def target_table(target_hidden: torch.Tensor, lm_head: torch.Tensor, chunk: int) -> torch.Tensor:
    """softmax(target_hidden @ lm_head.T) in fp32, [U, V], computed chunk by chunk."""
    out = torch.empty(target_hidden.shape[0], lm_head.shape[0], dtype=torch.float32, device=lm_head.device)
    for s in range(0, target_hidden.shape[0], chunk):
        logits = F.linear(target_hidden[s : s + chunk].to(lm_head.dtype), lm_head).float()
        torch.softmax(logits, dim=-1, out=out[s : s + chunk])
    return out


def ce_shares(ce_target: str, ce_argmax: float) -> tuple[float, float, float]:
    """The CE target's weights on q, on onehot(argmax q) and on onehot(label) (they sum to 1)."""
    if not 0.0 <= ce_argmax <= 1.0:
        raise ValueError(f"ce_argmax must be in [0, 1], got {ce_argmax}")
    rest = 1.0 - ce_argmax
    return (rest, ce_argmax, 0.0) if ce_target == "target" else (0.0, ce_argmax, rest)


def _rows_torch(
    z,
    q,
    top,
    labels,
    w_ce,
    w_l1,
    out_scale,
    by_l1: bool,
    stats,
    *,
    grads: bool,
    shares: tuple[float, float, float] = (0.0, 0.0, 1.0),
):
    """The row-wise pass as torch operations, what `kernels.vocab.VocabKernel.rows` does in one kernel:
    fills stats [c, 4] (CE, L1, draft top-1 == label, draft top-1 == target top-1) from logits z and
    target probabilities q (overwritten), and with `grads` returns d/dz of w_ce*CE + w_l1*L1 divided
    by out_scale (see `_VocabLoss.forward`). The CE is against y = share_q q + share_top onehot(top)
    + share_label onehot(label) (`shares`, from `ce_shares`; its gradient p - y)."""
    share_q, share_top, share_label = shares
    # (amax, not max: on CPU the reductions that return indices are ~15x slower)
    z_max = z.amax(dim=-1, keepdim=True)
    z_label, z_top = z.gather(1, labels[:, None]), z.gather(1, top[:, None])
    p = torch.softmax(z, dim=-1)
    # log-sum-exp from the softmax itself: max_v p_v = exp(z_max - lse) >= 1 / V never underflows
    lse = z_max - p.amax(dim=-1, keepdim=True).log()
    y_z = share_top * z_top + share_label * z_label  # sum_v y_v z_v
    if share_q:
        y_z = y_z + share_q * (q * z).sum(dim=-1, keepdim=True)
    stats[:, 0] = (lse - y_z).squeeze(1)
    stats[:, 2] = z_label.squeeze(1).ge(z_max.squeeze(1)).float()  # draft top-1 == label
    stats[:, 3] = z_top.squeeze(1).ge(z_max.squeeze(1)).float()  # draft top-1 == target top-1
    q_soft = q.clone() if grads and share_q else None
    diff = torch.sub(p, q, out=q)  # p - q, in the buffer q was gathered into
    stats[:, 1] = diff.abs().sum(dim=-1)  # L1 (6x faster than linalg.vector_norm(ord=1) on CPU)
    if not grads:
        return None
    # d/dz of w_ce*CE + w_l1*L1 = w_l1 * p s + p * (w_ce - w_l1 * sum_v p_v s_v) - w_ce * onehot(label),
    # s = sign(p - q); p s = copysign(p, p - q) (p >= 0; where p == q exactly either sign
    # is a subgradient)
    p_sign = torch.copysign(p, diff, out=diff)
    centre = p_sign.sum(dim=-1, keepdim=True)
    row_scale = (w_ce[:, None] - w_l1[:, None] * centre) / out_scale[:, None]
    if not by_l1:  # some L1 weight is 0: the plain form, g = w_l1 * p s + p * row_scale
        p_sign.mul_(w_l1[:, None])
    g = p_sign.addcmul_(p, row_scale)
    k = w_ce / out_scale
    if q_soft is not None:
        g.sub_(q_soft.mul_((share_q * k)[:, None]))
    rows = torch.arange(g.shape[0], device=g.device)
    if share_top:
        g.index_put_((rows, top), -share_top * k, accumulate=True)
    if share_label:
        g.index_put_((rows, labels), -share_label * k, accumulate=True)
    return g


class _VocabLoss(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx,
        hidden,
        markov_embed,
        markov_w2,
        lm_head,
        target,
        target_index,
        target_is_table,
        labels,
        w_ce,
        w_l1,
        chunk,
        compute_dtype,
        use_kernel,
        shares,
    ):
        grads_wanted = any(ctx.needs_input_grad[:3])
        num_slots = hidden.shape[0]
        device = hidden.device
        lm, w2 = lm_head.to(compute_dtype), markov_w2.to(compute_dtype)
        # z = [h, m] @ [lm_head, markov_w2]^T: one matmul (K = H + r) instead of two, and likewise
        # [grad_h, grad_e] = g @ [lm_head, markov_w2] in backward
        joint = torch.cat([lm, w2], dim=1)  # [V, H + r]
        split = hidden.shape[1]
        loss = torch.zeros((), dtype=torch.float32, device=device)
        stats = torch.empty(num_slots, NUM_SLOT_STATS, dtype=torch.float32, device=device)
        grad_he = torch.empty(num_slots, joint.shape[1], dtype=compute_dtype, device=device) if grads_wanted else None
        # grad of markov_w2, transposed: [r, V] += m^T g reads g row-major, faster than g^T m
        # (docs/train.md, Speed)
        grad_w2_t = torch.zeros(markov_w2.shape[::-1], dtype=torch.float32, device=device) if grads_wanted else None
        # the vocabulary-sized gradient is kept divided by the slot's L1 weight when every L1 weight is
        # > 0 (the DSpark loss): g = w_l1 * (p s + p * scale - w_ce / w_l1 * onehot), and the row factor
        # w_l1 is applied after the matmuls, on [c, H + r] instead of [c, V]
        by_l1 = bool((w_l1 > 0).all())
        out_scale = w_l1 if by_l1 else torch.ones_like(w_l1)
        # fp32 on CPU: the row-wise passes below as one fused kernel (kernels.vocab), same results
        kernel = (
            vocab_kernel()
            if device.type == "cpu" and compute_dtype == torch.float32 and target_is_table and use_kernel
            else None
        )
        # the target's top-1 per table row, once (blocks of neighbouring anchors share rows)
        target_top = None
        if target_is_table:
            target_top = kernel.argmax(target) if kernel is not None else target.argmax(dim=-1)
        for s in range(0, num_slots, chunk):
            e = min(s + chunk, num_slots)
            h, m, lab = hidden[s:e].to(compute_dtype), markov_embed[s:e].to(compute_dtype), labels[s:e]
            rows = target_index[s:e]
            z = F.linear(torch.cat([h, m], dim=1), joint).float()  # [c, V] logits
            weights = (w_ce[s:e], w_l1[s:e], out_scale[s:e])
            if kernel is not None:  # z becomes the gradient in place
                kernel.rows(
                    z, target, rows, lab, target_top, *weights, by_l1, stats[s:e], grads=grads_wanted, shares=shares
                )
                g = z
            else:
                if target_is_table:
                    q, top = target.index_select(0, rows), target_top[rows]
                else:
                    q = torch.softmax(F.linear(target[rows].to(compute_dtype), lm).float(), -1)
                    top = q.argmax(dim=-1)
                g = _rows_torch(z, q, top, lab, *weights, by_l1, stats[s:e], grads=grads_wanted, shares=shares)
            loss += (w_ce[s:e] * stats[s:e, 0]).sum() + (w_l1[s:e] * stats[s:e, 1]).sum()
            if grads_wanted:
                g = g.to(compute_dtype)
                torch.mm(g, joint, out=grad_he[s:e])
                grad_w2_t.addmm_((m.float() * out_scale[s:e, None]).t(), g.float())  # fp32 accumulation
        ctx.mark_non_differentiable(stats)
        if grads_wanted:
            grad_he.mul_(out_scale[:, None].to(compute_dtype))
            grad_h, grad_e = grad_he[:, :split], grad_he[:, split:]
            ctx.save_for_backward(
                grad_h.to(hidden.dtype), grad_e.to(markov_embed.dtype), grad_w2_t.t().to(markov_w2.dtype)
            )
        return loss, stats

    @staticmethod
    def backward(ctx, grad_loss, grad_stats):
        del grad_stats
        grad_h, grad_e, grad_w2 = ctx.saved_tensors
        return (
            grad_h * grad_loss,
            grad_e * grad_loss,
            grad_w2 * grad_loss,
            None,
            None,
            None,
            None,
            None,
            None,
            None,
            None,
            None,
            None,
            None,
        )


def vocab_loss(
    hidden: torch.Tensor,
    markov_embed: torch.Tensor,
    markov_w2: torch.Tensor,
    lm_head: torch.Tensor,
    target_hidden: torch.Tensor,
    target_index: torch.Tensor,
    labels: torch.Tensor,
    w_ce: torch.Tensor,
    w_l1: torch.Tensor,
    *,
    chunk: int | None = None,
    use_kernel: bool = True,
    ce_target: str = "label",
    ce_argmax: float = 0.0,
):
    """Fused CE + L1 over S slots. Returns (sum_s w_ce*CE + w_l1*L1, stats [S, NUM_SLOT_STATS]).

    hidden [S, H] and markov_embed [S, r] (differentiable), markov_w2 [V, r] (a parameter),
    lm_head [V, H] (frozen), target_hidden [U, H] distinct target states and target_index [S]
    (slot -> row of target_hidden), labels [S], per-slot weights w_ce, w_l1 [S] (fp32).
    The CE is against the label (`ce_target="label"`) or the target's distribution (`"target"`), with
    the share `ce_argmax` moved onto the target's top-1 token (`ce_shares`).
    `use_kernel=False` keeps to torch operations where the fused CPU kernel would run (tests).
    """
    shares = ce_shares(ce_target, ce_argmax)
    device = hidden.device.type
    compute = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else hidden.dtype
    chunk = chunk or chunk_rows(lm_head.shape[0], hidden.device)
    as_table = target_hidden.shape[0] * lm_head.shape[0] * 4 <= TABLE_BYTES
    with torch.autocast(device, enabled=False):  # dtypes are managed here: matmuls in `compute`, softmax in fp32
        target = target_table(target_hidden, lm_head.to(compute), chunk) if as_table else target_hidden
        return _VocabLoss.apply(
            hidden,
            markov_embed,
            markov_w2,
            lm_head,
            target,
            target_index,
            as_table,
            labels,
            w_ce.float(),
            w_l1.float(),
            chunk,
            compute,
            use_kernel,
            shares,
        )


def reference_loss_terms(
    logits: torch.Tensor,
    target_logits: torch.Tensor,
    labels: torch.Tensor,
    ce_target: str = "label",
    ce_argmax: float = 0.0,
):
    """Unfused per-slot (CE, L1) with plain autograd: the independent check of `vocab_loss`. The CE's
    target distribution is written out: (1 - ce_argmax) * (q or onehot(label)) + ce_argmax * onehot(argmax q)."""
    dtype = torch.promote_types(logits.dtype, torch.float32)  # fp32, or fp64 for a high-precision check
    logp = logits.to(dtype).log_softmax(-1)
    q = target_logits.to(dtype).softmax(-1)
    vocab = logits.shape[-1]
    base = q if ce_target == "target" else F.one_hot(labels, vocab).to(dtype)
    y = (1 - ce_argmax) * base + ce_argmax * F.one_hot(q.argmax(-1), vocab).to(dtype)
    ce = -(y * logp).sum(-1)
    l1 = (logp.exp() - q).abs().sum(-1)
    return ce, l1
