"""A slow, explicit DSpark drafting step, written from vLLM 0.33.0's algorithm.

Independent of dspark_cli.draft: it imports nothing from it and reads weights by their vLLM
checkpoint names from a plain {name: tensor} dict. Everything is a Python loop over positions,
heads and slots with float64 vectors; attention is an explicit softmax. Sources followed:
- context: `combine_hidden_states` (context_proj -> context_norm; Qwen3: fc, then hidden_norm
  inside `precompute_and_store_context_kv`), then per layer K/V of every verified position < p
  (K3: kv_a_proj_with_mqa -> kv_a_layernorm on the latent, GPT-J RoPE on k_pe;
  Qwen3: k_proj -> k_norm -> Neox RoPE, v_proj);
- query block: [anchor, mask, ..., mask] at positions p .. p+N-1 (`_prepare_dflash_inputs_kernel`
  with SAMPLE_FROM_ANCHOR), non-causal, sees all context and the whole block;
- decoder layer: h += attn(rmsnorm(h)); h += mlp(rmsnorm(h)); final norm; target lm_head;
- `DSparkSpeculator._sample_sequential`: prev = anchor; logits_i = base_i + w2 @ w1[prev];
  sample; prev = sample; confidence sigmoid(proj(cat(h_i, w1[prev_i]))).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

NAMES = {
    "mla": ("context_proj", "context_norm", "final_norm"),
    "gqa": ("fc", "hidden_norm", "norm"),
}


@dataclass
class RefStep:
    base_logits: list  # N vectors [V]
    logits: list  # N vectors [V], with the Markov bias of the previous token
    tokens: list  # N ints
    confidence: list  # N floats (empty without a confidence head)
    hidden: list  # N vectors [H], after the final norm


def _rms(x, w, eps):
    return w * x / math.sqrt(float((x * x).mean()) + eps)


def _rotate(vec, pos, theta, interleaved):
    d = vec.shape[0]
    out = vec.clone()
    for i in range(d // 2):
        angle = pos * theta ** (-2.0 * i / d)
        a, b = (2 * i, 2 * i + 1) if interleaved else (i, i + d // 2)
        c, s = math.cos(angle), math.sin(angle)
        out[a] = vec[a] * c - vec[b] * s
        out[b] = vec[b] * c + vec[a] * s
    return out


def _silu(x):
    return x / (1.0 + torch.exp(-x))


class DSparkReference:
    """`cfg` is any object with the draft config attributes (arch, geometry, DSpark fields)."""

    def __init__(self, cfg, weights: dict, embed: torch.Tensor, lm_head: torch.Tensor):
        self.cfg = cfg
        self.w = {k: v.detach().double() for k, v in weights.items()}
        self.embed = embed.detach().double()
        self.lm_head = lm_head.detach().double()

    def _p(self, layer, name):
        return self.w[f"layers.{layer}.{name}"]

    # -- per-position keys and values -----------------------------------------------------
    def _mla_kv(self, layer, x, pos):
        """Per head (k [nope + rope], v [v_dim]) of one token with input x at position pos."""
        c = self.cfg
        lat = self._p(layer, "self_attn.kv_a_proj_with_mqa.weight") @ x
        kv_c = _rms(lat[: c.kv_lora_rank], self._p(layer, "self_attn.kv_a_layernorm.weight"), c.rms_norm_eps)
        k_pe = _rotate(lat[c.kv_lora_rank :], pos, c.rope_theta, interleaved=True)
        kvb = self._p(layer, "self_attn.kv_b_proj.weight")
        per_head = c.qk_nope_head_dim + c.v_head_dim
        keys, values = [], []
        for h in range(c.num_attention_heads):
            rows = kvb[h * per_head : (h + 1) * per_head] @ kv_c
            keys.append(torch.cat([rows[: c.qk_nope_head_dim], k_pe]))
            values.append(rows[c.qk_nope_head_dim :])
        return keys, values

    def _gqa_kv(self, layer, x, pos):
        c = self.cfg
        d = c.head_dim
        k_all = self._p(layer, "self_attn.k_proj.weight") @ x
        v_all = self._p(layer, "self_attn.v_proj.weight") @ x
        keys, values = [], []
        for g in range(c.num_key_value_heads):
            k = _rms(k_all[g * d : (g + 1) * d], self._p(layer, "self_attn.k_norm.weight"), c.rms_norm_eps)
            keys.append(_rotate(k, pos, c.rope_theta, interleaved=False))
            values.append(v_all[g * d : (g + 1) * d])
        return keys, values

    def _queries(self, layer, x, pos):
        c = self.cfg
        queries = []
        if c.arch == "mla":
            q_c = _rms(
                self._p(layer, "self_attn.q_a_proj.weight") @ x,
                self._p(layer, "self_attn.q_a_layernorm.weight"),
                c.rms_norm_eps,
            )
            q_all = self._p(layer, "self_attn.q_b_proj.weight") @ q_c
            width = c.qk_nope_head_dim + c.qk_rope_head_dim
            for h in range(c.num_attention_heads):
                q = q_all[h * width : (h + 1) * width]
                rope = _rotate(q[c.qk_nope_head_dim :], pos, c.rope_theta, interleaved=True)
                queries.append(torch.cat([q[: c.qk_nope_head_dim], rope]))
            return queries
        d = c.head_dim
        q_all = self._p(layer, "self_attn.q_proj.weight") @ x
        for h in range(c.num_attention_heads):
            q = _rms(q_all[h * d : (h + 1) * d], self._p(layer, "self_attn.q_norm.weight"), c.rms_norm_eps)
            queries.append(_rotate(q, pos, c.rope_theta, interleaved=False))
        return queries

    def _kv(self, layer, x, pos):
        return (self._mla_kv if self.cfg.arch == "mla" else self._gqa_kv)(layer, x, pos)

    # -- one drafting step ----------------------------------------------------------------
    def step(
        self, context_aux, anchor: int, num_slots: int, *, forced=None, temperature: float = 0.0, gumbel=None
    ) -> RefStep:
        """context_aux [p, F] (target states of positions 0..p-1), anchor token at position p.

        forced: N token ids to use as the sampled tokens (teacher forcing) instead of sampling.
        gumbel: N noise vectors [V] for temperature sampling (argmax(logits / T + g_i)).
        """
        c = self.cfg
        proj, norm, final = NAMES[c.arch]
        p = len(context_aux)
        context = [
            _rms(self.w[f"{proj}.weight"] @ a.double(), self.w[f"{norm}.weight"], c.rms_norm_eps) for a in context_aux
        ]
        tokens_in = [anchor] + [c.mask_token_id] * (num_slots - 1)
        hidden = [self.embed[t].clone() for t in tokens_in]
        for layer in range(c.num_hidden_layers):
            ctx_kv = [self._kv(layer, context[j], j) for j in range(p)]
            xs = [_rms(h, self._p(layer, "input_layernorm.weight"), c.rms_norm_eps) for h in hidden]
            blk_kv = [self._kv(layer, xs[i], p + i) for i in range(num_slots)]
            all_kv = ctx_kv + blk_kv  # every block query sees all of these
            attn_out = [self._attend(layer, xs[i], p + i, all_kv) for i in range(num_slots)]
            hidden = [h + a for h, a in zip(hidden, attn_out)]
            for i in range(num_slots):
                x = _rms(hidden[i], self._p(layer, "post_attention_layernorm.weight"), c.rms_norm_eps)
                gate = self._p(layer, "mlp.gate_proj.weight") @ x
                up = self._p(layer, "mlp.up_proj.weight") @ x
                hidden[i] = hidden[i] + self._p(layer, "mlp.down_proj.weight") @ (_silu(gate) * up)
        hidden = [_rms(h, self.w[f"{final}.weight"], c.rms_norm_eps) for h in hidden]
        return self._markov(hidden, anchor, forced, temperature, gumbel)

    def _attend(self, layer, x, pos, all_kv):
        c = self.cfg
        queries = self._queries(layer, x, pos)
        heads_per_kv = 1 if c.arch == "mla" else c.num_attention_heads // c.num_key_value_heads
        qk_dim = c.qk_nope_head_dim + c.qk_rope_head_dim if c.arch == "mla" else c.head_dim
        out = []
        for h, q in enumerate(queries):
            g = h if c.arch == "mla" else h // heads_per_kv
            scores = [float(q @ keys[g]) * qk_dim**-0.5 for keys, _ in all_kv]
            top = max(scores)
            weights = [math.exp(s - top) for s in scores]
            total = sum(weights)
            out.append(sum(wt / total * values[g] for wt, (_, values) in zip(weights, all_kv)))
        return self._p(layer, "self_attn.o_proj.weight") @ torch.cat(out)

    def _markov(self, hidden, anchor, forced, temperature, gumbel):
        c = self.cfg
        w1 = self.w["markov_head.markov_w1.weight"]
        w2 = self.w["markov_head.markov_w2.weight"]
        prev = anchor
        step = RefStep([], [], [], [], hidden)
        for i, h in enumerate(hidden):
            base = self.lm_head @ h
            logits = base + w2 @ w1[prev]
            if c.enable_confidence_head:
                feats = torch.cat([h, w1[prev]]) if c.confidence_head_with_markov else h
                z = float(self.w["confidence_head.proj.weight"][0] @ feats)
                z += float(self.w["confidence_head.proj.bias"][0])
                step.confidence.append(1.0 / (1.0 + math.exp(-z)))
            if forced is not None:
                token = int(forced[i])
            elif temperature > 0:
                token = int((logits / temperature + gumbel[i]).argmax())
            else:
                token = int(logits.argmax())
            step.base_logits.append(base)
            step.logits.append(logits)
            step.tokens.append(token)
            prev = token
        return step
