"""`run_train(recipe)`: training on this process -- data, draft, FSDP2 loop, checkpoints, outputs -- as
one process or one torchrun rank; `plan_train` for `--dry-run`. The commands call `training.train`
(launch.py), which captures first and runs this here or in each rank.

    from dspark_cli.recipe import load_recipe
    from dspark_cli.training.run import run_train, plan_train
    plan_train(load_recipe("tiny"))                  # steps / tokens / sequences (reads the data once)
    recipe = load_recipe("tiny", ["train.max_steps=20"])
    ensure_capture(recipe)                           # from dspark_cli.capture: the stage before training
    run_train(recipe, resume="auto")

    torchrun --standalone --nproc-per-node 2 -m dspark_cli.training tiny   # a rank each runs run_train

Data: offline, the finished capture directory (`recipe.stage_dir("capture")`; the capture stage
runs before training, in the launching process); online, the stream `capture.stream` (default
`<capture dir>-stream`) that `capture.workers` producers fill (started here on rank 0, or elsewhere
with `capture.external_producers`), read by every rank in a step plan fixed up front (training/stream_source.py).
`sequences=` bypasses capture (tests, benchmarks): a callable returning an iterable of
CapturedSequence-like objects, the same order on every call; `validation=` then gives the validation split
the same way (none without it). Otherwise the split is capture's `<capture dir>/validation/` (online: read
through the stream's reader), from `training.validation_data.validation_sequences`; empty: no validation.

SIGTERM (torchrun passing on the launcher's, a scheduler's) ends a run as Ctrl-C does: KeyboardInterrupt,
so the stream's producers are stopped and the locks let go on the way out; the next run resumes from the
last checkpoint.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from dspark_cli.artifacts.results import TrainDryRun, TrainSummary
from dspark_cli.contract import Contract
from dspark_cli.errors import UsageError
from dspark_cli.recipe import Recipe
from dspark_cli.targets import Target

log = logging.getLogger(__name__)


def build_draft_config(recipe: Recipe, layer_ids: list[int]):
    """The draft the recipe describes, its geometry defaulting to the target's, reading `layer_ids`."""
    from dspark_cli.draft.build import draft_config_from_recipe

    target = Target.of(recipe)
    draft = recipe.draft.model_dump()
    draft["target_layer_ids"] = layer_ids  # capture's resolution, so the draft reads what was captured
    draft["mask_token_id"] = target.mask_token_id(recipe.draft.mask_token_id)
    return draft_config_from_recipe(draft, recipe.target.model_dump(), target_config=target.snapshot_config())


def train_contract(recipe: Recipe, draft_config) -> Contract:
    from dspark_cli.capture import contract_for_recipe

    base = contract_for_recipe(recipe)
    return dataclasses.replace(base, mask_token_id=draft_config.mask_token_id, block_size=draft_config.block_size)


def _offline_source(recipe: Recipe, contract: Contract, env) -> tuple[Callable[[], Iterable[Any]], str | None]:
    """The capture output as a sequence source, and its fingerprint (the data's identity).

    Capture is its own stage, run before training by the launching process (`dspark train`, `dspark
    run`: `capture.ensure_capture`), never inside a rank, whose peers would wait for it in a
    collective: an incomplete capture here is a one-line error. A complete capture made with other
    capture settings is refused rather than trained on."""
    from dspark_cli.artifacts.capture import read_capture
    from dspark_cli.capture import capture_pending, iter_captured
    from dspark_cli.errors import DataError

    directory = Path(recipe.stage_dir("capture"))
    pending = capture_pending(recipe)
    if pending is not None:
        raise DataError(
            f"{directory}: the capture output is {pending}; training reads a finished capture",
            "run `dspark train RECIPE` or `dspark run RECIPE`: both run the capture stage first",
        )
    manifest = read_capture(directory)
    _check_capture_settings(recipe, directory, manifest)
    expect = dataclasses.replace(contract, mask_token_id=None, block_size=None)
    return (lambda: iter_captured(directory, expect=expect)), manifest.get("fingerprint")


def _check_capture_settings(recipe: Recipe, directory: Path, manifest: dict[str, Any]) -> None:
    """A finished capture is only reused for the capture settings that made it (its manifest says)."""
    capture = recipe.capture
    for key, made in (("max_seq_len", manifest.get("max_seq_len")), ("shard_tokens", manifest.get("shard_tokens"))):
        if made is not None and made != getattr(capture, key):
            raise UsageError(
                f"{directory} holds capture output made with capture.{key}={made} (this recipe: "
                f"{getattr(capture, key)})",
                f"set capture.{key}={made}, or capture again into a new "
                "directory (capture.output_dir=DIR, or a new output_dir)",
            )


def _validation_source(recipe: Recipe, contract: Contract, stream: Callable[[], Any]) -> Callable[[], Sequence[Any]]:
    """The validation split as capture wrote it (`<capture dir>/validation/`; online, read through the
    stream's reader): `training.validation_data.validation_sequences`, read when the session starts."""

    def read() -> Sequence[Any]:
        from dspark_cli.training.validation_data import validation_sequences

        online = stream()
        return validation_sequences(recipe, contract, online_reader=online.reader if online is not None else None)

    return read


def _online_source(recipe: Recipe, out_dir: Path, env, contract: Contract):
    """The online stream for this rank (training/stream_source.py): the step plan from the datagen lengths,
    the stream `capture.stream` (default `<capture dir>-stream`), and on rank 0 the producers'
    supervisor unless `capture.external_producers`. Every rank of any world size reads its own share."""
    from dspark_cli.training.stream_source import OnlineSource

    return OnlineSource(recipe, env=env, out_dir=out_dir, contract=contract)


def plan_train(recipe: Recipe, *, world_size: int | None = None) -> TrainDryRun:
    """The dry-run plan: steps, tokens per step, sequences; exact when the capture exists, else estimated."""
    from dspark_cli.capture import plan_capture
    from dspark_cli.training.plan import plan_run

    capture = plan_capture(recipe)
    train = recipe.train
    world = world_size or train.nproc_per_node * train.nnodes
    out = TrainDryRun(
        output_dir=recipe.stage_dir("train"),
        world_size=world,
        tokens_per_step=train.tokens_per_step,
        num_anchors=train.num_anchors,
        block_size=recipe.draft.block_size,
        capture_mode=capture["mode"],
        capture_bytes=capture.get("total_bytes"),
        exact=False,
    )
    lengths = None
    directory = Path(recipe.stage_dir("capture"))
    if recipe.capture.mode == "online" and capture.get("datagen_ready"):
        from dspark_cli.capture import build_plan
        from dspark_cli.training.stream_source import plan_online

        keep = recipe.capture.keep_max_bytes is not None
        plan = plan_online(
            build_plan(recipe),
            max_seq_len=train.max_seq_len,
            tokens_per_step=train.tokens_per_step,
            world_size=world,
            seed=train.seed,
            epochs=train.epochs if keep else 1.0,
            max_steps=train.max_steps,
            keep=keep,
        )
        return dataclasses.replace(
            out,
            num_steps=len(plan.steps),
            num_sequences=plan.consumed(len(plan.steps)),
            num_tokens=sum(i.num_tokens for step in plan.steps for rank in step for i in rank),
            stream_shards_needed=plan.required_shards(),
            exact=True,
        )
    if (directory / "manifest.json").is_file():
        from dspark_cli.capture import captured_lengths

        try:
            lengths = captured_lengths(directory, train.max_seq_len)
        except Exception as exc:  # noqa: BLE001 - an incomplete capture: fall back to the estimate
            log.info("capture not readable yet (%s); estimating", exc)
    if lengths is not None:
        run = plan_run(
            lengths=lengths,
            tokens_per_step=train.tokens_per_step,
            epochs=train.epochs,
            max_steps=train.max_steps,
            world_size=world,
            seed=train.seed,
        )
        return dataclasses.replace(
            out,
            num_steps=run.num_steps,
            num_sequences=run.num_sequences,
            num_tokens=run.num_tokens,
            sequences_per_step=run.sequences_per_step,
            exact=True,
        )
    tokens, seqs = capture.get("tokens"), capture.get("sequences")
    steps = train.max_steps
    if steps is None and tokens:
        steps = int(train.epochs * tokens // train.tokens_per_step)
    return dataclasses.replace(out, num_steps=steps, num_sequences=seqs, num_tokens=tokens)


def run_train(
    recipe: Recipe,
    *,
    resume: str = "auto",
    on_log: Callable[[dict[str, Any]], None] | None = None,
    sequences: Callable[[], Iterable[Any]] | None = None,
    validation: Callable[[], Sequence[Any]] | None = None,
) -> TrainSummary:
    """Train the draft the recipe describes; returns the summary also written to manifest.json (rank 0).
    `on_log(record)` gets each training step's record and each validation's (`kind: validation`)."""
    from dspark_cli.machine.procs import sigterm_interrupts

    with sigterm_interrupts():
        return _run_train(recipe, resume=resume, on_log=on_log, sequences=sequences, validation=validation)


def _run_train(
    recipe: Recipe,
    *,
    resume: str,
    on_log: Callable[[dict[str, Any]], None] | None,
    sequences: Callable[[], Iterable[Any]] | None,
    validation: Callable[[], Sequence[Any]] | None = None,
) -> TrainSummary:
    from dspark_cli.capture import resolve_layer_ids
    from dspark_cli.training.distributed import init_distributed, shutdown

    if recipe.capture.mode == "online" or recipe.train.devices:
        from dspark_cli.machine.devices import apply_default_split, narrow_train_devices, visible_gpus

        # the default split for ranks a user's torchrun started (the launcher has set it otherwise), counted
        # before this process narrows its devices
        if recipe.capture.mode == "online" and "DSPARK_ALL_DEVICES" not in os.environ:
            apply_default_split(recipe, visible_gpus())
        narrow_train_devices(recipe)  # before CUDA starts: this machine's ranks on train.devices
    env = init_distributed()
    if env.device.type == "cpu":
        from dspark_cli.machine.cpu import keep_freed_memory

        keep_freed_memory()
    stack = contextlib.ExitStack()
    failed = True
    try:
        layer_ids = resolve_layer_ids(recipe, Target.of(recipe).geometry().num_hidden_layers)
        draft_config = build_draft_config(recipe, layer_ids)
        contract = train_contract(recipe, draft_config)
        out_dir = Path(recipe.stage_dir("train"))
        if env.is_main:  # one run writes a train directory (another's temp files are not a killed run's)
            from dspark_cli.artifacts.files import exclusive_output

            stack.enter_context(exclusive_output(out_dir, "train.output_dir", kind="dspark.train"))
        stream = lengths = data_id = None
        if sequences is None:
            validation = _validation_source(recipe, contract, lambda: stream)
        if sequences is None and recipe.capture.mode == "online":
            stream = _online_source(recipe, out_dir, env, contract)
            data_id = stream.reader.fingerprint
        elif sequences is None:
            from dspark_cli.capture import captured_lengths

            sequences, data_id = _offline_source(recipe, contract, env)
            lengths = lambda: captured_lengths(recipe.stage_dir("capture"), recipe.train.max_seq_len)  # noqa: E731
        try:
            from dspark_cli.training.session import TrainRun, train_session

            run = TrainRun(
                recipe,
                env,
                draft_config,
                contract,
                out_dir,
                resume=resume,
                sequences=sequences,
                lengths=lengths,
                data_id=data_id,
                stream=stream,
                validation=validation,
            )
            summary = train_session(run, on_log=on_log)
            failed = False
            return summary
        finally:
            if stream is not None:
                stream.close()
    finally:
        stack.close()
        shutdown(env, failed=failed)


def recipe_draft_config(recipe: Recipe) -> Any:
    """The draft the recipe trains, as training builds it (layer ids resolved against the target's depth)."""
    from dspark_cli.capture import resolve_layer_ids
    from dspark_cli.targets import Target

    depth = Target.of(recipe).geometry().num_hidden_layers
    assert depth is not None, "geometry() reads the target's depth or raises"
    return build_draft_config(recipe, resolve_layer_ids(recipe, depth))


def warm_start_mismatch(recipe: Recipe, source: str | os.PathLike[str]) -> str | None:
    """The geometry line of `geometry_mismatch` for the draft at `source` (its config.json only) against the
    recipe's draft, with what to do; None when they agree. What preflight asks once the draft itself passed
    its checks."""
    from dspark_cli.artifacts.draft import CONFIG, draft_config_from_vllm_dict
    from dspark_cli.recipe.bounded import read_json
    from dspark_cli.training.warm_start import MISMATCH_HINT, draft_weights_dir, geometry_mismatch

    directory = draft_weights_dir(Path(source))
    config = draft_config_from_vllm_dict(read_json(directory / CONFIG))
    problem = geometry_mismatch(config, recipe_draft_config(recipe), str(source))
    return f"{problem}; {MISMATCH_HINT}" if problem else None
