"""Uploads to model hubs: each publish is one commit, so a repo never shows half a draft.

    url = upload_huggingface(files, "my-org/Qwen3-8B-DSpark", private=True, endpoint=None,
                             token=token, message="dspark publish")

`files` maps a path in the repo to a local file or to bytes (the generated model card). Endpoints
and tokens follow the hub clients' own conventions (HF_ENDPOINT / HF_TOKEN or `hf auth login`),
overridable from the recipe's `publish` section.
"""

from __future__ import annotations

from pathlib import Path

from dspark_cli.errors import DsparkError, UsageError

HUB_NAMES = {"huggingface": "Hugging Face", "modelscope": "ModelScope"}


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
