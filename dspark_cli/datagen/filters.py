"""Which conversations datagen keeps: evaluation prompts excluded, duplicates dropped, lengths bounded.

Evaluation prompts are excluded by the hash of each normalised user turn (see
`conversation.normalise_text`), so a training conversation that merely contains an MT-Bench
question is dropped too. `mt_bench` is built in as fingerprints (`eval_sets/mt_bench.sha256`,
no text); any other entry is a prompt file or dataset in a schema datagen reads.

The validation split (`split_validation`) is decided by the same normalised-prompt hash: a conversation
is held out when its hash, read as a number in [0, 1), is below `datagen.validation_fraction`; so the
split depends on content alone (not on order, batches, resume or workers), and identical prompts always
fall on the same side, deduplicated or not.

    python -m dspark_cli.datagen.filters --fingerprint question.jsonl > eval_sets/NAME.sha256
"""

from __future__ import annotations

import argparse
import logging
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from dspark_cli.errors import UsageError
from dspark_cli.prompts.conversation import Conversation, prompt_hash, turn_hashes

EVAL_SET_DIR = Path(__file__).with_name("eval_sets")
MIN_SPLIT_CONVERSATIONS = 20  # fewer: no validation split (a handful held out would measure nothing)
log = logging.getLogger(__name__)


def builtin_eval_sets() -> list[str]:
    return sorted(p.stem for p in EVAL_SET_DIR.glob("*.sha256"))


def eval_fingerprints(name: str) -> set[str]:
    """Hashes of every user turn of an evaluation set: a built-in name, a file, or a dataset."""
    builtin = EVAL_SET_DIR / f"{name}.sha256"
    if builtin.is_file():
        lines = builtin.read_text(encoding="utf-8").splitlines()
        return {line.strip() for line in lines if line.strip() and not line.startswith("#")}
    from dspark_cli.prompts.sources import read_source
    from dspark_cli.recipe.schema import PromptSource

    hashes: set[str] = set()
    try:
        for conv in read_source(PromptSource(path=name, split="train")):
            hashes |= turn_hashes(conv.user_turns)
    except UsageError as exc:
        raise UsageError(
            f"evaluation set {name!r}: {exc.message}",
            f"built in: {', '.join(builtin_eval_sets())}; otherwise a prompt file or dataset name",
        ) from None
    return hashes


@dataclass
class FilterReport:
    """Counts per source: read, kept, and why the others were dropped."""

    read: Counter[str] = field(default_factory=Counter)
    kept: Counter[str] = field(default_factory=Counter)
    dropped: dict[str, Counter[str]] = field(default_factory=dict)

    def drop(self, reason: str, source: str) -> None:
        self.dropped.setdefault(reason, Counter())[source] += 1

    def as_dict(self) -> dict[str, object]:
        return {
            "read": dict(self.read),
            "kept": dict(self.kept),
            "dropped": {reason: dict(counts) for reason, counts in self.dropped.items()},
        }


def filter_conversations(
    conversations: Iterable[Conversation],
    *,
    eval_hashes: set[str],
    dedup: bool,
    prompt_length: Callable[[Conversation], int] | None,
    min_prompt_tokens: int,
    max_prompt_tokens: int,
    max_turns: int | None,
    report: FilterReport,
) -> Iterator[Conversation]:
    """Yield the conversations to regenerate, in input order; count every decision in `report`."""
    seen: set[str] = set()
    for conv in conversations:
        report.read[conv.source] += 1
        if max_turns is not None:
            conv = truncate_turns(conv, max_turns)
        if eval_hashes and turn_hashes(conv.user_turns) & eval_hashes:
            report.drop("eval_prompt", conv.source)
            continue
        key = prompt_hash(conv.user_turns)
        if dedup and key in seen:
            report.drop("duplicate", conv.source)
            continue
        seen.add(key)
        if prompt_length is not None:
            length = prompt_length(conv)
            if length < min_prompt_tokens:
                report.drop("prompt_too_short", conv.source)
                continue
            if length > max_prompt_tokens:
                report.drop("prompt_too_long", conv.source)
                continue
        report.kept[conv.source] += 1
        yield conv


def split_validation(
    conversations: list[Conversation], *, fraction: float, most: int
) -> tuple[list[Conversation], list[Conversation]]:
    """(training, validation), each in input order. A conversation is validation when its prompt hash
    (`prompt_hash`, hex) as a fraction of 2**256 is below `fraction`; of those, the smallest hashes are kept,
    whole groups of identical prompts at a time, while at most `most` conversations are held out."""
    if fraction <= 0 or not conversations:
        return list(conversations), []
    if len(conversations) < MIN_SPLIT_CONVERSATIONS:
        log.warning(
            "datagen: %d conversations, fewer than %d: no validation split (datagen.validation_fraction=%g ignored)",
            len(conversations),
            MIN_SPLIT_CONVERSATIONS,
            fraction,
        )
        return list(conversations), []
    keys = [prompt_hash(c.user_turns) for c in conversations]
    sizes = Counter(keys)
    threshold = fraction * 2**256  # a float: int < float compares exactly
    chosen: set[str] = set()
    held = 0
    for key in sorted(k for k in sizes if int(k, 16) < threshold):
        if held + sizes[key] > most:
            break
        chosen.add(key)
        held += sizes[key]
    training = [c for c, k in zip(conversations, keys, strict=True) if k not in chosen]
    validation = [c for c, k in zip(conversations, keys, strict=True) if k in chosen]
    return training, validation


def truncate_turns(conv: Conversation, max_turns: int) -> Conversation:
    """Keep the system prompt and the first `max_turns` user turns (with what follows each)."""
    kept, users = [], 0
    for message in conv.messages:
        if message["role"] == "user":
            users += 1
            if users > max_turns:
                break
        kept.append(message)
    return Conversation(conv.id, conv.source, kept, conv.meta)


def main() -> None:
    parser = argparse.ArgumentParser(description="Print the fingerprints of an evaluation prompt set.")
    parser.add_argument("--fingerprint", required=True, help="prompt file or dataset name")
    args = parser.parse_args()
    for digest in sorted(eval_fingerprints(args.fingerprint)):
        print(digest)


if __name__ == "__main__":
    main()
