"""Baselines in the same engine, on the same prompts: prompt-lookup (n-gram) drafting and an untrained draft.

    from dspark_cli.bench.baselines import NgramDrafter, propose_ngram, untrained_drafter
    propose_ngram([1, 2, 3, 9, 1, 2, 3], min_n=2, max_n=3, k=4)    # -> [9, 1, 2, 3]
    engine = SpeculativeEngine(target, NgramDrafter(5, 5), Speculation(7, "greedy", "standard"))

`propose_ngram` is what `vllm serve --speculative-config '{"method": "ngram", "prompt_lookup_min": a,
"prompt_lookup_max": b, "num_speculative_tokens": k}'` proposes (vLLM 0.33
`v1/spec_decode/ngram_proposer.py`, `_find_longest_matched_ngram_and_propose_tokens`): the longest
suffix of the request's tokens (prompt and output, at most `max_n` long) that also occurs earlier
(an occurrence ending before the last token; it may overlap the suffix), its earliest occurrence
among the longest, and up to k tokens that followed it, fewer when the text ends first; nothing
when the longest match is shorter than `min_n`, or the request is at `max_model_len`. vLLM finds
it with a KMP pass over the reversed text; this is a direct search, checked against vLLM's own
function on random token sequences (tests/bench/test_bench_baselines.py). vLLM's defaults are 5 / 5.

A step without a proposal still runs the target once (one token, tau 1 for that step): tau here is
tokens per target forward pass, as for the draft. The drafts are deterministic (no draft
distribution), so at T > 0 a draft token x is accepted with the target's probability of x, as
vLLM's rejection sampler treats n-gram drafts.

`untrained_drafter` is the draft's own architecture, freshly initialised (seeded): what training bought.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from dspark_cli.bench.engine import Proposal

if TYPE_CHECKING:
    from dspark_cli.artifacts.draft import LoadedDraft

VLLM_PROMPT_LOOKUP = (5, 5)  # vLLM's (prompt_lookup_min, prompt_lookup_max) when neither is set


def propose_ngram(tokens: list[int], *, min_n: int, max_n: int, k: int, max_model_len: int | None = None) -> list[int]:
    """The tokens vLLM's n-gram proposer drafts after `tokens` (see the module docstring)."""
    total = len(tokens)
    if total < min_n:
        return []
    if max_model_len is not None:
        k = min(k, max_model_len - total)
    if k <= 0:
        return []
    for n in range(min(max_n, total - 1), min_n - 1, -1):
        suffix = tokens[total - n :]
        for start in range(total - n):  # occurrences ending at or before total - 2
            if tokens[start : start + n] == suffix:
                return tokens[start + n : start + n + k]
    return []


class NgramDrafter:
    """Prompt-lookup drafting over the request's own tokens; no model, no confidences."""

    has_confidence = False

    def __init__(self, min_n: int, max_n: int, max_model_len: int | None = None) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"prompt_lookup_min {min_n} / max {max_n}: need 1 <= min <= max")
        self.min_n, self.max_n, self.max_model_len = min_n, max_n, max_model_len

    def begin(self, aux: torch.Tensor) -> None:
        pass

    def accept(self, aux: torch.Tensor) -> None:
        pass

    def end(self) -> None:
        pass

    def propose(
        self,
        anchor: int,
        *,
        temperature: float,
        greedy: bool,
        num_tokens: int,
        generator: torch.Generator | None,
        history: list[int] | None = None,
    ) -> Proposal:
        assert history is not None and history[-1] == anchor, "the engine passes the request's tokens"
        drafts = propose_ngram(
            history, min_n=self.min_n, max_n=self.max_n, k=num_tokens, max_model_len=self.max_model_len
        )
        return Proposal(torch.tensor(drafts, dtype=torch.long), None, None)


def untrained_drafter(loaded: LoadedDraft, target: Any, *, seed: int, dtype: torch.dtype | None = None) -> Any:
    """The draft's architecture with fresh weights (`init_weights`, seeded), on the target's embeddings.

    `loaded` is the draft the bench already read (`load_draft_dir`): its config, and its tensors' shapes and
    dtypes (their data may already be dropped, on the meta device) for fresh storage that `init_weights`
    fills; the directory is not read again."""
    from dspark_cli.artifacts.draft import build_model
    from dspark_cli.bench.engine import DSparkDrafter, model_dtype

    storage = {name: torch.empty(t.shape, dtype=t.dtype) for name, t in loaded.state_dict.items()}
    model = build_model(loaded.config, storage)
    model.init_weights(generator=torch.Generator().manual_seed(seed))
    model = model.to(device=target.device, dtype=dtype or torch.float32)
    if model.confidence_head is not None:
        model.confidence_head.float()
    embed, lm_head = target.embeddings()
    model.set_target_embeddings(embed.to(model_dtype(model)), lm_head.to(model_dtype(model)))
    return DSparkDrafter(model, draft_topk=getattr(loaded.config, "dspark_draft_topk", None))
