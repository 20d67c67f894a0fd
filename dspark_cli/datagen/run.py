"""`dspark datagen`: regenerate every assistant turn with the target itself, resumably.

    dspark datagen templates/recipes/tiny.yaml --dry-run     # how many conversations/turns, where
    dspark datagen templates/recipes/tiny.yaml               # writes runs/tiny/data/shard-*.jsonl

For each conversation the target answers turn by turn, seeing its *own* earlier answers, with its
chat template applied by its tokenizer (`ChatFormat`) and the recipe's sampling. Output: JSONL
shards of records `{id, source, messages, turns: [{prompt_ids, response_ids, finish_reason}],
samples: [{input_ids, loss_mask}]}` plus `manifest.json` (sources and counts, target, tokenizer and
chat-template hash, sampling, engine and versions, shard checksums). Killed at any moment and re-run
with the same recipe, it continues where it stopped and ends with exactly the same set of samples.

The validation split (`datagen.validation_fraction`, `validation_max`; filters.py `split_validation`)
is regenerated the same way into `validation/shard-*.jsonl`, apart from the training shards; the manifest's
`validation` lists those shards, the split's settings and counts, and the sorted ids held out
(`artifacts.datagen.iter_records(dir, split="validation")` reads them back). Capture never trains on them.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path
from typing import Any

from dspark_cli import __version__
from dspark_cli.artifacts.files import (
    MANIFEST_NAME,
    exclusive_output,
    resumable_manifest,
    sha256_file,
    write_json_atomic,
)
from dspark_cli.artifacts.jsonl import PartialShard, read_jsonl, shard_path
from dspark_cli.artifacts.results import DatagenSummary, FilterCounts
from dspark_cli.datagen.engines import Engine, Sampling, close_engine
from dspark_cli.datagen.filters import FilterReport, eval_fingerprints, filter_conversations, split_validation
from dspark_cli.errors import UsageError
from dspark_cli.prompts.conversation import Conversation
from dspark_cli.prompts.sources import read_source, source_labels
from dspark_cli.recipe import Recipe, recorded_tree, write_resolved
from dspark_cli.targets import ChatFormat, Target

log = logging.getLogger(__name__)
VALIDATION_DIR = "validation"  # the validation split's shards, under the datagen directory
Progress = Callable[[int, int, int], None]  # (conversations done, total, tokens generated so far)


@dataclass
class DatagenPlan:
    out_dir: Path
    conversations: list[Conversation]  # the training conversations
    report: FilterReport
    chat: ChatFormat
    target_path: str
    fingerprint: str
    validation: list[Conversation] = field(default_factory=list)  # held out: never trained on

    @property
    def num_turns(self) -> int:
        return sum(len(c.user_turns) for c in self.conversations)

    @property
    def validation_dir(self) -> Path:
        return self.out_dir / VALIDATION_DIR

    def shards(self, shard_size: int) -> list[list[Conversation]]:
        convs = self.conversations
        return [convs[i : i + shard_size] for i in range(0, len(convs), shard_size)]

    def validation_shards(self, shard_size: int) -> list[list[Conversation]]:
        convs = self.validation
        return [convs[i : i + shard_size] for i in range(0, len(convs), shard_size)]

    def all_shards(self, shard_size: int) -> list[tuple[Path, int, list[Conversation]]]:
        """(directory, index, conversations) of every shard: training, then validation."""
        return [(self.out_dir, i, c) for i, c in enumerate(self.shards(shard_size))] + [
            (self.validation_dir, i, c) for i, c in enumerate(self.validation_shards(shard_size))
        ]


def eval_exclusions(recipe: Recipe) -> set[str]:
    """Fingerprints of every evaluation prompt: datagen.exclude_eval plus bench datasets that are files."""
    names = list(recipe.datagen.exclude_eval)
    names += [d for d in recipe.bench.dataset_paths() if Path(d).is_file() and d not in names]
    hashes: set[str] = set()
    for name in names:
        hashes |= eval_fingerprints(name)
    return hashes


def plan_datagen(recipe: Recipe) -> DatagenPlan:
    """Read and filter every source (no generation): the exact list of conversations to regenerate."""
    datagen = recipe.datagen
    if not datagen.sources:
        raise UsageError(
            "datagen.sources is empty", "add a prompt file or dataset, e.g. sources: [{path: prompts.jsonl}]"
        )
    chat = ChatFormat(Target.of(recipe).tokenizer(), recipe.target.chat_template_kwargs)
    report = FilterReport()

    # no token is longer than the vocabulary's longest entry, so a prompt of more characters than
    # max_prompt_tokens such tokens is too long before tokenising it (a 50 MB line took minutes and GBs)
    longest = (
        max((len(t) for t in chat.tokenizer.get_vocab()), default=1) if hasattr(chat.tokenizer, "get_vocab") else 64
    )
    most_chars = datagen.max_prompt_tokens * max(longest, 1)

    def first_prompt_length(conv: Conversation) -> int:
        first = []
        for message in conv.messages:
            first.append(message)
            if message["role"] == "user":
                break
        if sum(len(m["content"]) for m in first) > most_chars:
            return datagen.max_prompt_tokens + 1  # dropped as too long, untokenised
        return len(chat.prompt_ids(first))

    labels = source_labels(datagen.sources)  # distinct, so conversation ids are
    read = chain.from_iterable(read_source(s, label) for s, label in zip(datagen.sources, labels, strict=True))
    kept = filter_conversations(
        read,
        eval_hashes=eval_exclusions(recipe),
        dedup=datagen.dedup,
        prompt_length=first_prompt_length,
        min_prompt_tokens=datagen.min_prompt_tokens,
        max_prompt_tokens=datagen.max_prompt_tokens,
        max_turns=datagen.max_turns,
        report=report,
    )
    conversations = list(kept)
    if datagen.num_samples is not None:
        conversations = conversations[: datagen.num_samples]
    if not conversations:
        raise UsageError("no conversation left after filtering", f"counts: {json.dumps(report.as_dict())}")
    training, validation = split_validation(
        conversations, fraction=datagen.validation_fraction, most=datagen.validation_max
    )
    target = Target.of(recipe).location
    plan: dict[str, Any] = {"ids": [c.id for c in conversations]}
    if datagen.validation_fraction > 0:  # a changed split is another plan
        plan["validation"] = [datagen.validation_fraction, datagen.validation_max, sorted(c.id for c in validation)]
    blob = json.dumps(
        {
            **plan,
            "target": target,
            "revision": recipe.target.revision,
            "template": chat.template_hash,
            "sampling": [datagen.temperature, datagen.top_p, datagen.max_tokens],
            "seed": datagen.seed,
            "regenerate": datagen.regenerate,
            "engine": datagen.engine_here(),
            "max_model_len": recipe.target.max_model_len,
            "shard_size": datagen.shard_size,
        },
        sort_keys=True,
    )
    fingerprint = hashlib.sha256(blob.encode()).hexdigest()
    return DatagenPlan(Path(recipe.stage_dir("datagen")), training, report, chat, target, fingerprint, validation)


def _seed(base: int, conv_id: str, turn: int) -> int:
    return int(hashlib.sha256(f"{base}:{conv_id}:{turn}".encode()).hexdigest()[:8], 16)


def regenerate_batch(
    batch: list[Conversation], engine: Engine | None, chat: ChatFormat, recipe: Recipe
) -> list[dict[str, Any]]:
    """Answer every user turn of every conversation, turn by turn, each with its own earlier answers."""
    datagen, tokenizer = recipe.datagen, chat.tokenizer
    histories = [[m for m in c.messages if m["role"] == "system"][:1] for c in batch]
    turns: list[list[dict[str, Any]]] = [[] for _ in batch]
    finished = [False] * len(batch)
    if engine is None:  # regenerate: false -- keep the source's answers, only tokenise
        records = []
        for conv in batch:
            records.append(_record(conv, conv.messages, [], chat))
        return records
    for turn in range(max(len(c.user_turns) for c in batch)):
        active, prompts, seeds, limits = [], [], [], []
        for row, conv in enumerate(batch):
            if finished[row] or turn >= len(conv.user_turns):
                continue
            messages = histories[row] + [{"role": "user", "content": conv.user_turns[turn]}]
            prompt = chat.prompt_ids(messages)
            room = recipe.target.max_model_len - len(prompt)
            if room <= 0:
                finished[row] = True  # the conversation no longer fits: stop it at this turn
                continue
            active.append(row)
            prompts.append(prompt)
            seeds.append(_seed(datagen.seed, conv.id, turn))
            limits.append(min(datagen.max_tokens, room))
            histories[row] = messages
        if not active:
            break
        for row, prompt, generation in zip(active, prompts, engine.generate(prompts, seeds, limits), strict=True):
            text = tokenizer.decode(generation.token_ids, skip_special_tokens=True)
            histories[row] = histories[row] + [{"role": "assistant", "content": text}]
            turns[row].append(
                {"prompt_ids": prompt, "response_ids": generation.token_ids, "finish_reason": generation.finish_reason}
            )
    return [_record(conv, histories[row], turns[row], chat) for row, conv in enumerate(batch)]


def _record(
    conv: Conversation, messages: list[dict[str, str]], turns: list[dict[str, Any]], chat: ChatFormat
) -> dict[str, Any]:
    samples = [{"input_ids": ids, "loss_mask": mask} for ids, mask in chat.training_samples(messages)]
    return {
        "id": conv.id,
        "source": conv.source,
        "meta": conv.meta,
        "messages": messages,
        "turns": turns,
        "samples": samples,
    }


def engine_label(recipe: Recipe) -> str:
    """The engine datagen runs here, as the plan shows it: `vllm`, `hf`, `vllm (auto)`, `hf (auto: no vllm here)`."""
    datagen = recipe.datagen
    if not datagen.regenerate:
        return "none (source answers kept)"
    name: str = datagen.engine_here()
    if datagen.endpoint:
        name = f"vllm endpoint {datagen.endpoint}"
    if datagen.engine != "auto":
        return name
    return f"{name} (auto)" if name != "hf" else "hf (auto: vllm is not installed here)"


def make_engine(recipe: Recipe, plan: DatagenPlan, llm: Any = None) -> Engine | None:
    """The engine the recipe asks for (None when the source answers are kept). `llm` reuses a vLLM engine."""
    datagen = recipe.datagen
    if not datagen.regenerate:
        return None
    sampling = Sampling(datagen.temperature, datagen.top_p, datagen.max_tokens)
    common: dict[str, Any] = {
        "dtype": recipe.target.dtype,
        "trust_remote_code": recipe.target.trust_remote_code,
        "revision": recipe.target.revision,
    }
    if datagen.engine_here() == "hf":
        from dspark_cli.datagen.engines import HFEngine

        return HFEngine(plan.target_path, plan.chat.tokenizer, sampling, **common)
    if datagen.endpoint:
        from dspark_cli.datagen.engines import EndpointEngine

        return EndpointEngine(datagen.endpoint, sampling, request_timeout=datagen.request_timeout)
    from dspark_cli.datagen.engines import VLLMEngine

    return VLLMEngine(
        plan.target_path,
        plan.chat.tokenizer,
        sampling,
        max_model_len=recipe.target.max_model_len,
        tensor_parallel_size=datagen.tensor_parallel_size,
        data_parallel_size=datagen.data_parallel_size,
        llm=llm,
        **common,
    )


def _validation_entry(recipe: Recipe, plan: DatagenPlan, shards: list[dict[str, Any]]) -> dict[str, Any]:
    """The manifest's `validation`: the split's settings, counts, the sorted ids held out and their shards."""
    ids = sorted(c.id for c in plan.validation)
    return {
        "fraction": recipe.datagen.validation_fraction,
        "max": recipe.datagen.validation_max,
        "key": "sha256 of the normalised user turns (prompts/conversation.py prompt_hash)",
        "num_conversations": len(plan.validation),
        "num_turns": sum(len(c.user_turns) for c in plan.validation),
        "ids": ids,
        "ids_sha256": hashlib.sha256("\n".join(ids).encode("utf-8")).hexdigest(),
        "shards": shards,
    }


def _manifest(
    recipe: Recipe,
    plan: DatagenPlan,
    engine_info: dict[str, Any],
    shards: list[dict[str, Any]],
    complete: bool,
    validation_shards: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    tokenizer = plan.chat.tokenizer
    return {
        "kind": "dspark.datagen",
        "format_version": 1,
        "dspark": __version__,
        "complete": complete,
        "fingerprint": plan.fingerprint,
        "target": {"model": recipe.target.model, "path": plan.target_path, "revision": recipe.target.revision},
        "tokenizer": {
            "name_or_path": getattr(tokenizer, "name_or_path", None),
            "vocab_size": len(tokenizer),
            "eos_token_id": tokenizer.eos_token_id,
        },
        "chat_template_sha256": plan.chat.template_hash,
        "chat_template_kwargs": recipe.target.chat_template_kwargs,
        "sampling": {
            "temperature": recipe.datagen.temperature,
            "top_p": recipe.datagen.top_p,
            "max_tokens": recipe.datagen.max_tokens,
            "seed": recipe.datagen.seed,
            "regenerate": recipe.datagen.regenerate,
        },
        "engine": engine_info,
        "sources": [
            {"path": s.path, "split": s.split, "subset": s.subset, "label": label}
            for s, label in zip(recipe.datagen.sources, source_labels(recipe.datagen.sources), strict=True)
        ],
        "counts": plan.report.as_dict(),
        "exclude_eval": recipe.datagen.exclude_eval,
        "num_conversations": len(plan.conversations),
        "num_turns": plan.num_turns,
        "shards": shards,
        "validation": _validation_entry(recipe, plan, validation_shards or []),
    }


def _check_resumable(out_dir: Path, plan: DatagenPlan) -> dict[str, Any]:
    """The previous manifest of `out_dir` ({} if none); refuse output of a different plan."""
    return resumable_manifest(
        out_dir,
        kind="dspark.datagen",
        fingerprint=plan.fingerprint,
        shard_glob="shard-*.jsonl",
        section="datagen",
        changed="sources, filters, validation split, target, template or sampling",
    )


def run_datagen(
    recipe: Recipe, *, dry_run: bool = False, on_progress: Progress | None = None, llm: Any = None
) -> DatagenSummary:
    """Plan, then regenerate shard by shard (skipping finished work); return a summary."""
    plan = plan_datagen(recipe)
    shards = plan.all_shards(recipe.datagen.shard_size)
    summary = DatagenSummary(
        output_dir=str(plan.out_dir),
        conversations=len(plan.conversations) + len(plan.validation),
        turns=plan.num_turns + sum(len(c.user_turns) for c in plan.validation),
        shards=len(shards),
        counts=FilterCounts.from_dict(plan.report.as_dict()),
        engine=engine_label(recipe),
        validation=len(plan.validation),
    )
    if dry_run:
        summary.already_done = sum(1 for directory, i, _ in shards if shard_path(directory, i).is_file())
        return summary
    previous = _check_resumable(plan.out_dir, plan)
    with exclusive_output(plan.out_dir, "datagen.output_dir", kind="dspark.datagen"):  # one writer, its own dir
        pending = any(not shard_path(directory, i).is_file() for directory, i, _ in shards)
        engine = make_engine(recipe, plan, llm) if pending else None
        try:
            return _generate(recipe, plan, shards, summary, previous, engine, on_progress)
        finally:
            close_engine(engine)  # its devices are the next stages'


def _generate(
    recipe: Recipe,
    plan: DatagenPlan,
    shards: list[tuple[Path, int, list[Conversation]]],
    summary: DatagenSummary,
    previous: dict[str, Any],
    engine: Engine | None,
    on_progress: Any,
) -> DatagenSummary:
    write_resolved(recipe, plan.out_dir)
    if engine is not None:
        engine_info = engine.describe()
    elif recipe.datagen.regenerate:
        engine_info = previous.get("engine", {"engine": recipe.datagen.engine_here()})
    else:
        engine_info = {"engine": "none (source answers kept)"}
    write_json_atomic(
        plan.out_dir / MANIFEST_NAME, recorded_tree(_manifest(recipe, plan, engine_info, [], complete=False))
    )
    if plan.validation:
        plan.validation_dir.mkdir(exist_ok=True)
    started, tokens, done, total = time.perf_counter(), 0, 0, summary.conversations
    entries: dict[Path, list[dict[str, Any]]] = {plan.out_dir: [], plan.validation_dir: []}
    for directory, index, chunk in shards:
        final = shard_path(directory, index)
        if not final.is_file():
            partial = PartialShard(directory, index)
            todo = [c for c in chunk if c.id not in partial.done_ids]
            done += len(chunk) - len(todo)
            for start in range(0, len(todo), recipe.datagen.batch_size):
                batch = todo[start : start + recipe.datagen.batch_size]
                records = regenerate_batch(batch, engine, plan.chat, recipe)
                partial.append(records)
                done += len(batch)
                tokens += sum(len(t["response_ids"]) for r in records for t in r["turns"])
                if on_progress is not None:
                    on_progress(done, total, tokens)
            partial.finish([c.id for c in chunk])
        else:
            done += len(chunk)
        records = read_jsonl(final)
        entries[directory].append(
            {
                "file": final.relative_to(plan.out_dir).as_posix(),  # validation/shard-NNNNN.jsonl for the split
                "records": len(records),
                "sha256": sha256_file(final),
                "tokens": sum(len(s["input_ids"]) for r in records for s in r["samples"]),
            }
        )
        if on_progress is not None:
            on_progress(done, total, tokens)
    manifest = _manifest(
        recipe, plan, engine_info, entries[plan.out_dir], complete=True, validation_shards=entries[plan.validation_dir]
    )
    write_json_atomic(plan.out_dir / MANIFEST_NAME, recorded_tree(manifest))
    elapsed = time.perf_counter() - started
    summary.generated_tokens, summary.seconds = tokens, round(elapsed, 2)
    summary.tokens_per_second = round(tokens / elapsed, 1) if elapsed > 0 else None
    log.info(
        "datagen: %d conversations in %d shards (%d held out as validation) -> %s",
        total,
        len(shards),
        len(plan.validation),
        plan.out_dir,
    )
    return summary
