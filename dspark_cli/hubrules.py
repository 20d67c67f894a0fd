"""What dspark knows about the model hubs without talking to them: the repo ids they accept, and the
credentials that must never reach the terminal.

    repo_id_problem("my-org/Qwen3-8B-DSpark")   # None, or why Hugging Face / ModelScope would refuse it
    scrub(message, known_tokens())              # the message without hub tokens or credential-shaped text

Shared by the preflight (`publish.repo_id`, preflight/shared.py), the CLI's error printer (every message is scrubbed)
and `publish`, whose uploads (publish/hubs.py) scrub everything a hub client says. No hub client is
imported here.
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

# --- repo ids ---------------------------------------------------------------------------------------------

_REPO_PART = re.compile(r"^[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,94}[A-Za-z0-9_])?$")


def repo_id_problem(repo_id: str) -> str | None:
    """Why `repo_id` is not a name both hubs accept, or None. Hugging Face's rule (huggingface_hub's
    `validate_repo_id`), with the namespace required: `owner/name`, each part 1-96 characters of
    letters, digits, `_`, `-` and `.`, not starting or ending with `-` or `.`, no `--` or `..`, not
    ending in `.git`."""
    parts = repo_id.split("/")
    if len(parts) != 2:
        return f"{repo_id!r} is not of the form owner/name"
    for part, what in zip(parts, ("owner", "name")):
        if len(part) > 96:
            return f"its {what} is {len(part)} characters long; the hubs allow at most 96"
        if not _REPO_PART.match(part):
            return (
                f"its {what} {part!r} may hold only letters, digits, '_', '-' and '.', and may not start "
                "or end with '-' or '.'"
            )
    if "--" in repo_id or ".." in repo_id:
        return f"{repo_id!r} contains '--' or '..', which the hubs refuse"
    if repo_id.endswith(".git"):
        return f"{repo_id!r} ends in '.git', which the hubs refuse"
    return None


# --- tokens never leave: every message from a hub client passes through `scrub` ----------------------

_SECRET_SHAPES = (
    (re.compile(r"(?i)\b(bearer)\s+[A-Za-z0-9._~+/=-]+"), r"\1 ***"),  # an Authorization header value
    (re.compile(r"\bhf_[A-Za-z0-9]{30,}"), "hf_***"),  # a Hugging Face token (hf_ + 34 characters) anywhere
    (re.compile(r"(?i)([?&](?:token|access_token|api_key|apikey)=)[^&\s'\"]+"), r"\1***"),  # in a URL
    (
        re.compile(r"(?i)((?:token|api_key|apikey|authorization)[\"']?\s*[:=]\s*[\"']?)[A-Za-z0-9._~+/=-]{8,}"),
        r"\1***",
    ),  # "token": "...", api_key=... in an echoed request
)


def scrub(text: str, secrets: tuple[str, ...] = ()) -> str:
    """`text` without the given tokens and without anything shaped like a credential."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    for pattern, replacement in _SECRET_SHAPES:
        text = pattern.sub(replacement, text)
    return text


def known_tokens() -> tuple[str, ...]:
    """The hub tokens this process could be using (environment and Hugging Face's token file), without
    importing a hub client: what `scrub` removes from any error the CLI prints."""
    names = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "MODELSCOPE_API_TOKEN")
    tokens = [os.environ[name] for name in names if os.environ.get(name)]
    hf_home = Path(os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface")
    for token_file in (Path(os.environ.get("HF_TOKEN_PATH") or hf_home / "token"),):
        with contextlib.suppress(OSError, UnicodeDecodeError):
            tokens.append(token_file.read_text(encoding="utf-8").strip())
    return tuple(t for t in tokens if len(t) >= 8)
