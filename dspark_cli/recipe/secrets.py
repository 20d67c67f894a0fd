"""Secrets inside URLs: what one looks like, and the form dspark records instead.

    redact_url("https://user:s3cret@host/v1?api_key=abc&n=1")   # 'https://user:***@host/v1?api_key=***&n=1'
    tree, found = redact_tree(recipe.model_dump(mode="json"))   # found: [UrlSecret("datagen.endpoint", ...)]
    recorded_tree(recipe.model_dump(mode="json"))               # the same tree, each new finding logged once
    holds_redacted("https://user:***@host/v1")                  # True: a recorded value, never a credential

A secret inside a URL is the password of its userinfo (`scheme://user:PASSWORD@host`) or the value of a
query (or fragment) parameter whose name means a credential (`key`, `api_key`, `token`, `sig`,
`X-Amz-Signature`, anything ending in `_key`, `_token`, `_secret`, ...; case and `-`/`_` ignored). Every
string of a tree is searched, wherever it sits, so a field added to the recipe later is covered too.

Every recorded recipe -- `recipe.yaml` beside each stage's output, the recipe a manifest embeds, the
metrics sinks' run config -- holds the redacted form, with the secret replaced by `***`. The run that
records it keeps the real value in memory (and in the hand-off files its own processes load), so it works
as asked; a later run reads the secret from the user's recipe or overrides again: a recorded `***` is
never a credential, and a stage refuses a recipe that would send one (preflight/redacted.py).
`publish` refuses to upload a file that still holds a secret (`find_in_file`), whoever wrote it (an older
dspark's export, a card or report edited by hand).
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import yaml

log = logging.getLogger(__name__)

REDACTED = "***"
# query parameter names that carry a credential, compared lower-case with `-` read as `_`
CREDENTIAL_NAMES = frozenset(
    {
        "key",
        "apikey",
        "api_key",
        "token",
        "access_token",
        "auth",
        "auth_token",
        "authorization",
        "secret",
        "client_secret",
        "password",
        "passwd",
        "pwd",
        "pass",
        "sig",
        "signature",
        "credential",
        "credentials",
        "x_amz_signature",
        "x_amz_credential",
        "x_amz_security_token",
        "x_goog_signature",
        "x_goog_credential",
        "sas",
        "sastoken",
    }
)
CREDENTIAL_SUFFIXES = ("_key", "_token", "_secret", "_password", "_signature", "_credential", "apikey")
# a URL inside any text: a scheme, `://`, then everything up to whitespace, a quote, `<`, `>` or a backslash
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://[^\s\"'<>`\\]+")
_PARAM = re.compile(r"([?&#;])([^=&#;?]+)=([^&#;]*)")


@dataclass(frozen=True)
class UrlSecret:
    """One secret found: where (`datagen.endpoint`), what (`a password`), and the value as recorded."""

    key: str
    what: str
    shown: str


def is_credential(name: str) -> bool:
    """Does a query parameter named `name` carry a credential (`api_key`, `X-Amz-Signature`, `hf_token`)?"""
    word = unquote(name).strip().lower().replace("-", "_")
    return word in CREDENTIAL_NAMES or word.endswith(CREDENTIAL_SUFFIXES)


def _redact_url(url: str) -> tuple[str, list[str]]:
    """(`url` with every secret replaced by `***`, what was replaced); `***` already there is not a secret."""
    found: list[str] = []
    scheme, _, rest = url.partition("://")
    cut = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    authority, tail = rest[:cut], rest[cut:]
    userinfo, at, host = authority.rpartition("@")
    if at:
        user, colon, password = userinfo.partition(":")
        if colon and password and password != REDACTED:
            authority = f"{user}:{REDACTED}@{host}"
            found.append("a password")
    start = min((i for i in (tail.find(c) for c in "?#") if i >= 0), default=len(tail))

    def param(match: re.Match[str]) -> str:
        sep, name, value = match.groups()
        if not is_credential(name) or not value or value == REDACTED:
            return match.group(0)
        found.append(f"a credential ({unquote(name)}=)")
        return f"{sep}{name}={REDACTED}"

    tail = tail[:start] + _PARAM.sub(param, tail[start:])
    return f"{scheme}://{authority}{tail}", found


def redact_text(text: str) -> tuple[str, list[str]]:
    """(`text` with the secrets of every URL in it redacted, what was redacted: `a password`, `a credential (sig=)`)."""
    found: list[str] = []

    def one(match: re.Match[str]) -> str:
        redacted, what = _redact_url(match.group(0))
        found.extend(what)
        return redacted

    return (_URL.sub(one, text) if "://" in text else text), found


def redact_url(text: str) -> str:
    """`text` with every secret inside a URL replaced by `***` (`https://user:***@host/v1?api_key=***`)."""
    return redact_text(text)[0]


def holds_redacted(text: str) -> bool:
    """Does `text` hold a URL whose password or credential parameter is dspark's `***` (a recorded recipe's)?"""
    for match in _URL.finditer(text) if "://" in text else ():
        url = match.group(0)
        rest = url.partition("://")[2]
        cut = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
        userinfo, at, _ = rest[:cut].rpartition("@")
        if at and userinfo.partition(":")[2] == REDACTED:
            return True
        if any(is_credential(name) and value == REDACTED for _, name, value in _PARAM.findall(rest[cut:])):
            return True
    return False


def _dotted(prefix: str, key: Any) -> str:
    return f"{prefix}[{key}]" if isinstance(key, int) else f"{prefix}.{key}" if prefix else str(key)


def redact_tree(tree: Any, prefix: str = "") -> tuple[Any, list[UrlSecret]]:
    """A copy of `tree` (mappings, lists, strings, ...) with every string's URL secrets redacted, and one
    `UrlSecret` per string that held any (keys dotted as in overrides: `datagen.sources[0].path`)."""
    if isinstance(tree, str):
        redacted, what = redact_text(tree)
        return redacted, ([UrlSecret(prefix or "value", " and ".join(dict.fromkeys(what)), redacted)] if what else [])
    found: list[UrlSecret] = []
    if isinstance(tree, dict):
        out: dict[Any, Any] = {}
        for key, value in tree.items():
            out[key], more = redact_tree(value, _dotted(prefix, key))
            found += more
        return out, found
    if isinstance(tree, (list, tuple)):
        items = []
        for index, value in enumerate(tree):
            item, more = redact_tree(value, _dotted(prefix, index))
            items.append(item)
            found += more
        return items, found
    return tree, found


_warned: set[str] = set()  # the redacted values warned about in this process


def recorded_tree(tree: Any) -> Any:
    """`redact_tree(tree)[0]`, with a warning for each secret this process has not warned about yet: a run
    records its recipe many times (every stage, every checkpoint, the manifests), and says so once."""
    redacted, found = redact_tree(tree)
    for secret in found:
        if secret.shown not in _warned:  # a manifest repeating the recipe's URL says nothing new
            _warned.add(secret.shown)
            log.warning(
                "%s holds %s; recorded as %s (recipe.yaml, manifests and a published draft never keep it); this run "
                "keeps the real value, a later one takes it from your recipe or overrides again",
                secret.key,
                secret.what,
                secret.shown,
            )
    return redacted


def find_in_file(name: str, data: bytes) -> list[UrlSecret]:
    """The URL secrets a file about to be uploaded still holds: keys named for JSON and YAML files
    (`datagen.endpoint`), `a URL` for any other text; nothing for a binary file."""
    if name.endswith(BINARY_SUFFIXES) or b"\0" in data[:8192]:
        return []
    text = data.decode("utf-8", errors="replace")
    if "://" not in text:
        return []
    tree = _parsed(name, text)
    if isinstance(tree, (dict, list)):
        return redact_tree(tree)[1]
    return [
        UrlSecret("a URL", " and ".join(dict.fromkeys(what)), redacted)
        for redacted, what in (_redact_url(m.group(0)) for m in _URL.finditer(text))
        if what
    ]


BINARY_SUFFIXES = (".safetensors", ".bin", ".pt", ".png", ".jpg", ".jpeg", ".gif", ".pdf")


def _parsed(name: str, text: str) -> Any:
    """The JSON or YAML document in `text` (by the file's suffix), else None: then the text is searched."""
    try:
        if name.endswith(".json"):
            return json.loads(text)
        if name.endswith((".yaml", ".yml")):
            return yaml.safe_load(text)
    except (ValueError, yaml.YAMLError):
        return None
    return None
