"""One training session on this process: build the draft, resume, run the loop, write the outputs.

Called by `run.run_train` once the data source and the contract are known:

    run = TrainRun(recipe, env=env, draft_config=..., contract=..., out_dir=..., resume="auto",
                   sequences=lambda: captured)
    summary = train_session(run, on_log=print)

Outputs (rank 0 writes; see the package docstring for the layout): recipe.yaml and metrics.jsonl
as it goes, checkpoints every `train.checkpoint_every` steps, and at the end `final/` (the
consolidated draft: model.safetensors in vLLM names + config.json) and manifest.json. With a
validation split (`validation=`), a `validation` record every `train.validate_every` steps and
`best/` (the form of `final/`, plus validation.json) whenever the validation metric improves
(training/validation.py); `train.early_stop_patience` can end the run early.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from dspark_cli import __version__
from dspark_cli.artifacts.files import make_public, sha256_file, write_json_atomic
from dspark_cli.artifacts.results import StreamSummary, TrainSummary
from dspark_cli.artifacts.train import BEST_DIR, BEST_RECORD, DRAFT_WEIGHTS
from dspark_cli.contract import Contract
from dspark_cli.errors import DataError, UsageError
from dspark_cli.recipe import Recipe, recorded_tree, write_resolved
from dspark_cli.targets import Target
from dspark_cli.training.checkpoint import check_meta, clean_stale, load_checkpoint, resolve_resume, save_checkpoint
from dspark_cli.training.data import StepStream, prepare
from dspark_cli.training.distributed import DistEnv, barrier, shard
from dspark_cli.training.flops import peak_flops
from dspark_cli.training.loop import LoopConfig, train_loop
from dspark_cli.training.metrics import format_line, open_sinks
from dspark_cli.training.plan import plan_run
from dspark_cli.training.settings import result_settings
from dspark_cli.training.step import LossConfig, TrainStep
from dspark_cli.training.validation import ValidationState, Validator, kept_best, load_validation

if TYPE_CHECKING:
    from dspark_cli.draft.config import DSparkDraftConfig
    from dspark_cli.training.stream_source import OnlineSource
    from dspark_cli.training.warm_start import WarmStart

log = logging.getLogger(__name__)


@dataclass
class TrainRun:
    """What makes one training session on this process (`run.run_train` builds it).

    The data is either `sequences` (captured sequences, offline or given directly) or `stream` (the
    online stream's rank side), never both.
    """

    recipe: Recipe
    env: DistEnv  # this process: rank, world size, device
    draft_config: DSparkDraftConfig  # the draft to build, its geometry resolved against the target
    contract: Contract  # what the draft reads (target, layer ids, mask token, block size); checked on resume
    out_dir: Path  # the train directory (`recipe.stage_dir("train")`)
    resume: str = "auto"  # `auto` (the latest checkpoint, if any), `never`, or a checkpoint path
    # a fresh iterable of CapturedSequence-like objects per call, the same order every time
    sequences: Callable[[], Iterable[Any]] | None = None
    # the prepared sequence lengths without reading hidden states, to plan an epochs-based run
    # (None: one pass over `sequences()`)
    lengths: Callable[[], list[int]] | None = None
    # the data's identity (the capture fingerprint): a checkpoint made from other data or settings is refused
    data_id: str | None = None
    # online (training/stream_source.py): its plan fixes the steps, it yields this rank's share of each,
    # and shards are released after each checkpoint
    stream: OnlineSource | None = None
    # the validation split (CapturedSequence-like objects, every rank the same list); None or empty: none
    validation: Callable[[], Sequence[Any]] | None = None

    def __post_init__(self) -> None:
        assert (self.sequences is None) != (self.stream is None), "a session reads sequences or the stream"


def build_step_module(
    recipe: Recipe,
    draft_config: Any,
    env: DistEnv,
    embed_dtype: torch.dtype,
    *,
    embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
    warm: WarmStart | None = None,
) -> TrainStep:
    """The seeded draft with the target's frozen embed_tokens / lm_head (the recipe's target's, or
    `embeddings` given directly, e.g. synthetic ones for benchmarks), its objective, on `env`'s device,
    with the run's fixed batch shapes (`TrainStep.shape_plan`). `embed_dtype` is the compute dtype:
    bf16 also makes FSDP2 gather the parameters in bf16 (`distributed.shard`). `warm` (`train.init:
    pretrained`) replaces the draft's weights before FSDP2 shards them, so every rank starts from them."""
    from dspark_cli.draft.model import DSparkDraftModel
    from dspark_cli.training.shapes import shape_plan

    train = recipe.train
    torch.manual_seed(train.seed)
    model = DSparkDraftModel(draft_config, attn_impl=recipe.draft.attention)
    model.init_weights(generator=torch.Generator().manual_seed(train.seed))
    embed, lm_head = embeddings or Target.of(recipe).embeddings(embed_dtype)
    model.set_target_embeddings(embed, lm_head)
    if train.init == "target":  # synthetic `embeddings` come without a target: its norm is then left at 1
        model.init_from_target(None if embeddings else Target.of(recipe).final_norm())
    if warm is not None:
        warm.apply(model)
    step = TrainStep(
        model,
        LossConfig.of(train.loss),
        compile=train.compile,
        shapes=shape_plan(train, draft_config.block_size, env.device),
    )
    return shard(step.to(env.device), env, param_dtype=embed_dtype)


def lr_groups(module: torch.nn.Module, scales: dict[str, float]) -> list[dict[str, Any]]:
    """AdamW parameter groups for `train.lr_scale`: one per multiplier, in the order the parameters come,
    each with its `lr_scale` (the loop sets a group's lr to lr_scale x the schedule's). A parameter takes
    the multiplier of the most specific module name above it, else 1. A name that is not a module of the
    draft is a UsageError naming the draft's top-level modules."""
    draft = getattr(module, "draft", module)
    modules = {name for name, _ in draft.named_modules() if name}
    unknown = sorted(k for k in scales if k not in modules)
    if unknown:
        top = ", ".join(name for name, _ in draft.named_children())
        raise UsageError(
            f"train.lr_scale: {', '.join(unknown)} is not a module of the draft",
            f"name one of its modules, dotted: {top} (or deeper, e.g. layers.0.mlp)",
        )
    groups: dict[float, list[torch.nn.Parameter]] = {}
    for name, param in draft.named_parameters():
        if not param.requires_grad:
            continue
        above = [k for k in scales if name.startswith(k + ".")]
        scale = scales[max(above, key=len)] if above else 1.0
        groups.setdefault(scale, []).append(param)
    if sum(map(len, groups.values())) != sum(1 for p in module.parameters() if p.requires_grad):
        raise AssertionError("lr_groups: the module trains parameters outside its draft")
    return [{"params": params, "lr_scale": scale} for scale, params in groups.items()]


def make_optimizer(module: torch.nn.Module, recipe: Recipe, env: DistEnv) -> torch.optim.Optimizer:
    train = recipe.train
    params: list[Any] = [p for p in module.parameters() if p.requires_grad]
    if train.lr_scale:
        params = lr_groups(module, train.lr_scale)
    # fused: one kernel per parameter instead of a dozen foreach passes, which on FSDP2's DTensor
    # parameters are a dozen DTensor dispatches (benchmarks/train_speed.py). The same implementation
    # for 1 and N processes.
    return torch.optim.AdamW(
        params, lr=train.lr, betas=(train.betas[0], train.betas[1]), weight_decay=train.weight_decay, fused=True
    )


def count_lengths(sequences: Callable[[], Iterable[Any]], recipe: Recipe) -> list[int]:
    train = recipe.train
    return [
        e.num_tokens
        for i, s in enumerate(sequences())
        if (e := prepare(s, epoch=0, index=i, seed=train.seed, num_anchors=1, max_seq_len=train.max_seq_len))
    ]


def write_final(
    module: TrainStep,
    draft_config: Any,
    out_dir: Path,
    env: DistEnv,
    *,
    name: str = "final",
    selection: dict[str, Any] | None = None,
) -> dict[str, str] | None:
    """<name>/model.safetensors (vLLM names, fp32) + <name>/config.json (`best/`: also validation.json, the
    `selection` record), written atomically on rank 0 (every rank gathers). Returns the files' sha256."""
    from safetensors.torch import save_file
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    from dspark_cli.draft.config import vllm_config_dict

    state = get_model_state_dict(module.draft, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if not env.is_main:
        return None
    from safetensors import SafetensorError

    from dspark_cli.training.integrity import checkpoint_errors

    final = out_dir / name
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=out_dir))
    try:
        with checkpoint_errors("save", final):  # a full disk: one line, as for a checkpoint
            try:
                make_public(tmp)
                save_file(
                    {k: v.detach().cpu().contiguous() for k, v in state.items()},
                    str(tmp / "model.safetensors"),
                    metadata={"format": "pt", "dspark": __version__},
                )
            except SafetensorError as exc:  # its I/O errors are not OSErrors
                raise OSError(str(exc)) from None
            make_public(tmp / "model.safetensors")
            write_json_atomic(tmp / "config.json", vllm_config_dict(draft_config, "float32"))
            if selection is not None:
                write_json_atomic(tmp / BEST_RECORD, selection)
            if final.exists():
                shutil.rmtree(final)
            os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return {file: sha256_file(final / file) for file in DRAFT_WEIGHTS}


def train_session(run: TrainRun, *, on_log: Callable[[dict[str, Any]], None] | None = None) -> TrainSummary:
    """Train `run` to its end; `on_log(record)` gets each logged step on rank 0. Returns the summary,
    also written to manifest.json with the final draft (rank 0)."""
    recipe, env, draft_config, contract, out_dir = run.recipe, run.env, run.draft_config, run.contract, run.out_dir
    online, sequences = run.stream, run.sequences
    train = recipe.train
    started = time.time()
    bf16 = train.precision == "bf16" or (train.precision == "auto" and env.device.type == "cuda")
    dtype = torch.bfloat16 if bf16 else torch.float32
    if env.is_main and (stale := clean_stale(out_dir)):
        log.info("removed temp files of an interrupted run: %s", ", ".join(stale))
    checkpoint_path = resolve_resume(out_dir, run.resume)
    if env.is_main and checkpoint_path is None:  # a fresh run: an earlier run's best is not this one's
        shutil.rmtree(out_dir / BEST_DIR, ignore_errors=True)
    settings = result_settings(recipe, run.data_id)
    barrier(env)
    warm, init = None, {"kind": train.init}
    if train.init == "pretrained" and checkpoint_path is None:  # a resumed run takes its checkpoint's weights
        from dspark_cli.training.warm_start import load_warm_start

        warm = load_warm_start(recipe, draft_config, out_dir)
        init = warm.record
    module = build_step_module(recipe, draft_config, env, dtype, warm=warm)
    del warm  # the source's tensors: the model holds its own copy
    optimizer = make_optimizer(module, recipe, env)
    start_step, position, tokens_done, meta = 0, {"epoch": 0, "consumed": 0}, 0, {}
    if checkpoint_path is not None:
        meta = load_checkpoint(
            env, checkpoint_path, module=module, optimizer=optimizer, contract=contract, settings=settings
        )
        start_step, position, tokens_done = meta["step"], meta["position"], meta.get("tokens", 0)
        init = meta.get("init") or init  # where the first session's weights came from
        log.info("resumed from %s (step %d)", checkpoint_path, start_step)
    best = ValidationState.from_dict(meta.get("validation"))  # the best so far and the patience count

    seq_lengths = None
    if online is not None:
        num_steps = online.num_steps
    elif train.max_steps:
        num_steps = train.max_steps
    else:
        assert sequences is not None
        seq_lengths = run.lengths() if run.lengths is not None else count_lengths(sequences, recipe)
        num_steps = plan_run(
            lengths=seq_lengths,
            tokens_per_step=train.tokens_per_step,
            epochs=train.epochs,
            max_steps=None,
            world_size=env.world_size,
            seed=train.seed,
        ).num_steps
    if checkpoint_path is not None:
        check_meta(meta, checkpoint_path, num_steps)  # a step past the run would end it at once, "finished"
    if num_steps == 0:
        raise DataError(
            "no trainable sequences: every captured sequence lacks loss-masked tokens with target states",
            "check datagen's loss masks and the capture output",
        )
    if env.is_main:
        out_dir.mkdir(parents=True, exist_ok=True)
        write_resolved(recipe, out_dir)
        sinks = open_sinks(
            list(train.metrics),
            out_dir,
            resume_step=start_step,
            run_name=recipe.name,
            project=train.wandb_project,
            config=recorded_tree(recipe.model_dump(mode="json")),
        )

    def on_record(record: dict[str, Any]) -> None:
        if env.is_main:
            sinks.write(record)
            log.info(format_line(record))
            if on_log is not None:
                on_log(record)

    def on_checkpoint(step: int, pos: dict[str, int], record: dict[str, Any] | None, tokens: int) -> None:
        save_checkpoint(
            env,
            out_dir,
            step=step,
            module=module,
            optimizer=optimizer,
            recipe=recipe,
            meta={
                "num_steps": num_steps,
                "position": pos,
                "tokens": tokens,
                "contract": contract.to_dict(),
                "settings": settings,
                "init": init,
                "metrics": record,
                "validation": best.to_dict(),
                "time": time.time(),
            },
        )
        if online is not None:  # the checkpoint covers these steps: their shards can go
            online.after_checkpoint(step)

    validator = None
    if (share := load_validation(run.validation, env, train.max_seq_len)) is not None:
        validator = Validator(
            train,
            *share,
            env=env,
            state=best,
            num_steps=num_steps,
            data_dtype=dtype,
            autocast_dtype=torch.bfloat16 if bf16 else None,
            write_best=lambda step, chosen: write_final(
                module, draft_config, out_dir, env, name=BEST_DIR, selection=chosen
            ),
            log=on_record,
        )
    if best.stopped_at is not None:  # resuming a run that stopped early: nothing left to train
        steps: Iterator[Any] = iter(())
    elif online is not None:
        steps = online.steps(start_step, position)
    else:
        assert sequences is not None
        steps = iter(
            StepStream(
                sequences,
                seed=train.seed,
                num_anchors=train.num_anchors,
                max_seq_len=train.max_seq_len,
                tokens_per_step=train.tokens_per_step,
                world_size=env.world_size,
                epochs=None if train.max_steps else train.epochs,
                num_items_per_epoch=len(seq_lengths) if seq_lengths else None,
                start=position,
            )
        )
    cfg = LoopConfig(
        num_steps=num_steps,
        lr=train.lr,
        min_lr_ratio=train.min_lr_ratio,
        warmup_steps=train.warmup_steps,
        grad_clip=train.grad_clip,
        log_every=train.log_every,
        checkpoint_every=train.checkpoint_every,
        validate_every=train.validate_every or train.checkpoint_every,
        block_size=draft_config.block_size,
        loss=module.loss_config,
        data_dtype=dtype,
        autocast_dtype=torch.bfloat16 if bf16 else None,
        peak_flops=peak_flops(env.device, dtype),
        shapes=module.shape_plan,
    )
    try:
        result = train_loop(
            env=env,
            module=module,
            optimizer=optimizer,
            steps=steps,
            start_step=start_step,
            cfg=cfg,
            log=on_record,
            checkpoint=on_checkpoint,
            tokens_done=tokens_done,
            validate=(lambda step: validator(module, step)) if validator is not None else None,
        )
    finally:
        if env.is_main:
            sinks.close()
    files = write_final(module, draft_config, out_dir, env)
    chosen = kept_best(out_dir, best, train, env) if validator is not None else None
    summary = TrainSummary(
        output_dir=str(out_dir),
        steps=result["step"],
        num_steps=num_steps,
        resumed_from=str(checkpoint_path) if checkpoint_path else None,
        tokens=result["tokens"],
        world_size=env.world_size,
        final_metrics=result["record"] or meta.get("metrics"),
        wall_s=round(time.time() - started, 1),
        shapes=result["shapes"],
        final=str(out_dir / "final"),
        best=chosen,
        stopped={"reason": "early", "step": best.stopped_at} if best.stopped_at is not None else None,
    )
    if online is not None:
        summary.stream = stream = StreamSummary.from_dict(online.finish(result["step"]))
        if env.is_main:
            log.info(
                "stream %s: peak %d bytes (%d shards at most, bound %d)",
                stream.location,
                stream.peak_bytes,
                stream.peak_shards,
                stream.max_shards,
            )
    if env.is_main:
        write_json_atomic(
            out_dir / "manifest.json",
            {
                "kind": "dspark.train",
                "format_version": 1,
                "dspark": __version__,
                "complete": True,
                "contract": contract.to_dict(),
                "settings": settings,
                "init": init,
                "summary": summary.to_dict(),
                "recipe": recorded_tree(recipe.model_dump(mode="json")),
                "best": chosen,
                "stopped": summary.stopped,
                "files": {
                    **{f"final/{name}": digest for name, digest in (files or {}).items()},
                    **(
                        {f"{BEST_DIR}/{n}": sha256_file(out_dir / BEST_DIR / n) for n in DRAFT_WEIGHTS}
                        if chosen
                        else {}
                    ),
                },
            },
        )
    barrier(env)
    return summary
