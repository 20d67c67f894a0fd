"""The target's chat template, applied exactly as serving applies it, and loss masks on assistant tokens.

    chat = ChatFormat(tokenizer, {"enable_thinking": False})
    ids = chat.prompt_ids(messages)                 # what vLLM's chat endpoint would feed the model
    samples = chat.training_samples(messages)       # [(input_ids, loss_mask)], masks on assistant tokens

The same `chat_template_kwargs` (recipe `target.chat_template_kwargs`) are used by datagen, serve
and bench; `template_hash` fingerprints template + kwargs so a mismatch between the data a draft
was trained on and the way it is served can be detected, not guessed.

The template is code from the model's files, so every render is bounded (`RenderBounds`): at most
DSPARK_CHAT_TEMPLATE_SECONDS (5) seconds, and at most twice the conversation's text plus
DSPARK_CHAT_TEMPLATE_MAX_CHARS (65536) characters. A template that does not parse, fails, runs over
or says too much ends the stage with one line naming its file (`origin`) and, where known, its line.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dspark_cli.errors import UsageError
from dspark_cli.targets.deadline import Overtime, template_line, within

SECONDS_ENV = "DSPARK_CHAT_TEMPLATE_SECONDS"
MAX_CHARS_ENV = "DSPARK_CHAT_TEMPLATE_MAX_CHARS"


@dataclass(frozen=True)
class RenderBounds:
    """The most work one render of a chat template may take. Real templates render in well under a
    millisecond (the bundled tiny targets': ~0.1 ms) and print each message once plus a few tags."""

    seconds: float = 5.0  # wall clock per render (DSPARK_CHAT_TEMPLATE_SECONDS)
    extra_chars: int = 1 << 16  # characters a render may print beyond twice its messages' text

    @classmethod
    def from_env(cls) -> RenderBounds:
        """The defaults, or DSPARK_CHAT_TEMPLATE_SECONDS / DSPARK_CHAT_TEMPLATE_MAX_CHARS where set."""
        seconds, extra = cls.seconds, cls.extra_chars
        raw = os.environ.get(SECONDS_ENV, "").strip()
        if raw:
            try:
                seconds = float(raw)
            except ValueError:
                seconds = math.nan
            if not (math.isfinite(seconds) and seconds > 0):
                raise UsageError(
                    f"{SECONDS_ENV}={raw!r} is not a number of seconds above 0", f"unset it, or e.g. {SECONDS_ENV}=5"
                )
        raw = os.environ.get(MAX_CHARS_ENV, "").strip()
        if raw:
            if not (raw.isascii() and raw.isdigit()):
                raise UsageError(
                    f"{MAX_CHARS_ENV}={raw!r} is not a count of characters",
                    f"unset it, or e.g. {MAX_CHARS_ENV}=65536",
                )
            extra = int(raw)
        return cls(seconds, extra)

    def max_chars(self, messages: list[dict[str, str]]) -> int:
        return 2 * _text_chars(messages) + self.extra_chars


def template_origin(tokenizer: Any) -> str:
    """Where a tokenizer's chat template comes from, as the user would open it: `DIR/chat_template.jinja`
    (transformers prefers it), `DIR/tokenizer_config.json (chat_template)`, else `of HUB_ID`."""
    name = str(getattr(tokenizer, "name_or_path", "") or "the target")
    directory = Path(name)
    if not directory.is_dir():
        return f"of {name}"
    if (directory / "chat_template.jinja").is_file():
        return str(directory / "chat_template.jinja")
    for file in ("tokenizer_config.json", "chat_template.json"):
        try:
            if "chat_template" in json.loads((directory / file).read_text(encoding="utf-8")):
                return f"{directory / file} (chat_template)"
        except (OSError, ValueError, TypeError):
            continue
    return str(directory)


class ChatFormat:
    """Chat-template rendering for one tokenizer and one set of template arguments."""

    def __init__(
        self, tokenizer: Any, template_kwargs: dict[str, Any] | None = None, bounds: RenderBounds | None = None
    ) -> None:
        if not getattr(tokenizer, "chat_template", None):
            name = getattr(tokenizer, "name_or_path", "the target")
            raise UsageError(
                f"tokenizer of {name} has no chat template",
                "use a chat (instruct) model, or set target.tokenizer to one that has a template",
            )
        self.tokenizer = tokenizer
        self.kwargs = dict(template_kwargs or {})
        self.bounds = bounds or RenderBounds.from_env()
        self.origin = template_origin(tokenizer)

    @property
    def template_hash(self) -> str:
        blob = json.dumps({"template": self.tokenizer.chat_template, "kwargs": self.kwargs}, sort_keys=True)
        return hashlib.sha256(blob.encode("utf-8")).hexdigest()

    def render_text(self, messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
        """The template's text for `messages`, rendered with bounded work (`RenderBounds`); one-line
        UsageError naming the template when it does not parse, fails, runs too long or says too much."""
        bounds = self.bounds
        try:
            text = within(
                bounds.seconds,
                lambda: self.tokenizer.apply_chat_template(
                    messages, tokenize=False, add_generation_prompt=add_generation_prompt, **self.kwargs
                ),
            )
        except Overtime as exc:
            raise UsageError(
                f"the chat template {self.origin} took over {bounds.seconds:g} s to render a conversation of "
                f"{_messages(messages)} (stopped{_at_line(exc)})",
                f"fix its loops (a chat template renders in milliseconds), or raise {SECONDS_ENV}",
            ) from None
        except Exception as exc:  # noqa: BLE001 - the template is code from the model's files: any error is its own
            from jinja2 import TemplateSyntaxError

            first = (str(exc).strip().splitlines() or [""])[0][:200]
            what = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
            if isinstance(exc, TemplateSyntaxError):
                raise UsageError(
                    f"the chat template {self.origin} does not parse ({_line_of(exc)}{first})",
                    "fix the template, or set target.tokenizer to a tokenizer whose template works",
                ) from None
            raise UsageError(
                f"the chat template {self.origin} failed on a conversation of {_messages(messages)} "
                f"({_line_of(exc)}{what})",
                "fix the template (target.tokenizer), or the conversations it refuses",
            ) from None
        most = bounds.max_chars(messages)
        if len(text) > most:
            raise UsageError(
                f"the chat template {self.origin} printed {len(text):,} characters for a conversation of "
                f"{_text_chars(messages):,} (at most {most:,})",
                f"fix what it prints, or raise {MAX_CHARS_ENV}",
            )
        return text

    def render_ids(self, messages: list[dict[str, str]], add_generation_prompt: bool) -> list[int]:
        """Token ids of the rendered text, tokenised as serving does (vLLM: no special tokens added)."""
        text = self.render_text(messages, add_generation_prompt)
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def probe(self) -> None:
        """Render one short user turn (what every chat template accepts), so that a template that does not
        parse, fails or runs away is refused before anything heavy starts (bench loads the target next)."""
        self.render_text([{"role": "user", "content": "Hello"}], add_generation_prompt=True)

    def prompt_ids(self, messages: list[dict[str, str]]) -> list[int]:
        """Token ids the target sees before answering the last user turn of `messages`."""
        return self.render_ids(messages, add_generation_prompt=True)

    def training_samples(self, messages: list[dict[str, str]]) -> list[tuple[list[int], list[int]]]:
        """(input_ids, loss_mask) for a conversation, masks on every assistant token (end token included).

        When the template is prefix-stable (rendering the first k turns is a prefix of rendering all),
        the whole conversation is one sample. Templates that rewrite history (e.g. dropping earlier
        reasoning) give one sample per assistant turn, each rendered as serving renders that turn.
        """
        assistant_turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
        if not assistant_turns:
            return []
        full = self.render_ids(messages, add_generation_prompt=False)
        spans = []
        for i in assistant_turns:
            before = self.render_ids(messages[:i], add_generation_prompt=True)
            through = self.render_ids(messages[: i + 1], add_generation_prompt=False)
            if full[: len(before)] != before or full[: len(through)] != through or len(through) <= len(before):
                return self._per_turn_samples(messages, assistant_turns)
            spans.append((len(before), len(through)))
        mask = [0] * len(full)
        for start, end in spans:
            mask[start:end] = [1] * (end - start)
        return [(full, mask)]

    def _per_turn_samples(self, messages: list[dict[str, str]], turns: list[int]) -> list[tuple[list[int], list[int]]]:
        samples = []
        for i in turns:
            prompt = self.render_ids(messages[:i], add_generation_prompt=True)
            whole = self.render_ids(messages[: i + 1], add_generation_prompt=False)
            if whole[: len(prompt)] != prompt:
                # The template renders a finished turn differently from a generation prompt: mask
                # the response as generated after the prompt (exactly what the server produced).
                response = self.tokenizer.encode(messages[i]["content"], add_special_tokens=False)
                eos = self.tokenizer.eos_token_id
                whole = prompt + response + ([eos] if eos is not None else [])
            samples.append((whole, [0] * len(prompt) + [1] * (len(whole) - len(prompt))))
        return samples


def _text_chars(messages: list[dict[str, str]]) -> int:
    return sum(len(m.get("content") or "") for m in messages)


def _messages(messages: list[dict[str, str]]) -> str:
    return f"{len(messages)} message" + ("" if len(messages) == 1 else "s")


def _at_line(exc: BaseException) -> str:
    line = template_line(exc)
    return f" at line {line}" if line is not None else ""


def _line_of(exc: BaseException) -> str:
    line = template_line(exc)
    return f"line {line}: " if line is not None else ""
