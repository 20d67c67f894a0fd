"""`dspark publish`: an exported draft, checked, with a generated model card, to Hugging Face and ModelScope.

    from dspark_cli.publish import publish_draft
    result = publish_draft(recipe, "runs/qwen3-8b-dspark/draft", dry_run=True)

Order of work, so that a bad input never reaches a hub: the draft directory must pass every static
vLLM loader check (`dspark export --check`), the repo id must be `owner/name`, and every hub asked
for must have a token, and no file to upload may hold a secret inside a URL (`recipe.secrets`) -- all
before the first byte is sent. Then one commit per hub uploads the
draft's files, a README.md model card (unless the directory already has one) and, when the recipe's
bench stage measured this draft, its report under `bench/`.
The hub rules that other parts need too (the repo-id rule, the token scrubber) live in
`dspark_cli/hubrules.py`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dspark_cli.lazy import lazy_exports

_EXPORTS = {
    "preflight": "dspark_cli.publish.run",
    "publish_draft": "dspark_cli.publish.run",
    "hub_tokens": "dspark_cli.publish.hubs",
    "draft_source": "dspark_cli.publish.download",
    "HUB_ID": "dspark_cli.publish.download",
}

if TYPE_CHECKING:  # what editors and type checkers follow; at run time lazy_exports imports on first use
    from dspark_cli.publish.download import HUB_ID, draft_source
    from dspark_cli.publish.hubs import hub_tokens
    from dspark_cli.publish.run import preflight, publish_draft

__all__ = sorted(_EXPORTS)

if not TYPE_CHECKING:  # hidden from type checkers, which would read any name missing above as Any
    __getattr__ = lazy_exports(__name__, _EXPORTS)
