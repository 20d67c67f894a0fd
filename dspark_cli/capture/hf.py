"""The `hf` capture backend: any `AutoModelForCausalLM`, forward hooks, batched, CPU or GPU.

    capturer = HFCapturer("dspark_cli/targets/tiny/tiny-mla", [0, 1, 2, 4, 5])
    sequences = capturer.capture([("rec/0", ids, mask), ...])      # CapturedSequence objects

Hooks sit on the decoder layers named by `target_layer_ids` (their *outputs*: what transformers
returns as `hidden_states[k+1]` for every layer but the last, whose raw output transformers does not
return at all) and on the final norm (its output is the post-norm last state, `hidden_states[-1]`).
Only the decoder runs -- no lm_head, no KV cache. Sequences are right-padded, so padding never
touches a real position under causal attention.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from dspark_cli.capture.types import CapturedSequence
from dspark_cli.errors import ContractError, UsageError

log = logging.getLogger(__name__)
Sample = tuple[str, list[int], list[int]]  # (sequence id, input ids, loss mask)


def decoder_parts(model: Any) -> tuple[Any, list[Any], Any]:
    """(decoder, its layer list, its final norm) of a causal LM, for the usual attribute names."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else getattr(model, "model", None)
    layers = next((getattr(decoder, n) for n in ("layers", "h", "blocks") if hasattr(decoder, n)), None)
    norm = next((getattr(decoder, n) for n in ("norm", "ln_f", "final_layernorm") if hasattr(decoder, n)), None)
    if decoder is None or layers is None or norm is None:
        raise UsageError(
            f"{type(model).__name__}: cannot find its decoder layers and final norm",
            "capture.backend=hf supports models with model.layers and model.norm (Llama, Qwen, DeepSeek, ...)",
        )
    return decoder, list(layers), norm


class HFCapturer:
    """Loads the target once; `capture(samples)` runs one padded batch and returns per-sequence states."""

    name = "hf"

    def __init__(
        self,
        model_path: str,
        layer_ids: list[int],
        *,
        dtype: str = "auto",
        trust_remote_code: bool = False,
        revision: str | None = None,
        device: str | None = None,
    ) -> None:
        from dspark_cli.targets import Target

        model, self.device = Target.named(model_path, revision=revision, trust_remote_code=trust_remote_code).causal_lm(
            dtype=dtype, device=device
        )
        self.model = model.eval()
        self.decoder, self.layers, self.norm = decoder_parts(self.model)
        if layer_ids[-1] >= len(self.layers):
            raise ContractError(
                f"draft.target_layer_ids: layer {layer_ids[-1]} is beyond the target's {len(self.layers)} layers",
                "use ids below the target's depth",
            )
        self.layer_ids = list(layer_ids)
        self.hidden_size = int(self.model.config.get_text_config().hidden_size)
        self.pad_id = 0

    def describe(self) -> dict[str, Any]:
        import transformers

        return {
            "backend": "hf",
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "device": self.device,
            "dtype": str(self.model.dtype).removeprefix("torch."),
            "model_class": type(self.model).__name__,
        }

    @torch.inference_mode()
    def capture(self, samples: list[Sample]) -> list[CapturedSequence]:
        """One forward over `samples` (right-padded); hidden states come back in bf16 on the CPU."""
        width = max(len(ids) for _, ids, _ in samples)
        input_ids = torch.full((len(samples), width), self.pad_id, dtype=torch.long)
        attention = torch.zeros((len(samples), width), dtype=torch.long)
        for row, (_, ids, _) in enumerate(samples):
            input_ids[row, : len(ids)] = torch.tensor(ids)
            attention[row, : len(ids)] = 1
        layer_out: dict[int, torch.Tensor] = {}
        norm_out: list[torch.Tensor] = []

        def keep(store: Any, key: int | None):
            def hook(_module: Any, _args: Any, output: Any) -> None:
                tensor = output[0] if isinstance(output, tuple) else output
                if key is None:
                    store.append(tensor)
                else:
                    store[key] = tensor

            return hook

        handles = [self.layers[k].register_forward_hook(keep(layer_out, k)) for k in self.layer_ids]
        handles.append(self.norm.register_forward_hook(keep(norm_out, None)))
        try:
            self.decoder(input_ids=input_ids.to(self.device), attention_mask=attention.to(self.device), use_cache=False)
        finally:
            for handle in handles:
                handle.remove()
        assert len(norm_out) == 1 and set(layer_out) == set(self.layer_ids), "hooks did not fire exactly once"
        aux = torch.cat([layer_out[k] for k in self.layer_ids], dim=-1).to(torch.bfloat16).cpu()  # [B, W, n*H]
        last = norm_out[0].to(torch.bfloat16).cpu()  # [B, W, H]
        out = []
        for row, (seq_id, ids, mask) in enumerate(samples):
            length = len(ids)
            mask_t = torch.tensor(mask, dtype=torch.bool)
            last_rows = last[row, :length].clone()
            last_rows[~mask_t] = 0  # only loss-masked rows are stored
            out.append(
                CapturedSequence(
                    seq_id, torch.tensor(ids, dtype=torch.long), mask_t, aux[row, :length].clone(), last_rows
                )
            )
        return out
