"""Check, gather and upload one exported draft (see the package docstring for the order of work)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dspark_cli.artifacts.results import PublishedFile, PublishSummary
from dspark_cli.errors import DataError, DsparkError, UsageError
from dspark_cli.hubrules import repo_id_problem
from dspark_cli.publish.card import model_card
from dspark_cli.publish.hubs import hub_tokens, upload_huggingface, upload_modelscope

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from dspark_cli.artifacts.bench import BenchSummary
    from dspark_cli.recipe.schema import Recipe

CARD_FILES = ("README.md",)  # a model card the user wrote into the draft dir is published as is


def _check_draft(draft_dir: Path, target: str | None) -> tuple[dict[str, Any], list[str]]:
    """(the draft's manifest, the names to upload) once the draft passes every check `bench` and `serve`
    make (checksums, vLLM loader rules, its target, its serving settings) and holds nothing else.

    The upload is an allow-list: the files export wrote (checksummed in the manifest), the manifest,
    the acceptance profile export copied in (when it measured these weights: its fingerprint is checked
    against the manifest's model.safetensors checksum), and a README.md the user wrote. Anything else in the
    directory -- a key, a token, a symlink -- is refused by name rather than skipped, so the user sees what
    sits beside the draft."""
    from dspark_cli.artifacts.draft import DRAFT_MANIFEST as MANIFEST
    from dspark_cli.artifacts.profile import PROFILE, matching, tensors_sha256
    from dspark_cli.export import verify_draft

    manifest = verify_draft(draft_dir, target, doing="nothing was uploaded")
    allowed = [*manifest["files"], MANIFEST, *CARD_FILES, PROFILE]
    profile = draft_dir / PROFILE
    if profile.is_file() and not profile.is_symlink():
        if matching(profile, tensors_sha256(draft_dir / "model.safetensors")) is None:
            raise DataError(
                f"{profile} does not describe these weights (its fingerprint is another model.safetensors'); "
                "nothing was uploaded",
                "export the draft again after `dspark bench` (it copies the matching profile), or remove the file",
            )
    others = sorted(
        f"{p.name} (symlink)" if p.is_symlink() else f"{p.name}/" if p.is_dir() else p.name
        for p in draft_dir.iterdir()
        if p.name not in allowed or p.is_symlink() or not p.is_file()
    )
    if others:
        shown = ", ".join(others[:8]) + (f" (+{len(others) - 8} more)" if len(others) > 8 else "")
        raise DataError(
            f"{draft_dir} holds files export did not write: {shown}; nothing was uploaded",
            f"move them out of the draft directory (publish uploads only the files {MANIFEST} lists)",
        )
    return manifest, [name for name in allowed if (draft_dir / name).is_file()]


def _bench_report(recipe: Recipe, draft_dir: Path) -> tuple[BenchSummary | None, dict[str, Path]]:
    """The recipe's bench report if it measured this very draft: (bench.json, files to upload under bench/).

    An allow-list like the draft's: bench.json and the files it lists with their sha256 (what `dspark bench`
    wrote: bench.md, the plots), each a regular file that still matches; anything else in the folder stays
    out, and a symlink or a changed file is refused by name."""
    from dspark_cli.artifacts.bench import REPORT, read_bench_report
    from dspark_cli.artifacts.files import sha256_file

    bench_dir = Path(recipe.stage_dir("bench"))
    report = bench_dir / REPORT
    if report.is_symlink():
        raise DataError(f"{report}: is a symlink; nothing was uploaded", "run `dspark bench` again")
    if not report.is_file():
        return None, {}
    data = read_bench_report(report)
    if not data.measured_draft(draft_dir) or data.complete is False:
        return None, {}  # another draft's report, or a bench that did not finish
    if data.draft_sha256 is None:  # an older dspark's report: it names paths of this machine
        log.warning(
            "%s was written by an older dspark bench and names local paths; it is not uploaded "
            "(run `dspark bench %s` again to publish its report)",
            report,
            draft_dir,
        )
        return None, {}
    listed = (data.files or {}).get("checksums") or {}
    files = {f"bench/{REPORT}": report}
    for name, digest in sorted(listed.items() if isinstance(listed, dict) else []):
        path = bench_dir / str(name)
        problem = (
            "is not a file name dspark bench writes"
            if Path(str(name)).name != name or name.startswith(".")
            else "is a symlink"
            if path.is_symlink()
            else "is missing"
            if not path.is_file()
            else "changed since dspark bench wrote it"
            if sha256_file(path) != digest
            else None
        )
        if problem:
            raise DataError(
                f"{bench_dir}: {name!r} (listed in {REPORT}) {problem}; nothing was uploaded",
                "run `dspark bench` again, or move the bench report away",
            )
        files[f"bench/{name}"] = path
    return data, files


def _gather(
    recipe: Recipe, draft_dir: Path, manifest: dict[str, Any], names: list[str], repo_id: str
) -> tuple[dict[str, Path | bytes], str]:
    """(path in repo -> local file or bytes, where the card came from); `names`: the draft's files to upload."""
    from dspark_cli.artifacts.profile import PROFILE, find_profile

    files: dict[str, Path | bytes] = {name: draft_dir / name for name in sorted(names)}
    bench, bench_files = _bench_report(recipe, draft_dir)
    files.update(bench_files)
    found = find_profile(draft_dir, Path(recipe.stage_dir("bench")))  # the draft's own, else the bench's
    profile = found[0] if found else None
    if found and PROFILE not in files:
        files[PROFILE] = found[1]
    if "README.md" in files:
        return files, "README.md in the draft directory"
    card = model_card(
        draft_dir,
        manifest,
        repo_id=repo_id,
        recipe=recipe,
        license_id=recipe.publish.license,
        bench=bench,
        profile=profile,
    )
    files["README.md"] = card.encode("utf-8")
    return files, "generated"


def _refuse_url_secrets(files: dict[str, Path | bytes]) -> None:
    """One line naming the file and the key when a file to upload still holds a secret inside a URL (a
    password, an `api_key=`: recipe/secrets.py). Export records recipes redacted; a draft exported by an
    older dspark, a bench report or a card written by hand may still hold one."""
    from dspark_cli.recipe.secrets import BINARY_SUFFIXES, find_in_file

    found = [
        (path, secret)
        for path, src in sorted(files.items())
        if not path.endswith(BINARY_SUFFIXES)
        for secret in find_in_file(path, src if isinstance(src, bytes) else src.read_bytes())
    ]
    if found:
        path, secret = found[0]
        more = f" (+{len(found) - 1} more)" if len(found) > 1 else ""
        raise DataError(
            f"{path}: {secret.key} holds {secret.what} in '{secret.shown}'{more}; nothing was uploaded",
            f"export the draft again (dspark records such URLs redacted), or remove the secret from {path}",
        )


def _destination(recipe: Recipe) -> tuple[str, list[str]]:
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


def preflight(recipe: Recipe) -> None:
    """What `dspark run --publish` checks before its first stage: a destination and a token for every hub,
    so a long run does not end in a publish that could never have worked. No network."""
    _tokens(_destination(recipe)[1])


def publish_draft(recipe: Recipe, draft_dir: str | Path | None = None, *, dry_run: bool = False) -> PublishSummary:
    """Upload `draft_dir` (default: the recipe's export directory) to every hub in `publish.hubs`."""
    settings = recipe.publish
    repo_id, hubs = _destination(recipe)
    draft_dir = Path(draft_dir or recipe.stage_dir("export"))
    if not draft_dir.is_dir():
        raise UsageError(f"draft directory not found: {draft_dir}", "pass the directory `dspark export` wrote")
    manifest, names = _check_draft(draft_dir, recipe.target.model)
    files, card_source = _gather(recipe, draft_dir, manifest, names, repo_id)
    _refuse_url_secrets(files)  # a dry run says it too
    table = [
        PublishedFile(
            path=path,
            bytes=len(src) if isinstance(src, bytes) else src.stat().st_size,
            source="generated" if isinstance(src, bytes) else str(src),
        )
        for path, src in sorted(files.items())
    ]
    result = PublishSummary(
        repo_id=repo_id,
        hubs=hubs,
        private=settings.private,
        draft_dir=str(draft_dir),
        architecture=manifest.get("architecture"),
        card=card_source,
        files=table,
        dry_run=dry_run,
    )
    if dry_run:
        readme = files["README.md"]
        result.card_text = readme.decode("utf-8") if isinstance(readme, bytes) else readme.read_text("utf-8")
        return result
    tokens = _tokens(hubs)  # every token before the first upload
    from dspark_cli.publish.hubhttp import use_for_hubs

    use_for_hubs()  # timeouts and deadlines, bounded replies, no redirect to another host
    message = f"dspark publish: {manifest.get('architecture')} draft for {manifest.get('contract', {}).get('target')}"
    for hub in hubs:
        try:
            if hub == "huggingface":
                result.urls[hub] = upload_huggingface(
                    files,
                    repo_id,
                    private=settings.private,
                    endpoint=settings.hf_endpoint,
                    token=tokens[hub],
                    message=message,
                )
            else:
                result.urls[hub] = upload_modelscope(
                    files,
                    repo_id,
                    private=settings.private,
                    endpoint=settings.modelscope_endpoint,
                    token=tokens[hub],
                    message=message,
                    license_id=settings.license,
                    near=draft_dir,
                )
        except DsparkError as exc:
            if not result.urls:
                raise
            done = ", ".join(f"{name} ({url})" for name, url in result.urls.items())
            raise DsparkError(f"{exc.message}; already published to {done}", exc.hint) from exc
    return result
