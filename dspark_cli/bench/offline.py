"""`dspark bench DRAFT_DIR --offline`: the reference engine over the bench datasets at every temperature.

    dspark bench runs/tiny/draft --offline                                  # recipe from the draft dir
    dspark bench runs/tiny/draft --offline bench.num_prompts=8 bench.max_tokens=64 bench.temperatures=[0.0]

    from dspark_cli.bench.offline import run_offline
    result = run_offline(recipe, "runs/tiny/draft")      # {"engine": {...}, "runs": [...], "confidence_sweep": [...],
                                                         #  "baselines": [...], "context_sweep": [...], "adaptive_verification": {...}}
    results = run_offline_many(recipe, ["runs/a/draft", "dl/theirs"])   # one such dict per draft, the target loaded once

A draft is a dspark export or a published draft (no dspark_manifest.json: checked as one, its contract
from its config.json, export/published.py); either is checked for the recipe's target before any target
code or weights load (`check_draft`).

Prompts are rendered with the target's chat template and `target.chat_template_kwargs` (`ChatFormat`,
exactly as datagen and vLLM's chat endpoint render them); multi-turn conversations are answered turn
by turn, each turn seeing the target's own earlier answers. `bench.batch_size` requests run at once
(batched.py; 1: the sequential engine), turn t of every conversation together; the same tokens and tau
request for request either way. Speculation uses the serving settings:
`serve.num_speculative_tokens` (default: the draft's block size), `serve.draft_sample_method`,
`serve.rejection_sample_method`. Every confidence threshold in `bench.confidence_thresholds` reruns
the datasets with confidence-scheduled verification (threshold 0 = verify every draft).

On the same prompts, `bench.baselines` reruns the engine with prompt-lookup drafting (`ngram`, vLLM's
`prompt_lookup_min/max`) and with the draft's architecture freshly initialised (`untrained`);
`bench.context_sweep` runs `bench.context_sweep_conversations` long conversations of the datasets'
prompts up to `target.max_model_len`, at the first temperature unless `bench.context_sweep_temperatures`
says otherwise (context.py). The main runs' recorded steps feed the calibration report
(calibration.py), the context bins and the model of vLLM's adaptive verification across concurrency
(adaptive.py, with `bench.cost_model`).
"""

from __future__ import annotations

import copy
import hashlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dspark_cli.bench.calibration import calibration
from dspark_cli.bench.datasets import BenchDataset, category, load_datasets
from dspark_cli.bench.stats import TurnStats, summarize
from dspark_cli.errors import UsageError
from dspark_cli.recipe import Recipe
from dspark_cli.targets import Target

if TYPE_CHECKING:
    from dspark_cli.artifacts.draft import LoadedDraft

log = logging.getLogger(__name__)
Progress = Callable[[int, int, int], None]  # (turns done, total turns, tokens generated)


def _seed(base: int, *parts: object) -> int:
    return int(hashlib.sha256(":".join(map(str, (base, *parts))).encode()).hexdigest()[:8], 16)


def template_warnings(manifest: dict[str, Any], template_hash: str) -> list[str]:
    """Warn when the chat template differs from training's, or is unknown (a published draft records none);
    a draft of another target is refused earlier, by `verify_draft`."""
    if manifest.get("published"):
        return [
            "a published draft (no dspark_manifest.json): trained with an unknown chat template and target; "
            "tau here holds for this target's template and target.chat_template_kwargs, and is lower where "
            "they differ from the draft's training data",
            *manifest.get("warnings", []),
        ]
    contract = manifest.get("contract") or {}
    warnings = []
    trained = contract.get("chat_template_sha256")
    if trained and trained != template_hash:
        warnings.append(
            "the chat template or target.chat_template_kwargs differ from the draft's training data: "
            "expect a lower tau than serving with the training settings"
        )
    return warnings


def check_draft(draft_dir: str | Path, target: str) -> dict[str, Any]:
    """The manifest of the draft in `draft_dir` once every check for `target` passes (`verify_draft`): a
    dspark export by its dspark_manifest.json, a published draft (none) by its own files; else one line."""
    from dspark_cli.errors import DataError
    from dspark_cli.export import is_published, verify_draft

    if not Path(draft_dir).is_dir():
        raise UsageError(f"draft directory not found: {draft_dir}", "export one with `dspark export`")
    try:
        return verify_draft(draft_dir, target, doing="not benchmarking it", published=True)
    except DataError as exc:
        if not is_published(draft_dir):
            raise
        raise DataError(  # a published draft records no target: the user names it, and may have named another
            exc.message,
            f"`dspark export --check {draft_dir}` lists every finding; a published draft is checked against the "
            f"target you name (--recipe R or target.model=...; now {target})",
        ) from None


@dataclass(frozen=True)
class BenchDraft:
    """The draft a bench run measures, read once: the manifest `verify_draft` passed, then its config and
    weights (`load_draft_dir`). The engine's drafter, the untrained baseline and the report's description
    all come from this one object; nothing reads the directory again."""

    directory: str
    manifest: dict[str, Any]  # dspark_manifest.json (a published draft's, built in memory), every check passed
    loaded: LoadedDraft  # config + state_dict as stored (on the meta device once the drafter is built)

    @classmethod
    def read(cls, draft_dir: str | Path, target: str, manifest: dict[str, Any] | None = None) -> BenchDraft:
        """Verify the draft for `target` (before any target code or weights are loaded: checksums, loader
        rules, and a manifest that agrees with config.json on the block size and the rest; `check_draft`),
        unless `manifest` is what that check already gave, then read it."""
        from dspark_cli.artifacts.draft import load_draft_dir

        manifest = manifest if manifest is not None else check_draft(draft_dir, target)
        return cls(str(draft_dir), manifest, load_draft_dir(draft_dir))

    @property
    def published(self) -> bool:
        return bool(self.manifest.get("published"))

    def baseline_key(self) -> str:
        """What the untrained baseline depends on: the draft's config and its tensors' names, shapes, dtypes."""
        config = self.loaded.config.to_json_string(use_diff=False)
        tensors = sorted((name, str(t.dtype), tuple(t.shape)) for name, t in self.loaded.state_dict.items())
        return hashlib.sha256(f"{config}{tensors!r}".encode()).hexdigest()

    def drop_weights(self) -> None:
        """Keep each stored tensor's shape and dtype (on the meta device), not its data: once the drafter is
        built, a second host copy of the weights (gigabytes for a production draft) serves nothing."""
        self.loaded.state_dict = {name: t.to("meta") for name, t in self.loaded.state_dict.items()}


class BenchTarget:
    """The recipe's target, loaded once for every draft a bench measures: its chat format (probed before the
    weights load: a broken or runaway template is refused first), the model, the stop ids. Each draft reads
    it through its own `HFTarget` (its layer ids), released when that draft is done."""

    def __init__(self, recipe: Recipe) -> None:
        from dspark_cli.targets import ChatFormat

        target = Target.of(recipe)
        self.chat = ChatFormat(target.tokenizer(), recipe.target.chat_template_kwargs)
        self.chat.probe()
        self.path = target.location
        self.model, _ = Target.named(
            self.path, revision=recipe.target.revision, trust_remote_code=recipe.target.trust_remote_code
        ).causal_lm(dtype=recipe.target.dtype)
        self.stop_ids = Target.stop_ids(self.chat.tokenizer, self.model.generation_config)

    def reader(self, layer_ids: list[int]):
        from dspark_cli.bench.engine import HFTarget

        return HFTarget(self.model, layer_ids)


class OfflineBench:
    """The target (shared: `BenchTarget`), tokenizer, chat format and drafter for one draft directory."""

    def __init__(
        self,
        recipe: Recipe,
        draft_dir: str | Path,
        *,
        manifest: dict[str, Any] | None = None,
        target: BenchTarget | None = None,
    ) -> None:
        from dspark_cli.bench.engine import DSparkDrafter
        from dspark_cli.export import speculative_tokens

        self.recipe = recipe
        # before any target code or weights are loaded: the draft's files, for this target
        self.draft = BenchDraft.read(draft_dir, recipe.target.model, manifest)
        self.draft_dir, self.manifest = self.draft.directory, self.draft.manifest
        config = self.draft.loaded.config  # its block_size is config.json's (`block_size_of`), as serve reads it
        self.num_speculative_tokens = speculative_tokens(int(config.block_size), recipe.serve.num_speculative_tokens)
        shared = target or BenchTarget(recipe)
        self.chat, self.target_path, self.stop_ids = shared.chat, shared.path, shared.stop_ids
        self.warnings = template_warnings(self.manifest, self.chat.template_hash)
        self.target = shared.reader(list(config.target_layer_ids))
        self.drafter = DSparkDrafter.from_loaded(self.draft.loaded, self.target, dtype=self.target.model.dtype)
        self.draft.drop_weights()  # the drafter holds its own copy; the untrained baseline needs shapes only

    def close(self) -> None:
        """Free the drafter and take this draft's hooks off the shared target."""
        self.target.release()
        self.drafter = None  # type: ignore[assignment]

    def describe(self) -> dict[str, Any]:
        import torch

        serve = self.recipe.serve
        return {
            "engine": "dspark reference (transformers target + DSpark draft)",
            "target": self.target_path,
            "draft_dir": self.draft_dir,
            "device": str(self.target.device),
            "dtype": str(self.target.model.dtype).removeprefix("torch."),
            "torch": torch.__version__,
            "num_speculative_tokens": self.num_speculative_tokens,
            "draft_sample_method": serve.draft_sample_method,
            "rejection_sample_method": serve.rejection_sample_method,
            "top_p": self.recipe.bench.top_p,
            "max_tokens": self.recipe.bench.max_tokens,
            "chat_template_kwargs": self.recipe.target.chat_template_kwargs,
            "chat_template_sha256": self.chat.template_hash,
            "has_confidence_head": self.drafter.has_confidence,
            "warnings": self.warnings,
            "prompt_lookup": f"{self.recipe.bench.prompt_lookup_min}/{self.recipe.bench.prompt_lookup_max}",
            "batch_size": self.recipe.bench.batch_size,
        }

    def engine(self, threshold: float, speculate: bool = True, *, batched: bool = True):
        """The engine at a confidence threshold (None drafter: plain decoding); batched unless
        `bench.batch_size` is 1 or `batched` is False."""
        from dspark_cli.bench.engine import Speculation

        if not speculate:
            return self._engine(None, None, batched)
        serve = self.recipe.serve
        spec = Speculation(
            self.num_speculative_tokens,
            serve.draft_sample_method,
            serve.rejection_sample_method,
            confidence_threshold=threshold,
        )
        return self._engine(self.drafter, spec, batched)

    def _engine(self, drafter: Any, spec: Any, batched: bool):
        from dspark_cli.bench.batched import BatchedEngine, batch_drafter
        from dspark_cli.bench.engine import SpeculativeEngine

        size = self.recipe.bench.batch_size
        if size == 1 or not batched:
            return SpeculativeEngine(self.target, drafter, spec)
        return BatchedEngine(
            self.target, batch_drafter(drafter) if drafter is not None else None, spec, batch_size=size
        )

    def baseline_engine(self, name: str):
        """The same engine with a baseline drafter: `ngram` (prompt lookup) or `untrained`."""
        from dspark_cli.bench.baselines import NgramDrafter, untrained_drafter
        from dspark_cli.bench.engine import Speculation

        serve, bench = self.recipe.serve, self.recipe.bench
        if name == "ngram":
            drafter = NgramDrafter(bench.prompt_lookup_min, bench.prompt_lookup_max, self.recipe.target.max_model_len)
        else:
            drafter = untrained_drafter(
                self.draft.loaded, self.target, seed=self.recipe.seed, dtype=self.target.model.dtype
            )
        spec = Speculation(self.num_speculative_tokens, serve.draft_sample_method, serve.rejection_sample_method)
        return self._engine(drafter, spec, True)

    def run_dataset(
        self, engine: Any, dataset: BenchDataset, temperature: float, on_turn: Callable[[int], None] | None = None
    ) -> list[TurnStats]:
        """Answer every turn of every conversation; one TurnStats per generated turn, conversation by
        conversation. Turn t of every conversation goes to the engine together (`generate_many`: the
        batched engine runs them at once), each seeing its own conversation's earlier answers."""
        histories = [[m for m in conv.messages if m["role"] == "system"][:1] for conv in dataset.conversations]
        turns: list[list[TurnStats]] = [[] for _ in dataset.conversations]
        alive = list(range(len(dataset.conversations)))
        index = 0
        while alive:
            asked = []
            for c in alive:
                conv = dataset.conversations[c]
                if index >= len(conv.user_turns):
                    continue
                prepared = self.prepare(histories[c], conv.user_turns[index], conv.id, index, temperature)
                if prepared is None:
                    log.warning("%s turn %d: the prompt does not fit target.max_model_len", conv.id, index)
                    continue
                asked.append((c, *prepared))
            outs = engine.generate_many([request for _, _, request in asked])
            for (c, messages, _), out in zip(asked, outs, strict=True):
                turn, histories[c] = self.finish(messages, out, category(dataset.conversations[c]))
                turns[c].append(turn)
                if on_turn is not None:
                    on_turn(turn.output_tokens)
            alive = [c for c, _, _ in asked]
            index += 1
        return [turn for conv_turns in turns for turn in conv_turns]

    def prepare(
        self, history: list[dict[str, str]], text: str, conv_id: str, index: int, temperature: float
    ) -> tuple[list[dict[str, str]], Any] | None:
        """One user turn after `history` -> (its messages, the engine Request), or None when the prompt
        does not fit `target.max_model_len`."""
        from dspark_cli.bench.engine import Request, Sampling

        bench = self.recipe.bench
        max_len = self.recipe.target.max_model_len
        messages = [*history, {"role": "user", "content": text}]
        prompt = self.chat.prompt_ids(messages)
        if len(prompt) >= max_len:
            return None
        sampling = Sampling(temperature, bench.top_p, bench.max_tokens, self.stop_ids, max_len)
        return messages, Request(prompt, sampling, _seed(self.recipe.seed, conv_id, index, temperature))

    def finish(self, messages: list[dict[str, str]], out: Any, group: str) -> tuple[TurnStats, list[dict[str, str]]]:
        """A generated turn -> (its stats, the messages with the answer)."""
        answer = self.chat.tokenizer.decode(out.token_ids, skip_special_tokens=True)
        turn = TurnStats(
            group, out.accepted, out.verified, len(out.token_ids), out.seconds, out.confidences, out.contexts
        )
        return turn, [*messages, {"role": "assistant", "content": answer}]

    def answer(
        self,
        engine: Any,
        history: list[dict[str, str]],
        text: str,
        conv_id: str,
        index: int,
        temperature: float,
        group: str,
    ) -> tuple[TurnStats, list[dict[str, str]]] | None:
        """One user turn after `history`, answered by the engine -> (its stats, the history with the answer),
        or None when the prompt does not fit `target.max_model_len`."""
        prepared = self.prepare(history, text, conv_id, index, temperature)
        if prepared is None:
            return None
        messages, request = prepared
        out = engine.generate(request.prompt_ids, request.sampling, seed=request.seed)
        return self.finish(messages, out, group)

    def run_chains(
        self,
        engine: Any,
        prompts: Iterator[tuple[str, str]],
        conversations: int,
        temperature: float,
        on_turn: Callable[[int], None] | None = None,
    ) -> tuple[list[TurnStats], dict[str, Any]]:
        """The context sweep: `conversations` long conversations, each fed the next prompts until one no
        longer fits target.max_model_len -> (one TurnStats per turn, what was run)."""
        turns, used, lengths = [], [], []
        prompts = iter(prompts)
        for number in range(conversations):
            history: list[dict[str, str]] = []
            count, full = 0, False
            for label, text in prompts:
                answered = self.answer(engine, history, text, f"chain-{number}", count, temperature, "context-sweep")
                if answered is None:  # full: this prompt is dropped, the next conversation starts afresh
                    full = True
                    break
                turn, history = answered
                turns.append(turn)
                used.append(label)
                count += 1
                if on_turn is not None:
                    on_turn(turn.output_tokens)
            if count:
                lengths.append(count)
            elif full:
                log.warning("context sweep: a prompt alone does not fit target.max_model_len; skipped")
            if not full:
                log.warning("context sweep: the bench datasets ran out of prompts in conversation %d", number + 1)
                break
        longest = max((c for t in turns for c in t.contexts), default=0)  # at an anchor, as binned
        return turns, {
            "datasets": list(dict.fromkeys(used)),
            "num_conversations": len(lengths),
            "turns_per_conversation": lengths,
            "longest_context": longest,
        }


def sweep_temperatures_for(recipe: Recipe) -> list[float]:
    """The context sweep's temperatures: `bench.context_sweep_temperatures`, else the first of
    `bench.temperatures` (none when the sweep is off)."""
    bench = recipe.bench
    if not bench.context_sweep:
        return []
    if bench.context_sweep_temperatures is not None:
        return list(bench.context_sweep_temperatures)
    return bench.temperatures[:1]


def thresholds_for(recipe: Recipe, has_confidence: bool) -> list[float]:
    """0 (verify everything: the main runs) first, then the sweep's thresholds."""
    if not has_confidence:
        if any(t > 0 for t in recipe.bench.confidence_thresholds):
            log.warning("the draft has no confidence head: skipping the confidence-threshold sweep")
        return [0.0]
    return sorted({0.0, *recipe.bench.confidence_thresholds})


def run_offline(
    recipe: Recipe,
    draft_dir: str | Path,
    *,
    manifest: dict[str, Any] | None = None,
    on_progress: Progress | None = None,
) -> dict[str, Any]:
    """Run the engine over every dataset x temperature x threshold, then the baselines and the context
    sweep; model vLLM's adaptive verification from the recorded steps. Returns everything for the report.
    `manifest`: what `check_draft` gave for this draft, when the caller checked it already."""
    return run_offline_many(recipe, [draft_dir], manifests=[manifest], on_progress=on_progress)[0]


class _Progress:
    """(turns done, total turns, tokens generated) across every draft of a bench."""

    def __init__(self, on_progress: Progress | None, total: int) -> None:
        self.on_progress, self.done, self.tokens, self.total = on_progress, 0, 0, total

    def turn(self, tokens: int) -> None:
        self.done += 1
        self.tokens += tokens
        self.total = max(self.total, self.done + 1)
        if self.on_progress is not None:
            self.on_progress(self.done, self.total, self.tokens)


def run_offline_many(
    recipe: Recipe,
    draft_dirs: list[str | Path],
    *,
    manifests: list[dict[str, Any] | None] | None = None,
    on_progress: Progress | None = None,
) -> list[dict[str, Any]]:
    """`run_offline` of each draft, in order, on the same prompts with the same seeds and settings: every
    draft checked for the recipe's target before any target code or weights load, the target loaded once.
    A baseline that depends on nothing of a draft but its block size (`ngram`) or its architecture
    (`untrained`) runs once for the drafts that share it."""
    from dspark_cli.bench.adaptive import load_cost_model

    cost = load_cost_model(recipe.bench.cost_model)  # a bad cost model is refused before any work
    given = manifests or [None] * len(draft_dirs)
    checked = [
        m if m is not None else check_draft(d, recipe.target.model) for d, m in zip(draft_dirs, given, strict=True)
    ]
    shared = BenchTarget(recipe)
    datasets = load_datasets(recipe.bench)
    max_len = recipe.target.max_model_len
    turns_per_pass = sum(len(c.user_turns) for d in datasets for c in d.conversations)
    # the sweep's turns are known only as it runs: a guess of 48 new tokens a turn until it is done
    sweep_guess = recipe.bench.context_sweep_conversations * -(-max_len // 48) * len(sweep_temperatures_for(recipe))
    passes = len(recipe.bench.temperatures) * (len(thresholds_for(recipe, True)) + len(set(recipe.bench.baselines)))
    progress = _Progress(on_progress, (turns_per_pass * passes + sweep_guess) * len(draft_dirs))
    cache: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    results = []
    for draft_dir, manifest in zip(draft_dirs, checked, strict=True):
        bench = OfflineBench(recipe, draft_dir, manifest=manifest, target=shared)
        try:
            results.append(_measure(recipe, bench, datasets, cost, progress, cache))
        finally:
            bench.close()
    if on_progress is not None and sweep_guess:
        on_progress(progress.done, progress.done, progress.tokens)
    return results


def _measure(
    recipe: Recipe,
    bench: OfflineBench,
    datasets: list[BenchDataset],
    cost: Any,
    progress: _Progress,
    cache: dict[tuple[str, ...], list[dict[str, Any]]],
) -> dict[str, Any]:
    """One draft's offline results (`run_offline`); `cache`: baselines already run, by what they depend on."""
    from dspark_cli.bench.context import bin_edges, by_context, drop_note, sweep_prompts

    thresholds = thresholds_for(recipe, bench.drafter.has_confidence)
    temperatures = recipe.bench.temperatures
    baselines = list(dict.fromkeys(recipe.bench.baselines))
    max_len = recipe.target.max_model_len
    sweep_temperatures = sweep_temperatures_for(recipe)
    on_turn = progress.turn
    runs, sweep, kept = [], [], {}
    n = bench.num_speculative_tokens
    edges = bin_edges(max_len)
    for dataset in datasets:
        for temperature in temperatures:
            for threshold in thresholds:
                turns = bench.run_dataset(bench.engine(threshold), dataset, temperature, on_turn)
                summary = summarize(turns, n)
                row = {"dataset": dataset.name, "temperature": temperature, "threshold": threshold, **summary}
                tau, verified = summary["tau"]["mean"], summary["verified_per_step"]
                sweep.append(
                    {
                        "dataset": dataset.name,
                        "temperature": temperature,
                        "threshold": threshold,
                        "tau": tau,
                        "tau_ci95": summary["tau"]["ci95"],
                        "verified_per_step": verified,
                        "drafts_per_step": summary["drafts_per_step"],
                        "tokens_per_verified": tau / verified if tau and verified else None,
                        "tokens_per_second": summary["tokens_per_second"],
                    }
                )
                if threshold == 0.0:
                    if bench.drafter.has_confidence:
                        row["calibration"] = calibration(turns, n)
                    row["by_context"] = by_context(turns, edges, n)
                    kept[(dataset.name, temperature)] = turns
                    runs.append(row)
                log.info(
                    "bench %s T=%g threshold %g: tau %.3f over %d steps",
                    dataset.name,
                    temperature,
                    threshold,
                    tau or float("nan"),
                    summary["num_steps"],
                )
    result: dict[str, Any] = {
        "engine": bench.describe(),
        "runs": runs,
        "confidence_sweep": sweep if len(thresholds) > 1 else [],
        "baselines": [],
        "context_sweep": [],
        "adaptive_verification": None,
    }
    for name in baselines:
        key = (name, str(n)) if name == "ngram" else (name, str(n), bench.draft.baseline_key())
        if key in cache:
            result["baselines"] += copy.deepcopy(cache[key])
            continue
        engine = bench.baseline_engine(name)
        first = len(result["baselines"])
        for dataset in datasets:
            for temperature in temperatures:
                turns = bench.run_dataset(engine, dataset, temperature, on_turn)
                summary = summarize(turns, n)
                result["baselines"].append(
                    {
                        "name": name,
                        "dataset": dataset.name,
                        "temperature": temperature,
                        "tau": summary["tau"],
                        "num_steps": summary["num_steps"],
                        "acceptance_per_position": summary["acceptance_per_position"],
                        "drafts_per_step": summary["drafts_per_step"],
                    }
                )
                log.info(
                    "bench baseline %s %s T=%g: tau %.3f",
                    name,
                    dataset.name,
                    temperature,
                    summary["tau"]["mean"] or float("nan"),
                )
        cache[key] = result["baselines"][first:]
    for temperature in sweep_temperatures:
        turns, ran = bench.run_chains(  # one conversation at a time: each starts where the last one stopped
            bench.engine(0.0, batched=False),
            sweep_prompts(recipe.bench),
            recipe.bench.context_sweep_conversations,
            temperature,
            on_turn,
        )
        bins = by_context(turns, edges, n)
        result["context_sweep"].append(
            {
                "dataset": "+".join(ran["datasets"]) + "-chained",
                "temperature": temperature,
                **ran,
                "num_turns": len(turns),
                "num_steps": sum(len(t.accepted) for t in turns),
                "output_tokens": sum(t.output_tokens for t in turns),
                "seconds": sum(t.seconds for t in turns),
                "max_model_len": max_len,
                "bins": bins,
                "note": drop_note(bins),
            }
        )
        log.info(
            "bench context sweep T=%g: %d conversations, %d turns, longest context %d of %d",
            temperature,
            ran["num_conversations"],
            len(turns),
            ran["longest_context"],
            max_len,
        )
    if bench.drafter.has_confidence:
        result["adaptive_verification"] = adaptive_model(recipe, cost, kept, n)
    return result


def adaptive_model(recipe: Recipe, cost: Any, kept: dict[tuple[str, float], list[TurnStats]], n: int) -> dict[str, Any]:
    """vLLM's adaptive verification against fixed-k across concurrency, from the main runs' steps (adaptive.py)."""
    from dspark_cli.bench.adaptive import model_concurrency

    runs = [
        {
            "dataset": dataset,
            "temperature": temperature,
            "levels": model_concurrency(
                turns, n, cost, levels=sorted(set(recipe.bench.model_concurrency)), seed=recipe.seed
            ),
        }
        for (dataset, temperature), turns in kept.items()
    ]
    return {"cost_model": cost.describe(), "runs": [r for r in runs if r["levels"]]}
