"""Held-out quality of a tiny target: teacher-forced loss / next-token accuracy, EOS, loop and `ast.parse` shares.

    python -m tools.tiny_targets.eval_tiny tiny-mla        # the card's numbers, recomputed from the shipped files

Shared by the build (which writes the numbers into the card) and tests/targets/test_tiny_targets.py (which recomputes
them with thresholds). Accuracy and loss cover assistant tokens and their EOS only, as in training.
"""

from __future__ import annotations

import argparse
import ast
import json
import logging
from dataclasses import asdict, dataclass

from tools.tiny_targets.corpus import Pair

logger = logging.getLogger(__name__)

MAX_NEW_TOKENS = 256  # the length limit for "ends with EOS": longer than every reference answer
# A response "loops" when some run of LOOP_MIN_SPAN or more tokens repeats itself with a period of at most
# LOOP_MAX_PERIOD tokens, at least LOOP_MIN_REPEATS times: `self._x\n    self._x\n    self._x\n` or
# `_de_de_de_de...`. Legitimate code rarely does (4 identical lines in a row, or a 16-token run of one
# token); the stdlib's own answers in the corpus are the check (tests/targets/test_tiny_targets.py).
LOOP_MIN_SPAN = 16
LOOP_MAX_PERIOD = 16
LOOP_MIN_REPEATS = 3


@dataclass
class HeldOutMetrics:
    num_prompts: int
    loss: float  # mean cross-entropy (nats) per assistant token
    accuracy: float  # share of assistant tokens whose greedy next-token prediction is right
    num_tokens: int


@dataclass
class GenerationMetrics:
    num_prompts: int
    eos_share: float  # responses that end with EOS within MAX_NEW_TOKENS
    loop_share: float  # responses with a repetition loop (`loop_period`), whether they end or not
    num_code: int
    ast_share: float  # code responses that ast.parse accepts and that define a function
    mean_new_tokens: float


def prompt_ids(tokenizer, pair: Pair) -> list[int]:
    """The chat-templated prompt (system/user turns + generation prompt), as served."""
    return tokenizer.apply_chat_template(
        pair.messages()[:-1], add_generation_prompt=True, tokenize=True, return_dict=False
    )


def held_out_metrics(model, tokenizer, pairs: list[Pair], batch_size: int = 32) -> HeldOutMetrics:
    """Teacher-forced cross-entropy and top-1 accuracy on the assistant turn of every pair."""
    import torch

    from tools.tiny_targets.tokenizer import encode_chat

    total_loss, correct, count = 0.0, 0, 0
    encoded = [encode_chat(tokenizer, p.messages()) for p in pairs]
    with torch.no_grad():
        for start in range(0, len(encoded), batch_size):
            chunk = encoded[start : start + batch_size]
            width = max(len(ids) for ids, _ in chunk)
            # Right padding: causal attention never lets a real token see the pad that follows it.
            ids = torch.tensor([i + [tokenizer.pad_token_id] * (width - len(i)) for i, _ in chunk])
            mask = torch.tensor([m + [0] * (width - len(m)) for _, m in chunk], dtype=torch.bool)
            logits = model(input_ids=ids[:, :-1]).logits.float()  # [batch, width - 1, vocab]
            target = ids[:, 1:]
            keep = mask[:, 1:]
            nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), target, reduction="none")
            total_loss += nll[keep].sum().item()
            correct += (logits.argmax(-1) == target)[keep].sum().item()
            count += int(keep.sum().item())
    return HeldOutMetrics(len(pairs), total_loss / count, correct / count, count)


def hf_generate(model, tokenizer, pairs: list[Pair], max_new_tokens: int = MAX_NEW_TOKENS) -> list[list[int]]:
    """Greedy responses (new token ids, EOS included when produced), one prompt at a time: no padding effects."""
    import torch

    outputs = []
    with torch.no_grad():
        for pair in pairs:
            ids = torch.tensor([prompt_ids(tokenizer, pair)])
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id,
            )
            outputs.append(out[0, ids.shape[1] :].tolist())
    return outputs


def loop_period(ids: list[int]) -> int:
    """The shortest period p (1..LOOP_MAX_PERIOD) of a repetition loop in `ids`, or 0 when there is none.

    A loop of period p is a stretch where every token equals the one p before it, long enough that the
    repeated stretch (the run plus its first period) covers max(LOOP_MIN_SPAN, LOOP_MIN_REPEATS * p) tokens.
    """
    for p in range(1, LOOP_MAX_PERIOD + 1):
        need = max(LOOP_MIN_SPAN, LOOP_MIN_REPEATS * p)
        run = 0
        for i in range(p, len(ids)):
            run = run + 1 if ids[i] == ids[i - p] else 0
            if run + p >= need:
                return p
    return 0


def code_of(text: str) -> str:
    """The code in a response: a fenced block's body when there is one, else the whole text."""
    if "```" in text:
        body = text.split("```", 2)[1]
        return body.split("\n", 1)[1] if "\n" in body else body
    return text


def parses(text: str) -> bool:
    """`ast.parse` accepts the code *and* it defines a function or class: "", "x" or prose would parse too."""
    try:
        tree = ast.parse(code_of(text))
    except (SyntaxError, ValueError):  # ValueError: null bytes
        return False
    return any(isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) for node in tree.body)


def generation_metrics(
    tokenizer, pairs: list[Pair], outputs: list[list[int]], max_new_tokens: int = MAX_NEW_TOKENS
) -> GenerationMetrics:
    eos = tokenizer.eos_token_id
    ended = [bool(out) and out[-1] == eos and len(out) <= max_new_tokens for out in outputs]
    code_ok = [
        parses(tokenizer.decode(out, skip_special_tokens=True))
        for pair, out in zip(pairs, outputs)
        if pair.task == "code"
    ]
    return GenerationMetrics(
        num_prompts=len(pairs),
        eos_share=sum(ended) / len(pairs),
        loop_share=sum(loop_period(out) > 0 for out in outputs) / len(pairs),
        num_code=len(code_ok),
        ast_share=sum(code_ok) / max(1, len(code_ok)),
        mean_new_tokens=sum(len(o) for o in outputs) / len(pairs),
    )


def evaluate_dir(path: str, num_held_out: int | None = None) -> dict:
    """All card numbers for one saved target directory (computed in float32)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tools.tiny_targets.corpus import build_corpus, eval_prompts

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    corpus = build_corpus()
    prompts = eval_prompts(corpus)
    held_out = corpus.held_out[:num_held_out] if num_held_out else corpus.held_out
    outputs = hf_generate(model, tokenizer, prompts)
    return {
        "eval_prompts": asdict(held_out_metrics(model, tokenizer, prompts)),
        "held_out_all": asdict(held_out_metrics(model, tokenizer, held_out)),
        "generation": asdict(generation_metrics(tokenizer, prompts, outputs)),
        "samples": [
            {"prompt": p.prompt, "response": tokenizer.decode(o, skip_special_tokens=True)}
            for p, o in list(zip(prompts, outputs))[:3] + list(zip(prompts, outputs))[-2:]
        ],
    }


def main() -> None:
    from dspark_cli.targets import resolve_target

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target", help="tiny-mla, tiny-gqa or a directory")
    args = parser.parse_args()
    print(json.dumps(evaluate_dir(str(resolve_target(args.target))), indent=2))


if __name__ == "__main__":
    main()
