"""`TrainStep`: the draft and its objective as one module, so FSDP2 sees every parameter use.

    step = TrainStep(draft, LossConfig(ce=0.1, l1=0.9, confidence=1.0, gamma=4.0))
    ok = trainable_slots(batch, block_size)                 # [B, A, N] bool, from the data only
    loss, stats = step(batch, ok, global_weight, scale)     # stats: sums, see metrics.STATS

`block_states` computes the block hidden states exactly as the draft's own forward does (a test
checks it), with each sequence's anchors split over a few rows that share the context K/V, which
halves the dense-mask attention on CPU; the vocabulary part then runs only on trainable slots
through `loss.vocab_loss`. `global_weight` is the sum of slot
weights over all ranks, so every rank's loss is a share of one global mean; `scale` (= world size)
undoes FSDP2's gradient averaging, which makes N ranks compute the gradient 1 rank would.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import _get_current_dispatch_mode

from dspark_cli.draft.attention import BlockLayout, resolve_attn_impl
from dspark_cli.draft.compiling import compile_fn
from dspark_cli.training.data import Batch
from dspark_cli.training.loss import slot_weights, vocab_loss
from dspark_cli.training.metrics import stats_vector
from dspark_cli.training.shapes import ShapePlan


@dataclass(frozen=True)
class LossConfig:
    ce: float = 0.1
    l1: float = 0.9
    confidence: float = 1.0
    gamma: float = 4.0
    weighting: str = "decay"  # or "expected_length" (recipe train.loss.slot_weighting)
    ce_target: str = "label"  # or "target": CE against the target's distribution (train.loss.ce_target)
    ce_argmax: float = 0.0  # share of the CE's target on the target's top-1 token (train.loss.ce_argmax)

    @classmethod
    def of(cls, loss: Any) -> LossConfig:
        """From the recipe's `train.loss` section."""
        return cls(
            ce=loss.ce,
            l1=loss.l1,
            confidence=loss.confidence,
            gamma=loss.slot_decay_gamma,
            weighting=loss.slot_weighting,
            ce_target=loss.ce_target,
            ce_argmax=loss.ce_argmax,
        )


def label_positions(anchors: torch.Tensor, block_size: int) -> torch.Tensor:
    """[B, A, N]: position of the token slot i predicts, a + i + 1."""
    return anchors.unsqueeze(-1) + torch.arange(1, block_size + 1, device=anchors.device)


def trainable_slots(batch: Batch, block_size: int) -> torch.Tensor:
    """[B, A, N] bool: real anchor, label inside the sequence, and the label trainable."""
    bsz, num_anchors = batch.anchors.shape
    width = batch.input_ids.shape[1]
    pos = label_positions(batch.anchors, block_size)
    inside = pos < batch.seq_lens.view(bsz, 1, 1)
    ok = batch.label_ok.gather(1, pos.clamp(max=width - 1).view(bsz, -1)).view(bsz, num_anchors, block_size)
    return ok & inside & batch.anchor_mask.unsqueeze(-1)


def block_states(draft: nn.Module, batch: Batch, groups: int, attn_impl: str | None = None, rope_table=None):
    """(hidden [B, A, N, H], target_ids, prev_ids) exactly as `draft.forward` (attention kernel
    `attn_impl`, default the draft's; RoPE angles gathered from `rope_table` when given, see
    `DSparkDraftModel.rope_table`), with the anchors of each row split into `groups` rows that
    share the row's context K/V.

    Attention cost is queries x keys, and a row's keys are its T context positions plus all A*N
    block slots, of which a block sees only its own N. Splitting A anchors into G rows cuts the
    keys per query from T + A*N to T + A*N/G; the context K/V are computed once and repeated
    (gradients of the repeats add up), so nothing else is recomputed.
    """
    n = draft.config.block_size
    bsz, seq_len = batch.input_ids.shape
    num_anchors = batch.anchors.shape[1]
    device = batch.input_ids.device
    positions = torch.arange(seq_len, device=device).expand(bsz, seq_len)
    ctx = draft.context_kv(batch.aux, positions, rope_table)
    anchors = batch.anchors
    if groups > 1:
        ctx = [tuple(t.repeat_interleave(groups, dim=0) for t in layer) for layer in ctx]
        anchors = anchors.reshape(bsz * groups, num_anchors // groups)
    rows = anchors.shape[0]
    block_pos = anchors.unsqueeze(-1) + torch.arange(n, device=device)
    anchor_ids = batch.input_ids.gather(1, batch.anchors)
    block_ids = torch.full_like(block_pos, draft.config.mask_token_id)
    block_ids[..., 0] = anchor_ids.reshape(rows, -1)
    layout = BlockLayout(num_ctx=seq_len, block_size=n, ctx_limit=anchors)
    hidden = draft.backbone(
        draft.embed(block_ids.view(rows, -1)),
        block_pos.view(rows, -1),
        ctx,
        layout,
        attn_impl=attn_impl,
        rope_table=rope_table,
    )
    label_pos = label_positions(batch.anchors, n).clamp(max=seq_len - 1)
    target_ids = batch.input_ids.gather(1, label_pos.view(bsz, -1)).view(bsz, num_anchors, n)
    prev_ids = torch.cat([anchor_ids.unsqueeze(-1), target_ids[..., :-1]], dim=-1)
    return hidden.view(bsz, num_anchors, n, -1), target_ids, prev_ids


def choose_groups(num_anchors: int, block_size: int, seq_len: int, attn_impl: str) -> int:
    """Anchor rows per sequence for dense-mask attention: the largest of 8, 4, 2 dividing the anchors
    that keeps at least seq_len / 4 block keys per row: fewer, wider rows waste the mask's
    block-to-block scores, more rows repeat the context (timings in docs/train.md, Speed).
    Flex attention skips masked tiles by itself and blockwise attention computes no block-to-block
    scores, so they keep one row."""
    if attn_impl in ("flex", "blockwise"):
        return 1
    for groups in (8, 4, 2):
        if num_anchors % groups == 0 and num_anchors * block_size // groups >= seq_len // 4:
            return groups
    return 1


def expected_length_share(accept: torch.Tensor, flat: torch.Tensor, shape: tuple[int, int, int]) -> torch.Tensor:
    """Per trainable slot, d E[accepted length] / d accept_k of its block, where E = sum_m prod_{j<=m} a_j
    and a_j is slot j's acceptance (untrainable slots: 0, the block ends there). That derivative is
    reach_k * future_k: reach_k = prod_{j<k} a_j, future_k = 1 + a_{k+1} + a_{k+1} a_{k+2} + ...
    `accept` [S] (detached), `flat` [S] the slots' indices into `shape` [B, A, N]."""
    n = shape[-1]
    a = torch.zeros(shape[0] * shape[1] * n, dtype=torch.float32, device=accept.device)
    a[flat] = accept.float()
    a = a.view(-1, n)
    reach = torch.cat([torch.ones_like(a[:, :1]), torch.cumprod(a[:, :-1], dim=1)], dim=1)
    future = torch.ones_like(a)
    for k in range(n - 2, -1, -1):
        future[:, k] = 1.0 + a[:, k + 1] * future[:, k + 1]
    return (reach * future).reshape(-1)[flat]


def per_block_ratio(num: torch.Tensor, den: torch.Tensor, block: torch.Tensor, blocks: int) -> torch.Tensor:
    """Per slot, sum(num) / sum(den) over the slots of its block (`block` [S]: each slot's block index)."""
    totals = torch.zeros(2, blocks, dtype=num.dtype, device=num.device)
    totals[0].index_add_(0, block, num)
    totals[1].index_add_(0, block, den.to(num.dtype))
    return (totals[0] / totals[1].clamp_min(1e-12))[block]


def local_weight(ok: torch.Tensor, gamma: float) -> torch.Tensor:
    return (ok.float() * slot_weights(ok.shape[-1], gamma, ok.device)).sum()


class TrainStep(nn.Module):
    def __init__(
        self,
        draft: nn.Module,
        loss: LossConfig,
        anchor_groups: int | None = None,
        compile: bool = False,
        shapes: ShapePlan | None = None,
    ) -> None:
        """`anchor_groups`: rows each sequence's anchors are split into (None: `choose_groups`).
        `compile`: run `block_states` (context K/V, the block backbone) through `torch.compile`, which
        fuses its element-wise chains (norms, RoPE, SiLU, residual adds) forward and backward.
        `shapes`: the run's fixed batch shapes (training/shapes.py; the loop pads to them): compiled
        with static shapes, one compile per shape, the recompile limit raised to their number. Without
        them shapes that change between steps make the compiled code dynamic after the first change."""
        super().__init__()
        self.draft = draft
        self.loss_config = loss
        self.anchor_groups = anchor_groups
        self.compiled = compile
        self.shape_plan = shapes
        self._rope_tables: dict = {}  # device -> RoPE cos / sin table; never trained, never saved
        self._compiled_states: dict = {}  # device type -> compiled block_states

    def states_fn(self, device: torch.device):
        """`block_states`, compiled when asked. On CPU inductor's C++ wrapper calls the graph's kernels
        from C++ instead of Python: faster steps for the same compile time (benchmarks/train_speed.py)."""
        if not self.compiled:
            return block_states
        fn = self._compiled_states.get(device.type)
        if fn is None:
            options = {"cpp_wrapper": True} if device.type == "cpu" else None
            static = (
                {}
                if self.shape_plan is None
                else {"dynamic": False, "recompile_limit": max(8, self.shape_plan.max_shapes + 1)}
            )
            fn = self._compiled_states[device.type] = compile_fn(block_states, options=options, **static)
        return fn

    def rope_table(self, length: int, device: torch.device):
        """The draft's RoPE table for positions < length at least, kept across steps (a longer table
        gathers the same rows; one length, a power of two, keeps the compiled graph's shapes). With
        fixed shapes it is built for the longest one at once, so it never changes shape."""
        if self.shape_plan is not None:
            length = max(length, self.shape_plan.lengths[-1] + self.draft.config.block_size)
        table = self._rope_tables.get(device)
        if table is None or table[0].shape[0] < length:
            table = self._rope_tables[device] = self.draft.rope_table(1 << (length - 1).bit_length(), device)
        return table

    def forward(
        self,
        batch: Batch,
        ok: torch.Tensor,
        global_weight: torch.Tensor,
        scale: float = 1.0,
        slots: bool = False,
        eager: bool = False,
    ):
        """(loss * scale, stats sums); with `slots`, also (flat slot index, greedy accept, T=1 accept) per
        trainable slot, for evaluation. `eager`: not through the compiled function even when `compile`
        (validation's batches have other shapes than the run's, which would each compile)."""
        draft, cfg = self.draft, self.loss_config
        n = draft.config.block_size
        bsz, num_anchors = batch.anchors.shape
        impl = resolve_attn_impl(draft.attn_impl, ok.device, compiled=self.compiled and not eager)
        groups = self.anchor_groups or choose_groups(num_anchors, n, batch.input_ids.shape[1], impl)
        groups = groups if num_anchors % groups == 0 else 1
        # under a dispatch mode (the loop's FLOP counter) dynamo cannot trace, and a frame it gives up
        # on stays eager for good: run that step eagerly instead
        states = block_states if eager or _get_current_dispatch_mode() is not None else self.states_fn(ok.device)
        # positions reach seq_len - 1 + n - 1 (the last anchor's block); the table is built here,
        # outside the compiled function, so that inductor reads it instead of recomputing sin / cos
        rope = self.rope_table(batch.input_ids.shape[1] + n, ok.device)
        block_hidden, target_ids, prev_ids = states(draft, batch, groups, impl, rope)
        width, hidden_size = batch.input_ids.shape[1], block_hidden.shape[-1]
        flat = ok.reshape(-1).nonzero().squeeze(1)  # [S] trainable slots
        hidden = block_hidden.reshape(-1, hidden_size)[flat]
        prev, labels = prev_ids.reshape(-1)[flat], target_ids.reshape(-1)[flat]
        markov = draft.markov_head.embed(prev)
        # target distribution of slot i: the target's prediction at position a + i
        rows = torch.arange(bsz, device=ok.device).view(bsz, 1, 1) * width
        keys = (rows + label_positions(batch.anchors, n) - 1).reshape(-1)[flat]
        unique_keys, target_index = torch.unique(keys, return_inverse=True)
        target_hidden = batch.last_hidden.reshape(-1, batch.last_hidden.shape[-1])[unique_keys]
        w_slot = slot_weights(n, cfg.gamma, ok.device).expand(bsz, num_anchors, n).reshape(-1)[flat]
        w = w_slot / global_weight
        logit = draft.confidence_head(hidden, markov) if draft.confidence_head is not None else None
        conf = torch.sigmoid(logit.detach()) if logit is not None else None
        w_vocab = w
        if cfg.weighting == "expected_length":
            if logit is None:
                raise ValueError("slot weighting expected_length needs the draft's confidence head")
            # the slots' share of d E[accepted] from the confidence head's estimates, rescaled block by
            # block to that block's total of decay weights: the loss keeps its scale and global_weight its
            # meaning, and the weights do not depend on which rank or micro-batch holds the block
            share = expected_length_share(conf, flat, (bsz, num_anchors, n))
            w_vocab = share * per_block_ratio(w, share, flat // n, bsz * num_anchors)
        loss, per_slot = vocab_loss(
            hidden,
            markov,
            draft.markov_head.markov_w2.weight,
            draft.target_lm_head,
            target_hidden,
            target_index,
            labels,
            cfg.ce * w_vocab,
            cfg.l1 * w_vocab,
            ce_target=cfg.ce_target,
            ce_argmax=cfg.ce_argmax,
        )
        accept_t1 = (1.0 - per_slot[:, 1] / 2).clamp(0.0, 1.0)
        bce = None
        if logit is not None:
            bce = F.binary_cross_entropy_with_logits(logit, accept_t1, reduction="none")
            loss = loss + cfg.confidence * (w * bce).sum()
        stats = stats_vector(ok, flat, w_slot, per_slot, accept_t1, bce, conf)
        if slots:
            return loss * scale, stats, (flat, per_slot[:, 3], accept_t1)
        return loss * scale, stats
