"""A published draft named by a hub id, downloaded from the hub (the hubs' side of reading one).

    where = draft_source("runs/other/draft")              # a local directory: as it is
    where = draft_source("Inferact/Kimi-K3-DSpark")       # a hub id: its files under $HF_HOME/dspark-drafts

Only the files a draft is are asked for (`HUB_PATTERNS`: config.json, model.safetensors, and the model card),
so nothing executable or pickled arrives whatever the repository holds; the download runs under dspark's
HTTP bounds (`hubhttp.use_for_hubs`) and honours `HF_ENDPOINT`, `HF_TOKEN` and `HF_HUB_OFFLINE` as
huggingface_hub does. The files land as plain files (not the hub cache's links into its blobs, which the
trust rules refuse) in `$HF_HOME/dspark-drafts/ORG--NAME/REVISION` (`draft_home`), huggingface_hub's
`local_dir` download: a second call asks the hub only whether they changed. What is downloaded is then
checked like any published draft (`dspark_cli.export.published`).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from dspark_cli.errors import UsageError

HUB_PATTERNS = ["config.json", "model.safetensors", "README.md"]
HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")


def draft_source(source: str, *, revision: str | None = None) -> Path:
    """A local draft directory as it is; a hub repo id (`org/name`, not a local path): its files downloaded
    into `draft_home` (only what changed since a previous call). One-line UsageError for a source that is neither."""
    path = Path(source).expanduser()
    if path.exists() or path.is_symlink():
        if not path.is_dir() or path.is_symlink():
            raise UsageError(f"{source} is not a draft directory", "pass the directory holding config.json")
        return path
    if not HUB_ID.match(source) or source.startswith((".", "~")):
        raise UsageError(f"draft directory not found: {source}", "pass a draft directory or a hub id (org/name)")
    from dspark_cli.publish.hubhttp import use_for_hubs

    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

        use_for_hubs()
        where = draft_home(source, revision)
        quiet = not sys.stderr.isatty() and not are_progress_bars_disabled()  # progress bars on a terminal only
        if quiet:
            disable_progress_bars()
        try:
            return Path(snapshot_download(source, revision=revision, allow_patterns=HUB_PATTERNS, local_dir=where))
        finally:
            if quiet:
                enable_progress_bars()
    except Exception as exc:  # noqa: BLE001 - every hub failure is the same line to the user: which draft, why
        text = str(exc).strip()
        reason = text.splitlines()[0][:200] if text else type(exc).__name__
        if type(exc).__name__ in ("RepositoryNotFoundError", "GatedRepoError"):
            reason = "no such repository, or a private or gated one this token may not read"
        elif type(exc).__name__ == "RevisionNotFoundError":
            reason = f"no revision {revision!r} in it"
        raise UsageError(
            f"draft {source}: no such local directory, and the hub did not give it ({reason})",
            f"check the id and HF_ENDPOINT / HF_TOKEN, or download it first: hf download {source}",
        ) from None


def draft_home(repo_id: str, revision: str | None) -> Path:
    """Where the draft `repo_id` at `revision` is downloaded: under $HF_HOME, one folder per repo and revision."""
    import hashlib

    from huggingface_hub import constants

    rev = revision or "main"
    if not re.fullmatch(r"[A-Za-z0-9._-]{1,64}", rev) or rev.startswith("."):  # a branch name with a slash
        rev = hashlib.sha256(rev.encode()).hexdigest()[:16]
    return Path(constants.HF_HOME) / "dspark-drafts" / repo_id.replace("/", "--") / rev
