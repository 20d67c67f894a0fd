"""Conversations: one normal form for every prompt source schema.

A `Conversation` is an id, the source it came from, and OpenAI-style messages
(`{"role": "system"|"user"|"assistant", "content": str}`). Records in other schemas are
converted here, each failure one line naming the record and the field:

    to_conversation({"conversations": [{"from": "human", "value": "hi"}]}, "sharegpt", {}, "a.jsonl:1")
"""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from dataclasses import dataclass, field
from typing import Any

from dspark_cli.errors import UsageError

ROLES = ("system", "user", "assistant")
_SHAREGPT_ROLES = {
    "system": "system",
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "model": "assistant",
    "chatgpt": "assistant",
    "bard": "assistant",
}
SCHEMAS = ("messages", "sharegpt", "prompt_response", "turns")


@dataclass
class Conversation:
    """A conversation in OpenAI form. `messages` may end with a user turn (prompts only)."""

    id: str
    source: str
    messages: list[dict[str, str]]
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def user_turns(self) -> list[str]:
        return [m["content"] for m in self.messages if m["role"] == "user"]

    @property
    def system(self) -> str | None:
        return next((m["content"] for m in self.messages if m["role"] == "system"), None)


def normalise_text(text: str) -> str:
    """Text as compared for de-duplication and eval exclusion: NFKC, case-folded, whitespace collapsed."""
    return re.sub(r"\s+", " ", unicodedata.normalize("NFKC", text)).strip().casefold()


def prompt_hash(user_turns: list[str]) -> str:
    """Hash of a conversation's user turns (normalised). Two conversations asking the same thing collide."""
    joined = "\x1e".join(normalise_text(t) for t in user_turns)
    return hashlib.sha256(joined.encode("utf-8")).hexdigest()


def turn_hashes(user_turns: list[str]) -> set[str]:
    """Hashes of each user turn alone: used to exclude any conversation that contains an eval prompt."""
    return {hashlib.sha256(normalise_text(t).encode("utf-8")).hexdigest() for t in user_turns if t.strip()}


def detect_schema(record: dict[str, Any], fields: dict[str, str]) -> str | None:
    """Which schema a record uses, honouring a field mapping; None if none fits."""
    if fields.get("messages", "messages") in record:
        return "messages"
    if fields.get("conversations", "conversations") in record:
        return "sharegpt"
    if fields.get("prompt", "prompt") in record:
        return "prompt_response"
    if fields.get("turns", "turns") in record:
        return "turns"
    return None


def to_conversation(record: Any, schema: str, fields: dict[str, str], where: str, source: str) -> Conversation:
    """Convert one record; raise UsageError naming `where` (file:line) and the field on failure."""
    if not isinstance(record, dict):
        raise UsageError(f"{where}: expected a JSON object, got {type(record).__name__}")
    if schema == "auto":
        detected = detect_schema(record, fields)
        if detected is None:
            keys = ", ".join(sorted(record)[:8])
            raise UsageError(
                f"{where}: unknown schema (keys: {keys})",
                "set format: messages|sharegpt|prompt_response|turns and map fields, e.g. fields: {prompt: question}",
            )
        schema = detected
    if schema == "messages":
        messages = _from_messages(_field(record, fields, "messages", where), where)
    elif schema == "sharegpt":
        messages = _from_sharegpt(_field(record, fields, "conversations", where), where)
    elif schema == "prompt_response":
        messages = _from_prompt_response(record, fields, where)
    elif schema == "turns":
        turns = _field(record, fields, "turns", where)
        if not isinstance(turns, list) or not all(isinstance(t, str) for t in turns):
            raise UsageError(f"{where}: field 'turns' must be a list of strings")
        messages = [{"role": "user", "content": t} for t in turns]
        system = record.get(fields.get("system", "system"))
        if isinstance(system, str) and system:
            messages.insert(0, {"role": "system", "content": system})
    else:
        raise UsageError(f"{where}: unknown format {schema!r}; use one of {', '.join(SCHEMAS)}")
    if not any(m["role"] == "user" and m["content"].strip() for m in messages):
        raise UsageError(f"{where}: no user turn with text")
    first = next(i for i, m in enumerate(messages) if m["role"] != "system")
    if messages[first]["role"] == "assistant":
        raise UsageError(
            f"{where}: the conversation starts with an assistant turn (message {first}); "
            "an assistant answers a user turn",
            "drop that turn, or the record",
        )
    record_id = record.get(fields.get("id", "id"), record.get("question_id"))
    meta: dict[str, Any] = {k: record[k] for k in ("category",) if k in record}
    if record_id is None:
        meta["id_from_content"] = True  # read_source numbers exact repeats instead of refusing them
    conv_id = str(record_id) if record_id is not None else _content_id(messages)
    return Conversation(id=f"{source}#{conv_id}", source=source, messages=messages, meta=meta)


def content_digest(messages: list[dict[str, str]]) -> str:
    """sha256 of a conversation's messages (what tells two records apart)."""
    return hashlib.sha256(json.dumps(messages, sort_keys=True).encode()).hexdigest()


def _content_id(messages: list[dict[str, str]]) -> str:
    return content_digest(messages)[:16]


def _field(record: dict[str, Any], fields: dict[str, str], name: str, where: str) -> Any:
    key = fields.get(name, name)
    if key not in record:
        raise UsageError(f"{where}: missing field '{key}'", f"map it with fields: {{{name}: <your field>}}")
    return record[key]


def _from_messages(value: Any, where: str) -> list[dict[str, str]]:
    if not isinstance(value, list):
        raise UsageError(f"{where}: field 'messages' must be a list")
    out = []
    for i, message in enumerate(value):
        if not isinstance(message, dict) or "role" not in message or "content" not in message:
            raise UsageError(f"{where}: messages[{i}] needs 'role' and 'content'")
        role, content = message["role"], message["content"]
        if role not in ROLES:
            raise UsageError(f"{where}: messages[{i}].role {role!r} is not one of {', '.join(ROLES)}")
        out.append({"role": role, "content": _text(content, f"{where}: messages[{i}].content")})
    return out


def _from_sharegpt(value: Any, where: str) -> list[dict[str, str]]:
    if not isinstance(value, list):
        raise UsageError(f"{where}: field 'conversations' must be a list")
    out = []
    for i, turn in enumerate(value):
        if not isinstance(turn, dict) or "from" not in turn or "value" not in turn:
            raise UsageError(f"{where}: conversations[{i}] needs 'from' and 'value'")
        role = _SHAREGPT_ROLES.get(str(turn["from"]).lower())
        if role is None:
            raise UsageError(f"{where}: conversations[{i}].from {turn['from']!r} is not a known speaker")
        out.append({"role": role, "content": _text(turn["value"], f"{where}: conversations[{i}].value")})
    return out


def _from_prompt_response(record: dict[str, Any], fields: dict[str, str], where: str) -> list[dict[str, str]]:
    messages = []
    system = record.get(fields.get("system", "system"))
    if isinstance(system, str) and system:
        messages.append({"role": "system", "content": system})
    messages.append({"role": "user", "content": _text(_field(record, fields, "prompt", where), f"{where}: prompt")})
    response_key = fields.get("response", "response")
    if record.get(response_key) is not None:
        messages.append({"role": "assistant", "content": _text(record[response_key], f"{where}: {response_key}")})
    return messages


def _text(value: Any, what: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in value):
        return "".join(p.get("text", "") for p in value)  # OpenAI content parts
    raise UsageError(f"{what}: expected text, got {type(value).__name__}")
