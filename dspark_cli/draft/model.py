"""The DSpark draft model (MLA or GQA backbone) and its many-anchor training forward.

    import torch
    from dspark_cli.draft.model import DSparkDraftModel
    model = DSparkDraftModel(cfg)                      # cfg: DSparkDraftConfig
    model.set_target_embeddings(embed_weight, lm_head_weight)   # frozen, not in state_dict
    out = model(aux_states, input_ids, anchors)        # [B, T, F], [B, T], [B, A]
    out.logits  # [B, A, N, V], out.confidence [B, A, N], out.valid [B, A, N]

`state_dict()` keys are vLLM's checkpoint names (`K3DSparkModel` for MLA: context_proj,
context_norm, final_norm; `Qwen3DSparkModel` for GQA: fc, hidden_norm, norm; both:
layers.{i}.{input_layernorm,self_attn.*,post_attention_layernorm,mlp.*}, markov_head.*,
confidence_head.proj.*). The target's embed_tokens / lm_head are borrowed as non-persistent
buffers: never trained, never exported, and not in `parameters()`.

Training forward, per row b of a right-padded batch [B, T] (packing = one sequence per row;
pass `seq_lens` for the padding and `anchor_mask` for rows with fewer real anchors):
for each anchor a (0 <= a < seq_len), the block [x_a, mask x (N-1)] sits at positions
a .. a+N-1, sees the context K/V of positions < a plus its own block (non-causally), and
slot i predicts x_{a+i+1} with the teacher-forced Markov bias of prev = x_{a+i}. Context K/V
are computed once per row and shared by all anchors; all blocks of a row go through one
attention call per layer (see attention.py). `valid[b, j, i]` is False where the label
position a+i+1 is past the sequence or the anchor is padding.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from dspark_cli.draft.attention import BlockLayout, check_attn_impl, resolve_attn_impl
from dspark_cli.draft.config import DSparkDraftConfig
from dspark_cli.draft.gqa import GQAAttention
from dspark_cli.draft.heads import ConfidenceHead, MarkovHead
from dspark_cli.draft.layers import GatedMLP, RMSNorm, add_rms_norm, rope_cos_sin
from dspark_cli.draft.mla import MLAAttention
from dspark_cli.draft.names import MODULE_NAMES

KV = tuple[torch.Tensor, torch.Tensor]
RopeTable = tuple[torch.Tensor, torch.Tensor]  # cos, sin [positions, rope_dim / 2]


class DecoderLayer(nn.Module):
    """Pre-norm layer with vLLM's (hidden, residual) carry: the add happens inside the next norm."""

    def __init__(self, cfg: DSparkDraftConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = MLAAttention(cfg) if cfg.arch == "mla" else GQAAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size)

    def forward(self, hidden, residual, cos, sin, ctx: KV, layout: BlockLayout, impl: str, absorbed: bool = False):
        if residual is None:
            residual, x = hidden, self.input_layernorm(hidden)
        else:
            x, residual = add_rms_norm(hidden, residual, self.input_layernorm.weight, self.input_layernorm.eps)
        x = self.self_attn(x, cos, sin, ctx, layout, impl, absorbed)
        x, residual = add_rms_norm(x, residual, self.post_attention_layernorm.weight, self.post_attention_layernorm.eps)
        return self.mlp(x), residual


@dataclass
class DraftOutput:
    """Training-forward result; shapes use B rows, A anchors per row, N slots per block."""

    logits: torch.Tensor | None  # [B, A, N, V] base + teacher-forced Markov bias
    confidence: torch.Tensor | None  # [B, A, N] sigmoid acceptance estimate (fp32)
    hidden: torch.Tensor  # [B, A, N, H] after the final norm
    target_ids: torch.Tensor  # [B, A, N] the token slot i predicts, x_{a+i+1} (clamped)
    prev_ids: torch.Tensor  # [B, A, N] the Markov head's previous token, x_{a+i}
    valid: torch.Tensor  # [B, A, N] bool: label inside the sequence and anchor is real


class DSparkDraftModel(nn.Module):
    def __init__(self, config: DSparkDraftConfig, *, attn_impl: str = "sdpa") -> None:
        super().__init__()
        self.config = config
        self.attn_impl = attn_impl
        check_attn_impl(attn_impl)  # the name, early; the kernel is chosen per call (`resolve_attn_impl`)
        proj_name, norm_name, final_name = MODULE_NAMES[config.arch]
        self._names = MODULE_NAMES[config.arch]
        in_features = config.target_hidden_size * config.num_target_layers
        self.add_module(proj_name, nn.Linear(in_features, config.hidden_size, bias=False))
        self.add_module(norm_name, RMSNorm(config.hidden_size, config.rms_norm_eps))
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.add_module(final_name, RMSNorm(config.hidden_size, config.rms_norm_eps))
        self.markov_head = MarkovHead(config.vocab_size, config.draft_vocab_size, config.markov_rank)
        self.confidence_head = (
            ConfidenceHead(config.hidden_size, config.markov_rank, config.confidence_head_with_markov)
            if config.enable_confidence_head
            else None
        )
        self.register_buffer("target_embed", None, persistent=False)
        self.register_buffer("target_lm_head", None, persistent=False)

    # -- borrowed target modules ------------------------------------------------------------
    def set_target_embeddings(self, embed_weight: torch.Tensor, lm_head_weight: torch.Tensor):
        """Borrow the target's frozen embed_tokens / lm_head weights, both [vocab, hidden]."""
        expected = (self.config.vocab_size, self.config.hidden_size)
        for name, weight in (("embed_tokens", embed_weight), ("lm_head", lm_head_weight)):
            if tuple(weight.shape) != expected:
                raise ValueError(
                    f"target {name} has shape {tuple(weight.shape)}, the draft "
                    f"expects {expected} (vocab_size, hidden_size)"
                )
        self.target_embed = embed_weight.detach()
        self.target_lm_head = lm_head_weight.detach()

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        if self.target_embed is None:
            raise RuntimeError("call set_target_embeddings(embed_weight, lm_head_weight) first")
        return F.embedding(token_ids, self.target_embed)

    # -- pieces shared by training and drafting ---------------------------------------------
    @property
    def rope_dim(self) -> int:
        cfg = self.config
        return cfg.qk_rope_head_dim if cfg.arch == "mla" else cfg.head_dim

    def rope_angles(self, positions: torch.Tensor, table: RopeTable | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [*positions.shape, rope_dim / 2]: computed, or gathered from `rope_table` rows."""
        if table is not None:
            return table[0][positions], table[1][positions]
        return rope_cos_sin(positions, self.rope_dim, self.config.rope_theta, self.config.rope_yarn)

    def rope_table(self, length: int, device: torch.device) -> RopeTable:
        """cos, sin [length, rope_dim / 2] for positions 0 .. length - 1 (the same values
        `rope_angles` computes). Training builds it outside `torch.compile`: given positions, inductor
        fuses the sin / cos into every consumer and recomputes them there, scalar, in forward and
        backward (docs/train.md, Speed)."""
        return rope_cos_sin(
            torch.arange(length, device=device), self.rope_dim, self.config.rope_theta, self.config.rope_yarn
        )

    def combine_context(self, aux_states: torch.Tensor) -> torch.Tensor:
        """Concatenated target states [..., num_target_layers * target_hidden] -> [..., hidden]."""
        proj, norm = getattr(self, self._names[0]), getattr(self, self._names[1])
        return norm(proj(aux_states))

    def context_kv(
        self, aux_states: torch.Tensor, positions: torch.Tensor, rope_table: RopeTable | None = None
    ) -> list[KV]:
        """Per draft layer, the cacheable K/V of context tokens (MLA: latent kv_c, k_pe)."""
        combined = self.combine_context(aux_states)
        cos, sin = self.rope_angles(positions, rope_table)
        return [layer.self_attn.context_kv(combined, cos, sin) for layer in self.layers]

    def backbone(
        self,
        block_embeds: torch.Tensor,
        positions: torch.Tensor,
        ctx: list[KV],
        layout: BlockLayout,
        *,
        absorbed: bool = False,
        attn_impl: str | None = None,
        rope_table: RopeTable | None = None,
    ) -> torch.Tensor:
        """Block embeddings [B, Q, H] at positions [B, Q] -> final-normed hidden [B, Q, H]."""
        impl = resolve_attn_impl(attn_impl or self.attn_impl, block_embeds.device)
        cos, sin = self.rope_angles(positions, rope_table)
        hidden, residual = block_embeds, None
        for layer, layer_ctx in zip(self.layers, ctx, strict=True):
            hidden, residual = layer(hidden, residual, cos, sin, layer_ctx, layout, impl, absorbed)
        final = getattr(self, self._names[2])
        return add_rms_norm(hidden, residual, final.weight, final.eps)[0]

    def base_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.target_lm_head is None:
            raise RuntimeError("call set_target_embeddings(embed_weight, lm_head_weight) first")
        return F.linear(hidden, self.target_lm_head)

    def logits(self, hidden: torch.Tensor, prev_ids: torch.Tensor) -> torch.Tensor:
        """Base logits plus the Markov bias of the previous tokens: [..., V]."""
        return self.base_logits(hidden) + self.markov_head.bias(self.markov_head.embed(prev_ids))

    def confidence(self, hidden: torch.Tensor, prev_ids: torch.Tensor) -> torch.Tensor | None:
        if self.confidence_head is None:
            return None
        return torch.sigmoid(self.confidence_head(hidden, self.markov_head.embed(prev_ids)))

    # -- training ---------------------------------------------------------------------------
    def forward(
        self,
        aux_states: torch.Tensor,
        input_ids: torch.Tensor,
        anchors: torch.Tensor,
        *,
        seq_lens: torch.Tensor | None = None,
        anchor_mask: torch.Tensor | None = None,
        block_size: int | None = None,
        compute_logits: bool = True,
    ) -> DraftOutput:
        """aux_states [B, T, F], input_ids [B, T], anchors [B, A] -> DraftOutput."""
        n = block_size or self.config.block_size
        bsz, seq_len = input_ids.shape
        num_anchors = anchors.shape[1]
        device = input_ids.device
        if seq_lens is None:
            seq_lens = torch.full((bsz,), seq_len, device=device)
        if bool(((anchors < 0) | (anchors >= seq_lens[:, None])).any()):
            raise ValueError("anchors must satisfy 0 <= anchor < seq_len of their row")

        positions = torch.arange(seq_len, device=device).expand(bsz, seq_len)
        ctx = self.context_kv(aux_states, positions)

        block_pos = anchors.unsqueeze(-1) + torch.arange(n, device=device)  # [B, A, N]
        block_ids = torch.full_like(block_pos, self.config.mask_token_id)
        anchor_ids = input_ids.gather(1, anchors)
        block_ids[..., 0] = anchor_ids
        layout = BlockLayout(num_ctx=seq_len, block_size=n, ctx_limit=anchors)
        hidden = self.backbone(self.embed(block_ids.view(bsz, -1)), block_pos.view(bsz, -1), ctx, layout)
        hidden = hidden.view(bsz, num_anchors, n, -1)

        label_pos = block_pos + 1
        valid = label_pos < seq_lens.view(bsz, 1, 1)
        if anchor_mask is not None:
            valid = valid & anchor_mask.unsqueeze(-1)
        target_ids = input_ids.gather(1, label_pos.clamp(max=seq_len - 1).view(bsz, -1))
        target_ids = target_ids.view(bsz, num_anchors, n)
        prev_ids = torch.cat([anchor_ids.unsqueeze(-1), target_ids[..., :-1]], dim=-1)
        return DraftOutput(
            logits=self.logits(hidden, prev_ids) if compute_logits else None,
            confidence=self.confidence(hidden, prev_ids),
            hidden=hidden,
            target_ids=target_ids,
            prev_ids=prev_ids,
            valid=valid,
        )

    @torch.no_grad()
    def init_weights(self, std: float = 0.02, generator: torch.Generator | None = None) -> None:
        """Fresh-draft init: N(0, std) projections and Markov tables, unit norms, zero bias."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                module.weight.normal_(0.0, std, generator=generator)
                if getattr(module, "bias", None) is not None:
                    module.bias.zero_()
            elif isinstance(module, RMSNorm):
                module.weight.fill_(1.0)

    @torch.no_grad()
    def init_from_target(self, final_norm: torch.Tensor | None) -> None:
        """`train.init: target`, after `init_weights`: the final norm takes the target's final norm gain
        `final_norm` [H] (None: left as it is) and the context projection becomes the identity onto the
        deepest captured layer (the last H columns: the layers are concatenated in id order), zero elsewhere,
        so the draft's context starts as the context norm of the target's deepest captured state."""
        proj_name, _, final_name = self._names
        if final_norm is not None:
            getattr(self, final_name).weight.copy_(final_norm.reshape(-1))
        proj = getattr(self, proj_name).weight  # [H, L * H]: hidden_size is the target's (config.py)
        size = self.config.hidden_size
        proj.zero_()
        proj[:, -size:].copy_(torch.eye(size, dtype=proj.dtype, device=proj.device))


def meta_model(config: DSparkDraftConfig, **kwargs) -> DSparkDraftModel:
    """The draft on the meta device (names and shapes, no memory), its modules' initialisers skipped:
    they compute nothing on meta, but the first one imports all of torch._dynamo (torch's meta
    `normal_` is a Python reference wrapped to disable dynamo): ~2 s in every process that only reads a
    draft (`dspark export --check`, `publish`, `bench`). Not thread-safe: torch.nn.init is patched
    while the model is built."""
    saved = {
        name: fn
        for name, fn in vars(nn.init).items()
        if name.endswith("_") and not name.startswith("_") and callable(fn)
    }
    try:
        for name in saved:
            setattr(nn.init, name, _keep)
        with torch.device("meta"):
            return DSparkDraftModel(config, **kwargs)
    finally:
        for name, fn in saved.items():
            setattr(nn.init, name, fn)


def _keep(tensor: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    return tensor
