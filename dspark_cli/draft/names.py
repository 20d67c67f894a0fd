"""The draft's module names, without torch (`preflight` checks `train.lr_scale` against them).

MODULE_NAMES["gqa"]            # (context projection, context norm, final norm)
top_modules("mla", True)       # the draft's top-level modules, in `DSparkDraftModel`'s order
"""

from __future__ import annotations

# (context projection, context norm, final norm) in each engine's checkpoint naming.
MODULE_NAMES = {
    "mla": ("context_proj", "context_norm", "final_norm"),
    "gqa": ("fc", "hidden_norm", "norm"),
}


def top_modules(arch: str, confidence_head: bool) -> list[str]:
    """The top-level modules of an `arch` draft, as `DSparkDraftModel` registers them."""
    proj, norm, final = MODULE_NAMES[arch]
    return [proj, norm, "layers", final, "markov_head"] + (["confidence_head"] if confidence_head else [])
