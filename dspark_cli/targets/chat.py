"""The target's chat template, applied exactly as serving applies it, and loss masks on assistant tokens.

    chat = ChatFormat(tokenizer, {"enable_thinking": False})
    ids = chat.prompt_ids(messages)                 # what vLLM's chat endpoint would feed the model
    samples = chat.training_samples(messages)       # [(input_ids, loss_mask)], masks on assistant tokens

The same `chat_template_kwargs` (recipe `target.chat_template_kwargs`) are used by datagen, serve
and bench; `template_hash` fingerprints template + kwargs so a mismatch between the data a draft
was trained on and the way it is served can be detected, not guessed.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from dspark_cli.errors import UsageError


class ChatFormat:
    """Chat-template rendering for one tokenizer and one set of template arguments."""

    def __init__(self, tokenizer: Any, template_kwargs: dict[str, Any] | None = None) -> None:
        if not getattr(tokenizer, "chat_template", None):
            name = getattr(tokenizer, "name_or_path", "the target")
            raise UsageError(
                f"tokenizer of {name} has no chat template",
                "use a chat (instruct) model, or set target.tokenizer to one that has a template",
            )
        self.tokenizer = tokenizer
        self.kwargs = dict(template_kwargs or {})

    @property
    def template_hash(self) -> str:
        blob = json.dumps({"template": self.tokenizer.chat_template, "kwargs": self.kwargs}, sort_keys=True)
        return hashlib.sha256(blob.encode("utf-8")).hexdigest()

    def render_ids(self, messages: list[dict[str, str]], add_generation_prompt: bool) -> list[int]:
        from jinja2 import TemplateError  # transformers' dependency; SecurityError (the sandbox) is one

        try:
            out = self.tokenizer.apply_chat_template(
                messages, tokenize=True, add_generation_prompt=add_generation_prompt, **self.kwargs
            )
        except TemplateError as exc:  # the template refused (raise_exception) or did what its sandbox forbids
            name = getattr(self.tokenizer, "name_or_path", "the target")
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
            raise UsageError(
                f"the chat template of {name} failed on a conversation ({type(exc).__name__}: {first})",
                "fix the template (target.tokenizer), or the conversations it refuses",
            ) from None
        if isinstance(out, dict) or hasattr(out, "input_ids"):  # transformers returns a BatchEncoding
            out = out["input_ids"]
        return list(out)

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
