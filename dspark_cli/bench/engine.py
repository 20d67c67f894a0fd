"""The reference speculative-decoding engine: a transformers target + a DSpark draft, as vLLM 0.33 serves it.

    from dspark_cli.bench.engine import HFTarget, DSparkDrafter, SpeculativeEngine, Sampling, Speculation
    target = HFTarget.load("dspark_cli/targets/tiny/tiny-mla", layer_ids=[0, 1, 2, 4, 5])
    drafter = DSparkDrafter.from_dir("runs/tiny/draft", target)
    engine = SpeculativeEngine(target, drafter, Speculation(7, "probabilistic", "block"))
    out = engine.generate(prompt_ids, Sampling(temperature=1.0, top_p=1.0, max_tokens=128, stop_ids={1}), seed=0)
    out.token_ids, out.accepted, out.tau

One request at a time, CPU or GPU (`generate_many` runs a list in turn; batched.py's `BatchedEngine`
runs many at once, request for request the same). Per request:
1. prefill: the target reads the prompt (KV cache kept) -> logits of the last position and the aux
   hidden states of every prompt position (outputs of `target_layer_ids`, concatenated); the first
   token is sampled from the target; the drafter's context cache receives the prompt's states.
2. each step, with anchor = the last emitted token at position p (not yet seen by the target):
   the drafter drafts N tokens from context < p; with a confidence threshold only the leading drafts
   whose cumulative confidence stays above it are kept (k <= N); the target runs ONE forward over
   [anchor, d_1 .. d_k] at positions p .. p+k on its KV cache; `verify` accepts a drafts and picks the
   next token; the target cache is cropped to p + a + 1 and the drafter appends the target states of
   the verified positions p .. p+a (anchor + accepted drafts). Emitted: d_1 .. d_a, next (tau = a + 1).
Sampling, top-p and verification follow vLLM (see verify.py); stop tokens end a request after they
are emitted; `max_tokens` truncates the last step's tokens (its statistics are kept, as vLLM counts).

Targets and drafters are small protocols, so the tests can run the same loop on table models.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch

from dspark_cli.bench.verify import confidence_prefix, sample_target, verify
from dspark_cli.errors import ContractError, UsageError

if TYPE_CHECKING:
    from dspark_cli.artifacts.draft import LoadedDraft


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.0
    top_p: float = 1.0
    max_tokens: int = 256
    stop_ids: frozenset[int] = frozenset()
    max_model_len: int | None = None


@dataclass(frozen=True)
class Speculation:
    """How vLLM is asked to speculate (serve.* settings) plus the confidence schedule."""

    num_speculative_tokens: int
    draft_sample_method: str = "probabilistic"  # or "greedy"
    rejection_sample_method: str = "standard"  # or "block"
    confidence_threshold: float = 0.0  # > 0: verify only the confident prefix of each block

    def __post_init__(self) -> None:
        if self.draft_sample_method not in ("greedy", "probabilistic"):
            raise ValueError(f"draft_sample_method must be greedy or probabilistic, got {self.draft_sample_method!r}")
        if self.rejection_sample_method not in ("standard", "block"):
            raise ValueError(f"rejection_sample_method must be standard or block, got {self.rejection_sample_method!r}")
        if self.num_speculative_tokens < 1:
            raise ValueError("num_speculative_tokens must be >= 1")


@dataclass(frozen=True)
class Request:
    """One generation of `generate_many`: a prompt, its sampling, the seed of its own generator."""

    prompt_ids: list[int]
    sampling: Sampling
    seed: int = 0


@dataclass
class Proposal:
    tokens: torch.Tensor  # [N] drafted ids
    logits: torch.Tensor | None  # [N, V] pre-temperature logits (None: greedy drafts, one-hot proposals)
    confidence: torch.Tensor | None  # [N] acceptance estimates, None without a confidence head


class Target(Protocol):
    vocab_size: int

    def reset(self) -> None: ...
    def forward(self, token_ids: list[int], last_only: bool = False) -> tuple[torch.Tensor, torch.Tensor]: ...
    # -> logits [m, V] (just [1, V] with last_only) and the aux states [m, F] of the m new positions
    def crop(self, length: int) -> None: ...


class Drafter(Protocol):
    has_confidence: bool

    def begin(self, aux: torch.Tensor) -> None: ...
    def propose(
        self,
        anchor: int,
        *,
        temperature: float,
        greedy: bool,
        num_tokens: int,
        generator: torch.Generator | None,
        history: list[int],
    ) -> Proposal: ...
    # `history`: every token of the request so far (prompt + output, the anchor last); may return < num_tokens
    def accept(self, aux: torch.Tensor) -> None: ...
    def end(self) -> None: ...


@dataclass
class Generation:
    token_ids: list[int]
    finish_reason: str  # "stop" | "length"
    accepted: list[int] = field(default_factory=list)  # per verification step: drafts accepted
    verified: list[int] = field(default_factory=list)  # per step: drafts sent to the target (k)
    confidences: list[list[float] | None] = field(default_factory=list)  # per step: the head's N confidences
    contexts: list[int] = field(default_factory=list)  # per step: context length (tokens before the anchor + 1)
    seconds: float = 0.0

    @property
    def num_steps(self) -> int:
        return len(self.accepted)

    @property
    def tau(self) -> float:
        """Tokens per verification step, bonus included (nan without steps)."""
        return (sum(self.accepted) + len(self.accepted)) / len(self.accepted) if self.accepted else float("nan")


def _decoder_layers(model: Any) -> list[Any]:
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else getattr(model, "model", None)
    layers = next((getattr(decoder, n) for n in ("layers", "h", "blocks") if hasattr(decoder, n)), None)
    if layers is None:
        raise UsageError(
            f"{type(model).__name__}: cannot find its decoder layers",
            "the reference engine supports models with model.layers (Llama, Qwen, DeepSeek, ...)",
        )
    return list(layers)


class HFTarget:
    """A transformers causal LM run incrementally on its KV cache, returning logits and aux states.

    Aux states are read with forward hooks on the decoder layers named by `layer_ids` (their outputs:
    transformers `hidden_states[k+1]`, and the raw, pre-norm output for the last layer, as vLLM reads it).
    """

    def __init__(self, model: Any, layer_ids: list[int]) -> None:
        self.model = model.eval()
        layers = _decoder_layers(model)
        if not layer_ids or max(layer_ids) >= len(layers) or min(layer_ids) < 0:
            raise ContractError(
                f"draft target_layer_ids {layer_ids} do not fit the target's {len(layers)} layers",
                "bench the draft with the target it was trained for",
            )
        self.layer_ids = list(layer_ids)
        self.device = next(model.parameters()).device
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self._captured: dict[int, torch.Tensor] = {}
        self._hooks = [layers[k].register_forward_hook(self._keeper(k)) for k in self.layer_ids]
        self.cache: Any = None
        self.length = 0

    @classmethod
    def load(
        cls,
        path: str,
        layer_ids: list[int],
        *,
        dtype: str = "auto",
        device: str | None = None,
        trust_remote_code: bool = False,
        revision: str | None = None,
    ) -> HFTarget:
        from dspark_cli.targets import Target

        model, _ = Target.named(path, revision=revision, trust_remote_code=trust_remote_code).causal_lm(
            dtype=dtype, device=device
        )
        return cls(model, layer_ids)

    def release(self) -> None:
        """Take this reader's hooks off the model (which stays loaded), so another `HFTarget` over the same
        model (the next draft of a several-draft bench, with its own layer ids) reads it alone."""
        for hook in self._hooks:
            hook.remove()
        self._hooks, self.cache, self.length = [], None, 0
        self._captured.clear()

    def _keeper(self, key: int):
        def hook(_module: Any, _args: Any, output: Any) -> None:
            self._captured[key] = output[0] if isinstance(output, tuple) else output

        return hook

    def embeddings(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The target's (embed_tokens, lm_head) weights, both [V, H], which the draft borrows."""
        return self.model.get_input_embeddings().weight, self.model.get_output_embeddings().weight

    def reset(self) -> None:
        from transformers import DynamicCache

        self.cache = DynamicCache(config=self.model.config)
        self.length = 0

    @torch.inference_mode()
    def forward(self, token_ids: list[int], last_only: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed the next tokens (positions length .. length+m-1): logits [m, V] fp32 (only the last
        row with `last_only`, as for a prompt) and aux [m, F]."""
        m = len(token_ids)
        ids = torch.tensor([token_ids], device=self.device)
        positions = torch.arange(self.length, self.length + m, device=self.device).unsqueeze(0)
        self._captured.clear()
        out = self.model(
            input_ids=ids,
            position_ids=positions,
            past_key_values=self.cache,
            use_cache=True,
            logits_to_keep=1 if last_only else 0,
        )
        self.cache = out.past_key_values
        self.length += m
        aux = torch.cat([self._captured[k][0] for k in self.layer_ids], dim=-1)
        return out.logits[0].float(), aux

    def crop(self, length: int) -> None:
        """Forget positions >= length (drafts the verifier rejected)."""
        if length < self.length:
            self.cache.crop(length - self.length)  # negative: drop that many (positive values are deprecated)
        self.length = length


class DSparkDrafter:
    """A DSpark draft drafting one block per step from its incremental context cache (drafting.py)."""

    def __init__(self, model: Any, *, draft_topk: int | None = None) -> None:
        from dspark_cli.draft.drafting import ContextCache

        self.model = model.eval()
        self.cache = ContextCache(model)
        self.dtype = next(model.parameters()).dtype
        self.draft_topk = draft_topk
        self.has_confidence = model.confidence_head is not None
        self.block_size = int(model.config.block_size)
        self.slot: int | None = None

    @classmethod
    def from_dir(cls, draft_dir: str, target: HFTarget, *, dtype: torch.dtype | None = None) -> DSparkDrafter:
        """Load an exported (or trained `final/`) draft and attach the target's embed_tokens / lm_head."""
        from dspark_cli.artifacts.draft import load_draft_dir

        return cls.from_loaded(load_draft_dir(draft_dir), target, dtype=dtype)

    @classmethod
    def from_loaded(cls, loaded: LoadedDraft, target: HFTarget, *, dtype: torch.dtype | None = None) -> DSparkDrafter:
        """A draft already read (`load_draft_dir`) on the target's embed_tokens / lm_head."""
        from dspark_cli.artifacts.draft import build_model

        config = loaded.config
        if list(config.target_layer_ids) != target.layer_ids:
            raise ContractError(f"draft target_layer_ids {config.target_layer_ids} != the engine's {target.layer_ids}")
        model = build_model(config, loaded.state_dict)
        model = model.to(device=target.device, dtype=dtype or torch.float32)
        if model.confidence_head is not None:
            model.confidence_head.float()  # fp32 as vLLM builds it (export stores it in fp32 too)
        embed, lm_head = target.embeddings()
        if tuple(embed.shape) != (config.vocab_size, config.hidden_size):
            raise ContractError(
                f"draft expects embeddings {config.vocab_size}x{config.hidden_size}, the target has "
                f"{tuple(embed.shape)[0]}x{tuple(embed.shape)[1]}",
                "bench the draft with the target it was trained for",
            )
        model.set_target_embeddings(embed.to(model_dtype(model)), lm_head.to(model_dtype(model)))
        return cls(model, draft_topk=getattr(config, "dspark_draft_topk", None))

    def begin(self, aux: torch.Tensor) -> None:
        self.slot = self.cache.add_request()
        self.cache.append(self.slot, aux.to(self.dtype))

    @torch.inference_mode()
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
        from dspark_cli.draft.drafting import draft_block

        assert self.slot is not None, "begin() first"
        block = draft_block(
            self.model,
            self.cache,
            [self.slot],
            torch.tensor([anchor]),
            temperature=0.0 if greedy else temperature,
            generator=generator,
            block_size=num_tokens,
            draft_topk=self.draft_topk,
        )
        confidence = block.confidence[0] if block.confidence is not None else None
        return Proposal(block.tokens[0], None if greedy else block.logits[0].float(), confidence)

    def accept(self, aux: torch.Tensor) -> None:
        self.cache.append(self.slot, aux.to(self.dtype))

    def end(self) -> None:
        if self.slot is not None:
            self.cache.release(self.slot)
            self.slot = None


def model_dtype(model: Any) -> torch.dtype:
    return next(model.parameters()).dtype


class SpeculativeEngine:
    """Generation with DSpark speculation (drafter given) or plain target decoding (drafter None)."""

    def __init__(self, target: Target, drafter: Drafter | None = None, speculation: Speculation | None = None) -> None:
        if drafter is not None and speculation is None:
            raise ValueError("a drafter needs a Speculation config")
        if (
            speculation is not None
            and speculation.confidence_threshold > 0
            and drafter is not None
            and not drafter.has_confidence
        ):
            raise UsageError(
                "confidence-scheduled verification needs a draft with a confidence head",
                "set bench.confidence_thresholds: [] for this draft",
            )
        self.target, self.drafter, self.speculation = target, drafter, speculation

    def generate(self, prompt_ids: list[int], sampling: Sampling, *, seed: int = 0) -> Generation:
        device = getattr(self.target, "device", torch.device("cpu"))
        generator = torch.Generator(device=device).manual_seed(seed)
        started = time.perf_counter()
        self.target.reset()
        logits, aux = self.target.forward(list(prompt_ids), last_only=True)
        out = Generation([], "length")
        token = int(sample_target(logits[-1], sampling.temperature, sampling.top_p, generator))
        limit = sampling.max_tokens
        if sampling.max_model_len is not None:
            limit = min(limit, sampling.max_model_len - len(prompt_ids))
        if self.drafter is not None:
            self.drafter.begin(aux)
        try:
            done = self._emit(out, [token], sampling.stop_ids, limit)
            while not done:
                if self.drafter is None:
                    logits, _ = self.target.forward([token])
                    token = int(sample_target(logits[-1], sampling.temperature, sampling.top_p, generator))
                    done = self._emit(out, [token], sampling.stop_ids, limit)
                    continue
                context_len = len(prompt_ids) + len(out.token_ids)
                emitted, verified, accepted, confidence = self._speculative_step(
                    token, sampling, generator, [*prompt_ids, *out.token_ids]
                )
                out.verified.append(verified)
                out.accepted.append(accepted)
                out.confidences.append(confidence)
                out.contexts.append(context_len)
                token = emitted[-1]
                done = self._emit(out, emitted, sampling.stop_ids, limit)
        finally:
            if self.drafter is not None:
                self.drafter.end()
        out.seconds = time.perf_counter() - started
        return out

    def generate_many(self, requests: list[Request]) -> list[Generation]:
        """`generate` of each request in turn (the batched engine, batched.py, runs them together)."""
        return [self.generate(r.prompt_ids, r.sampling, seed=r.seed) for r in requests]

    def _speculative_step(
        self, anchor: int, sampling: Sampling, generator: torch.Generator, history: list[int]
    ) -> tuple[list[int], int, int, list[float] | None]:
        """One draft + verify step, the anchor last in `history` -> (emitted tokens, k, accepted, confidences)."""
        spec, drafter = self.speculation, self.drafter
        assert spec is not None and drafter is not None
        context_len = len(history)
        greedy = spec.draft_sample_method == "greedy" or sampling.temperature <= 0
        proposal = drafter.propose(
            anchor,
            temperature=sampling.temperature,
            greedy=greedy,
            num_tokens=spec.num_speculative_tokens,
            generator=generator,
            history=history,
        )
        k = min(spec.num_speculative_tokens, len(proposal.tokens))  # a prompt-lookup drafter may find fewer
        if spec.confidence_threshold > 0 and proposal.confidence is not None:
            k = min(k, confidence_prefix(proposal.confidence, spec.confidence_threshold))
        if sampling.max_model_len is not None:
            k = max(0, min(k, sampling.max_model_len - context_len))
        drafts = proposal.tokens[:k]
        position = context_len - 1  # where the anchor goes
        logits, aux = self.target.forward([anchor, *drafts.tolist()])
        draft_logits = proposal.logits[:k].unsqueeze(0) if proposal.logits is not None else None
        result = verify(
            logits.unsqueeze(0),
            draft_logits,
            drafts.unsqueeze(0).to(logits.device),
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            method=spec.rejection_sample_method,
            generator=generator,
        )
        accepted = int(result.num_accepted[0])
        self.target.crop(position + accepted + 1)
        drafter.accept(aux[: accepted + 1])
        confidence = proposal.confidence.float().tolist() if proposal.confidence is not None else None
        return [*drafts[:accepted].tolist(), int(result.next_token[0])], k, accepted, confidence

    def _emit(self, out: Generation, tokens: list[int], stop_ids: frozenset[int], limit: int) -> bool:
        """Append emitted tokens; True when the request is done (stop token or length limit)."""
        for token in tokens:
            if len(out.token_ids) >= limit:
                out.finish_reason = "length"
                return True
            out.token_ids.append(token)
            if token in stop_ids:
                out.finish_reason = "stop"
                return True
        if len(out.token_ids) >= limit:
            out.finish_reason = "length"
            return True
        return False
