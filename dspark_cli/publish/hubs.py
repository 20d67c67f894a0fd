"""Uploads to model hubs, one commit per hub, so a repo never shows half a draft.

    url = upload_huggingface(files, "my-org/Qwen3-8B-DSpark", private=True, endpoint=None,
                             token=token, message="dspark publish")
    url = upload_modelscope(files, "my-org/Qwen3-8B-DSpark", private=True, endpoint=None,
                            token=token, message="dspark publish", license_id="apache-2.0")

`files` maps a path in the repo to a local file or to bytes (the generated model card). Endpoints
and tokens follow the hub clients' own conventions (HF_ENDPOINT / HF_TOKEN or `hf auth login`;
MODELSCOPE_ENDPOINT / MODELSCOPE_API_TOKEN or `modelscope login`), overridable from the recipe's
`publish` section. ModelScope's client commits a folder, so its files are staged as hard links
(copies across filesystems) in a hidden directory beside the draft, removed afterwards; its
uploader batches commits by size, which for a draft (a few small files and one weights file) is
one commit.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import shutil
import tempfile
from pathlib import Path

from dspark_cli.errors import DsparkError, UsageError


def huggingface_token() -> str:
    from huggingface_hub import get_token

    token = get_token()
    if not token:
        raise UsageError("no Hugging Face token found",
                         "run `hf auth login`, or set HF_TOKEN to a token with write access")
    return token


def _is_network_error(exc: BaseException) -> bool:
    names = {cls.__name__ for cls in type(exc).__mro__}
    return isinstance(exc, (ConnectionError, TimeoutError)) or bool(names & {"TransportError", "ConnectError",
                                                                             "TimeoutException", "NetworkError"})


def _reason(exc: Exception) -> str:
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return f"HTTP {status}: {first}" if status and str(status) not in first else first


def upload_huggingface(files: dict[str, Path | bytes], repo_id: str, *, private: bool, endpoint: str | None,
                       token: str, message: str) -> str:
    """Create the model repo if needed and commit every file in one commit; return the commit URL."""
    from huggingface_hub import CommitOperationAdd, HfApi
    from huggingface_hub.errors import HfHubHTTPError

    api = HfApi(endpoint=endpoint, token=token)
    where = endpoint or api.endpoint
    operations = [CommitOperationAdd(path_in_repo=path, path_or_fileobj=src if isinstance(src, bytes) else str(src))
                  for path, src in sorted(files.items())]
    try:
        api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
        info = api.create_commit(repo_id, operations, commit_message=message, repo_type="model")
    except HfHubHTTPError as exc:
        raise DsparkError(f"Hugging Face refused the upload to {repo_id}: {_reason(exc)}",
                          "check that the token may write to that namespace (`hf auth whoami`)") from exc
    except Exception as exc:
        if _is_network_error(exc):
            raise DsparkError(f"cannot reach Hugging Face at {where}: {_reason(exc)}",
                              "check the network, or set publish.hf_endpoint / HF_ENDPOINT") from exc
        raise
    return str(info.commit_url)


def modelscope_token() -> str:
    from modelscope_hub.config import get_default_config

    token = get_default_config().token
    if not token:
        raise UsageError("no ModelScope token found",
                         "run `modelscope login`, or set MODELSCOPE_API_TOKEN to a token with write access")
    return token


def _stage(files: dict[str, Path | bytes], near: Path) -> Path:
    """A folder holding exactly `files` (hard links where possible), hidden beside `near`."""
    stage = Path(tempfile.mkdtemp(prefix=f".{near.name}.publish-", dir=near.parent))
    try:
        _fill(stage, files)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    return stage


def _fill(stage: Path, files: dict[str, Path | bytes]) -> None:
    for path, src in files.items():
        dest = stage / path
        dest.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(src, bytes):
            dest.write_bytes(src)
            continue
        try:
            os.link(src, dest)
        except OSError:
            shutil.copyfile(src, dest)


def upload_modelscope(files: dict[str, Path | bytes], repo_id: str, *, private: bool, endpoint: str | None,
                      token: str, message: str, license_id: str, near: Path) -> str:
    """Create the model repo if needed (with the asked visibility) and commit every file; return its URL."""
    from modelscope.hub.api import HubApi
    from modelscope_hub.errors import HubError, NetworkError

    api = HubApi(endpoint=endpoint, token=token)
    where = api.endpoint
    stage: Path | None = None
    quiet = logging.getLogger("modelscope_hub")
    level = quiet.level
    try:
        stage = _stage(files, near)
        quiet.setLevel(logging.WARNING)
        api.create_repo(repo_id, visibility="private" if private else "public", repo_type="model",
                        license=license_id, exist_ok=True)
        with contextlib.redirect_stdout(io.StringIO()):  # the client prints an upload report banner
            api.upload_folder(repo_id=repo_id, folder_path=str(stage), commit_message=message,
                              use_cache=False, disable_tqdm=True)
    except NetworkError as exc:
        raise DsparkError(f"cannot reach ModelScope at {where}: {_reason(exc)}",
                          "check the network, or set publish.modelscope_endpoint / MODELSCOPE_ENDPOINT") from exc
    except (HubError, ValueError) as exc:
        raise DsparkError(f"ModelScope refused the upload to {repo_id}: {_reason(exc)}",
                          "check that the token may write to that namespace") from exc
    finally:
        quiet.setLevel(level)
        if stage is not None:
            shutil.rmtree(stage, ignore_errors=True)
    return f"{where}/models/{repo_id}"
