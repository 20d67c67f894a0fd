"""Export: trained draft -> vLLM draft directory (`writer.py`), static vLLM loader checks (`rules.py`),
the checks every stage runs before it trusts an exported draft (`integrity.py`), and the tensors an
export writes, listed on the meta device (`roster.py`: `tensor_roster`, `export_dry_run` for `--meta --dry-run`).

    from dspark_cli.export import export_draft, verify_draft
    verify_draft("runs/tiny/draft", "tiny-mla", doing="not serving it")   # the manifest, or one-line error

Other stages import only the names below (from this package, never its modules). Reading a draft
back (`load_draft_dir`, `read_draft_manifest`) is `dspark_cli.artifacts.draft`.
Import-light: nothing here imports torch at package import.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dspark_cli.lazy import lazy_exports

_EXPORTS = {
    "export_draft": "dspark_cli.export.writer",
    "verify_draft": "dspark_cli.export.integrity",
    "planned_config_problems": "dspark_cli.export.run",
    "draft_findings": "dspark_cli.export.integrity",
    "serving_findings": "dspark_cli.export.integrity",
    "speculative_tokens": "dspark_cli.export.integrity",
    "is_published": "dspark_cli.export.published",
    "contract_of": "dspark_cli.export.published",
}

if TYPE_CHECKING:  # what editors and type checkers follow; at run time lazy_exports imports on first use
    from dspark_cli.export.integrity import draft_findings, serving_findings, speculative_tokens, verify_draft
    from dspark_cli.export.published import contract_of, is_published
    from dspark_cli.export.run import planned_config_problems
    from dspark_cli.export.writer import export_draft

__all__ = sorted(_EXPORTS)

if not TYPE_CHECKING:  # hidden from type checkers, which would read any name missing above as Any
    __getattr__ = lazy_exports(__name__, _EXPORTS)
