"""The tiny targets' shared tokenizer: byte-level BPE trained here, chat special tokens, a chat template.

    python -m tools.tiny_targets.build_tiny --out /tmp/tiny     # trains it as the build's first step

Token ids 0..5 are the special tokens (fixed, so they never depend on BPE training):
`<|pad|>` 0, `<|end|>` 1 (EOS, closes every turn), `<|system|>` 2, `<|user|>` 3, `<|assistant|>` 4,
`<|mask|>` 5 (never trained on; reserved as the DSpark draft's mask token, named `mask_token` in
tokenizer_config.json so later stages find its id).

Chat format (one turn):  `<|user|>\\n{content}<|end|>\\n`; a generation prompt is `<|assistant|>\\n`, and the
model answers `{content}<|end|>`. `enable_thinking` is accepted and ignored: these models do not think.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

PAD, EOS, SYSTEM, USER, ASSISTANT, MASK = "<|pad|>", "<|end|>", "<|system|>", "<|user|>", "<|assistant|>", "<|mask|>"
SPECIAL_TOKENS = [PAD, EOS, SYSTEM, USER, ASSISTANT, MASK]

# Jinja, as transformers and vLLM render it. The trailing "\n" after <|end|> is part of the *next* turn's
# prefix for training purposes: the assistant's target ends at <|end|>, which is where generation stops.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] not in ['system', 'user', 'assistant'] -%}"
    "{{ raise_exception('tiny targets know the roles system, user and assistant, not ' + message['role']) }}"
    "{%- endif -%}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + '<|end|>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|assistant|>\\n' }}{%- endif -%}"
)


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """Byte-level BPE over `texts` (deterministic for a given text order), wrapped for transformers."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=2,
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD,
        eos_token=EOS,
        mask_token=MASK,
        additional_special_tokens=[SYSTEM, USER, ASSISTANT],
        model_max_length=2048,
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    for i, special in enumerate(SPECIAL_TOKENS):
        assert fast.convert_tokens_to_ids(special) == i, (special, i)
    return fast


def encode_chat(tokenizer: PreTrainedTokenizerFast, messages: list[dict[str, str]]) -> tuple[list[int], list[int]]:
    """Token ids of a whole conversation and a same-length 0/1 loss mask (1 on assistant content + its EOS).

    Built turn by turn from the same strings the template renders, so training sees exactly what
    `apply_chat_template` produces at inference (checked in tests/targets/test_tiny_targets.py).
    """
    ids: list[int] = []
    mask: list[int] = []
    for message in messages:
        head = tokenizer.encode(f"<|{message['role']}|>\n", add_special_tokens=False)
        body = tokenizer.encode(message["content"], add_special_tokens=False)
        learn = 1 if message["role"] == "assistant" else 0
        ids += head + body + [tokenizer.eos_token_id]
        mask += [0] * len(head) + [learn] * (len(body) + 1)
        newline = tokenizer.encode("\n", add_special_tokens=False)
        ids += newline
        mask += [0] * len(newline)
    return ids, mask
