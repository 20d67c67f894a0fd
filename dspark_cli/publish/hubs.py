"""Uploads to model hubs, one commit per hub, so a repo never shows half a draft.

    url = upload_huggingface(files, "my-org/Qwen3-8B-DSpark", private=True, endpoint=None,
                             token=token, message="dspark publish")
    url = upload_modelscope(files, "my-org/Qwen3-8B-DSpark", private=True, endpoint=None,
                            token=token, message="dspark publish", license_id="apache-2.0")

`files` maps a path in the repo to a local file or to bytes (the generated model card). Endpoints
and tokens follow the hub clients' own conventions (HF_ENDPOINT / HF_TOKEN or `hf auth login`;
MODELSCOPE_ENDPOINT / MODELSCOPE_API_TOKEN or `modelscope login`), overridable from the recipe's
`publish` section. Every message that leaves a hub client -- errors, log records -- passes `scrub`
(`dspark_cli/hubrules.py`) first, so a server that echoes `Authorization: Bearer <token>` back cannot
put the token on the terminal. ModelScope's client commits a folder, so its files are staged as hard links
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
from collections.abc import Iterator
from pathlib import Path

from dspark_cli.errors import DsparkError, UsageError
from dspark_cli.hubrules import scrub
from dspark_cli.publish.hubhttp import stalled_cause


@contextlib.contextmanager
def _scrubbed(hub: str, repo_id: str, token: str) -> Iterator[None]:
    """Run a hub client call: its log records and whatever it raises come out without `token`.

    Log records are scrubbed as they are made (whichever logger or thread makes them); a DsparkError
    is rebuilt with scrubbed text; any other exception becomes one (the original is not chained: its
    text may hold the token, and DSPARK_DEBUG=1 would print it).
    """
    secrets = (token,)
    make_record = logging.getLogRecordFactory()

    def scrubbed_record(*args: object, **kwargs: object) -> logging.LogRecord:
        record = make_record(*args, **kwargs)
        record.msg, record.args = scrub(record.getMessage(), secrets), None
        if record.exc_info:
            record.exc_text = scrub(logging.Formatter().formatException(record.exc_info), secrets)
        return record

    logging.setLogRecordFactory(scrubbed_record)
    try:
        yield
    except DsparkError as exc:
        raise type(exc)(scrub(exc.message, secrets), scrub(exc.hint, secrets) if exc.hint else None) from None
    except Exception as exc:  # noqa: BLE001 - whatever a hub client raises, its text is scrubbed before it shows
        if stalled := stalled_cause(exc):  # a server that stalled: the line dspark's deadline wrote
            raise type(stalled)(scrub(stalled.message, secrets), stalled.hint) from None
        raise DsparkError(
            f"the {hub} client failed uploading {repo_id}: {type(exc).__name__}: {scrub(_reason(exc), secrets)}",
            "rerun later; if it persists, report it",
        ) from None
    finally:
        logging.setLogRecordFactory(make_record)


def hub_tokens(hubs: list[str]) -> dict[str, str]:
    """A token for every hub in `hubs`; if any is missing, one UsageError naming every hub without one."""
    lookup = {"huggingface": ("Hugging Face", huggingface_token), "modelscope": ("ModelScope", modelscope_token)}
    tokens, missing = {}, []
    for hub in hubs:
        try:
            tokens[hub] = lookup[hub][1]()
        except UsageError as exc:
            missing.append((lookup[hub][0], exc))
    if len(missing) == 1:
        raise missing[0][1]
    if missing:
        raise UsageError(
            f"no token found for {' or '.join(name for name, _ in missing)}",
            "; ".join(exc.hint for _, exc in missing if exc.hint),
        )
    return tokens


def huggingface_token() -> str:
    from huggingface_hub import get_token

    token = get_token()
    if not token:
        raise UsageError(
            "no Hugging Face token found", "run `hf auth login`, or set HF_TOKEN to a token with write access"
        )
    return token


def _is_network_error(exc: BaseException) -> bool:
    names = {cls.__name__ for cls in type(exc).__mro__}
    return isinstance(exc, (ConnectionError, TimeoutError)) or bool(
        names & {"TransportError", "ConnectError", "TimeoutException", "NetworkError"}
    )


def _reason(exc: Exception) -> str:
    """One line: the HTTP status, the client's first line and what the server said (if the client kept it)."""
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    said = " ".join(str(getattr(exc, "server_message", None) or "").split())
    line = f"{first}: {said}" if said and said not in first else first
    return f"HTTP {status}: {line}" if status and str(status) not in line else line


def upload_huggingface(
    files: dict[str, Path | bytes], repo_id: str, *, private: bool, endpoint: str | None, token: str, message: str
) -> str:
    """Create the model repo if needed and commit every file in one commit; return the commit URL."""
    from huggingface_hub import CommitOperationAdd, HfApi
    from huggingface_hub.errors import HfHubHTTPError

    with _scrubbed("Hugging Face", repo_id, token):
        api = HfApi(endpoint=endpoint, token=token)
        where = endpoint or api.endpoint
        operations = [
            CommitOperationAdd(path_in_repo=path, path_or_fileobj=src if isinstance(src, bytes) else str(src))
            for path, src in sorted(files.items())
        ]
        try:
            api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
            info = api.create_commit(repo_id, operations, commit_message=message, repo_type="model")
        except HfHubHTTPError as exc:
            raise DsparkError(
                f"Hugging Face refused the upload to {repo_id}: {_reason(exc)}",
                "check that the token may write to that namespace (`hf auth whoami`)",
            ) from exc
        except Exception as exc:
            if stalled := stalled_cause(exc):
                raise stalled from exc
            if _is_network_error(exc):
                raise DsparkError(
                    f"cannot reach Hugging Face at {where}: {_reason(exc)}",
                    "check the network, or set publish.hf_endpoint / HF_ENDPOINT",
                ) from exc
            raise
        return str(info.commit_url)


def modelscope_token() -> str:
    from modelscope_hub.config import get_default_config

    token = get_default_config().token
    if not token:
        raise UsageError(
            "no ModelScope token found",
            "run `modelscope login`, or set MODELSCOPE_API_TOKEN to a token with write access",
        )
    return token


def _stage(files: dict[str, Path | bytes], near: Path) -> Path:
    """A folder holding exactly `files` (hard links where possible), hidden beside `near`; the folders a
    killed publish left there (its pid in the name, and gone) are removed first."""
    from dspark_cli.artifacts.files import clean_stale_temp_dirs, make_temp_dir

    clean_stale_temp_dirs(near, ("publish",))
    stage = make_temp_dir(near, "publish")
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


class _Quiet(logging.Handler):
    """While the block runs, a hub client's log records (each retry with its request and response dump) are
    kept, not printed; the error line quotes the last one's first line. DSPARK_DEBUG=1 prints them."""

    def __init__(self, logger: logging.Logger) -> None:
        super().__init__(logging.WARNING)
        self.logger = logger
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage().strip()
        self.lines.append(text.splitlines()[0] if text else "")

    def __enter__(self) -> None:
        self.saved = (self.logger.handlers[:], self.logger.propagate, self.logger.level)
        if not os.environ.get("DSPARK_DEBUG"):
            self.logger.handlers, self.logger.propagate = [self], False
            self.logger.setLevel(logging.WARNING)

    def __exit__(self, *exc: object) -> None:
        self.logger.handlers, self.logger.propagate, level = self.saved
        self.logger.setLevel(level)

    def last(self) -> str:
        return f" (the client's last warning: {self.lines[-1]})" if self.lines and self.lines[-1] else ""


def upload_modelscope(
    files: dict[str, Path | bytes],
    repo_id: str,
    *,
    private: bool,
    endpoint: str | None,
    token: str,
    message: str,
    license_id: str,
    near: Path,
) -> str:
    """Create the model repo if needed (with the asked visibility) and commit every file; return its URL."""
    from dspark_cli.publish.hubhttp import requests_bounded

    with _scrubbed("ModelScope", repo_id, token), requests_bounded():
        return _upload_modelscope(
            files,
            repo_id,
            private=private,
            endpoint=endpoint,
            token=token,
            message=message,
            license_id=license_id,
            near=near,
        )


def _upload_modelscope(
    files: dict[str, Path | bytes],
    repo_id: str,
    *,
    private: bool,
    endpoint: str | None,
    token: str,
    message: str,
    license_id: str,
    near: Path,
) -> str:
    import requests
    from modelscope.hub.api import HubApi
    from modelscope_hub.errors import HubError, NetworkError

    api = HubApi(endpoint=endpoint, token=token)
    where = api.endpoint
    stage: Path | None = None
    client_log = _Quiet(logging.getLogger("modelscope_hub"))
    try:
        stage = _stage(files, near)
        with client_log:
            api.create_repo(
                repo_id,
                visibility="private" if private else "public",
                repo_type="model",
                license=license_id,
                exist_ok=True,
            )
            with contextlib.redirect_stdout(io.StringIO()):  # the client prints an upload report banner
                api.upload_folder(
                    repo_id=repo_id, folder_path=str(stage), commit_message=message, use_cache=False, disable_tqdm=True
                )
    except (NetworkError, requests.exceptions.RequestException) as exc:
        if stalled := stalled_cause(exc):
            raise stalled from exc
        raise DsparkError(
            f"cannot reach ModelScope at {where}: {_reason(exc)}{client_log.last()}",
            "check the network, or set publish.modelscope_endpoint / MODELSCOPE_ENDPOINT",
        ) from exc
    except (HubError, ValueError) as exc:
        if stalled := stalled_cause(exc):
            raise stalled from exc
        raise DsparkError(
            f"ModelScope refused the upload to {repo_id}: {_reason(exc)}{client_log.last()}",
            "check that the token may write to that namespace",
        ) from exc
    finally:
        if stage is not None:
            shutil.rmtree(stage, ignore_errors=True)
    return f"{where}/models/{repo_id}"
