"""Check, gather and upload one exported draft (see the package docstring for the order of work)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dspark_cli.errors import DataError, DsparkError, UsageError
from dspark_cli.manifest import sha256_file
from dspark_cli.publish.card import model_card
from dspark_cli.publish.hubs import hub_tokens, repo_id_problem, upload_huggingface, upload_modelscope

BENCH_FILES = ("bench.json", "bench.md")


def _check_draft(draft_dir: Path, target: str | None) -> dict[str, Any]:
    """The draft's manifest, once every static loader rule passes and the files match their checksums."""
    from dspark_cli.export.rules import check_draft_dir
    from dspark_cli.export.writer import MANIFEST, ExportError, target_config_of
    from dspark_cli.serving.launch import draft_manifest

    manifest = draft_manifest(draft_dir)
    findings = check_draft_dir(draft_dir, target_config_of(target))
    if any(f.severity == "error" for f in findings):
        refused = ExportError(findings, str(draft_dir))  # export's own one-line summary of the findings
        raise DataError(f"{refused.message}; nothing was uploaded", refused.hint)
    for name, digest in manifest.get("files", {}).items():
        if sha256_file(draft_dir / name) != digest:
            raise DataError(f"{draft_dir / name} changed since export (sha256 differs from {MANIFEST}); "
                            "nothing was uploaded", "export the draft again")
    return manifest


def _bench_report(recipe: Any, draft_dir: Path) -> tuple[dict[str, Any] | None, dict[str, Path]]:
    """The recipe's bench report if it measured this very draft: (bench.json, files to upload under bench/)."""
    bench_dir = Path(recipe.stage_dir("bench"))
    report = bench_dir / "bench.json"
    if not report.is_file():
        return None, {}
    data = json.loads(report.read_text(encoding="utf-8"))
    if Path(str(data.get("draft_dir", ""))).resolve() != draft_dir.resolve():
        return None, {}
    files = {f"bench/{name}": bench_dir / name for name in BENCH_FILES if (bench_dir / name).is_file()}
    files.update({f"bench/{p.name}": p for p in sorted(bench_dir.glob("*.png"))})
    return data, files


def _gather(recipe: Any, draft_dir: Path, manifest: dict[str, Any],
            repo_id: str) -> tuple[dict[str, Path | bytes], str]:
    """(path in repo -> local file or bytes, where the card came from)."""
    files: dict[str, Path | bytes] = {p.name: p for p in sorted(draft_dir.iterdir())
                                      if p.is_file() and not p.name.startswith(".")}
    bench, bench_files = _bench_report(recipe, draft_dir)
    files.update(bench_files)
    if "README.md" in files:
        return files, "README.md in the draft directory"
    card = model_card(draft_dir, manifest, repo_id=repo_id, recipe=recipe, license_id=recipe.publish.license,
                      bench=bench)
    files["README.md"] = card.encode("utf-8")
    return files, "generated"


def _destination(recipe: Any) -> tuple[str, list[str]]:
    """(repo id, hubs) from the recipe, or a one-line UsageError."""
    repo_id = recipe.publish.repo_id
    if not repo_id:
        raise UsageError("publish needs a destination repo", "pass --repo-id OWNER/NAME or set publish.repo_id")
    problem = repo_id_problem(repo_id)
    if problem:
        raise UsageError(f"publish.repo_id: {problem}", "pass --repo-id OWNER/NAME, as the hubs spell repo names")
    hubs = list(dict.fromkeys(recipe.publish.hubs))
    if not hubs:
        raise UsageError("publish.hubs is empty", "set publish.hubs=[huggingface]")
    return repo_id, hubs


def _tokens(hubs: list[str]) -> dict[str, str]:
    return hub_tokens(hubs)  # every hub without a token named at once


def preflight(recipe: Any) -> None:
    """What `dspark run --publish` checks before its first stage: a destination and a token for every hub,
    so a long run does not end in a publish that could never have worked. No network."""
    _tokens(_destination(recipe)[1])


def publish_draft(recipe: Any, draft_dir: str | Path | None = None, *, dry_run: bool = False) -> dict[str, Any]:
    """Upload `draft_dir` (default: the recipe's export directory) to every hub in `publish.hubs`."""
    settings = recipe.publish
    repo_id, hubs = _destination(recipe)
    draft_dir = Path(draft_dir or recipe.stage_dir("export"))
    if not draft_dir.is_dir():
        raise UsageError(f"draft directory not found: {draft_dir}", "pass the directory `dspark export` wrote")
    manifest = _check_draft(draft_dir, recipe.target.model)
    files, card_source = _gather(recipe, draft_dir, manifest, repo_id)
    table = [{"path": path, "bytes": len(src) if isinstance(src, bytes) else src.stat().st_size,
              "source": "generated" if isinstance(src, bytes) else str(src)} for path, src in sorted(files.items())]
    result: dict[str, Any] = {"repo_id": repo_id, "hubs": hubs, "private": settings.private,
                              "draft_dir": str(draft_dir), "architecture": manifest.get("architecture"),
                              "card": card_source, "files": table, "dry_run": dry_run, "urls": {}}
    if dry_run:
        readme = files["README.md"]
        result["card_text"] = readme.decode("utf-8") if isinstance(readme, bytes) else readme.read_text("utf-8")
        return result
    tokens = _tokens(hubs)  # every token before the first upload
    message = f"dspark publish: {manifest.get('architecture')} draft for {manifest.get('contract', {}).get('target')}"
    for hub in hubs:
        try:
            if hub == "huggingface":
                result["urls"][hub] = upload_huggingface(files, repo_id, private=settings.private,
                                                         endpoint=settings.hf_endpoint, token=tokens[hub],
                                                         message=message)
            else:
                result["urls"][hub] = upload_modelscope(files, repo_id, private=settings.private,
                                                        endpoint=settings.modelscope_endpoint, token=tokens[hub],
                                                        message=message, license_id=settings.license, near=draft_dir)
        except DsparkError as exc:
            if not result["urls"]:
                raise
            done = ", ".join(f"{name} ({url})" for name, url in result["urls"].items())
            raise DsparkError(f"{exc.message}; already published to {done}", exc.hint) from exc
    return result
