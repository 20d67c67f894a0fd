"""The GPU check: does dspark's training path run correctly on a CUDA GPU, and how fast, in one call.

On the GPU machine (two calls of the device tool, timeout_s 600 each, install included; the wheels come
from prepare.sh, run here first), the most valuable rows first:

    bash benchmarks/gpu/run.sh --sections throughput,numerics --time-limit 540   # call 1 -> $OUT/gpu_check.json
    bash benchmarks/gpu/run.sh --sections pipeline,fsdp --time-limit 540         # call 2

Here (CPU): `python benchmarks/gpu/check.py --out /tmp/gpu_check.json` runs the CPU halves and skips every
CUDA part with one line; `--smoke` runs each section's code at toy sizes on the CPU (what the tests do).

Sections, in this order (the most valuable first; `--sections` picks some), each in its own subprocess
under its share of the time among the sections asked for (so a hung compile or an out-of-memory kill
costs one section, and the results file is rewritten after every section):
1. throughput  the shipped trainer's step (`training.loop.train_step`) at the real draft sizes of the
               kimi-k3 and qwen3-8b templates (in that order) on synthetic target states, 50 steps:
               tokens/s, MFU against the measured bf16 matmul peak, peak memory after the warm-up steps
               (the FLOP-counted first step and the compiles excluded; the first step's own peak apart),
               distinct batch shapes, dynamo compiles.
2. numerics    a tiny MLA and a tiny GQA draft on the bundled targets, one batch: CUDA fp32 and bf16
               (flex attention, `train.compile` off and on) against the fp32 CPU path on the same
               weights: logits, loss, gradients. Tolerances are scaled by the error that bf16 autocast
               makes on the CPU on the same batch (`bf16_cpu` row), see `TOLERANCE`. Flex attention's
               forward also runs on the CPU (`fp32_cpu_flex_forward`: its backward is CUDA-only).
3. pipeline    `dspark run` on the tiny recipe with hf engines on the GPU and bf16 training (fewer
               prompts and steps than the shipped recipe, to fit): time per stage and tau.
4. fsdp        `dspark`'s trainer under torchrun with one process: FSDP2 over NCCL, a checkpoint save,
               a resume, and the resumed run's losses against an uninterrupted run's.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SECTIONS = ("throughput", "numerics", "pipeline", "fsdp")
THROUGHPUT_TEMPLATES = ("kimi-k3", "qwen3-8b")  # the flagship first
WARMUP_STEPS = 5  # throughput: steps left out of speed and memory (the FLOP-counted first one, compiles)
# Relative share of the time limit of each section, among the sections asked for (what one leaves
# over passes on to the next).
BUDGET = {"throughput": 0.45, "numerics": 0.25, "pipeline": 0.25, "fsdp": 0.2}
# Numerics tolerances. fp32 on CUDA vs fp32 on CPU differ only by summation order (and flex's kernel):
# a relative error of 1e-3 leaves two orders of magnitude above fp32 rounding through a few layers.
# bf16 (8-bit mantissa, unit roundoff 2^-8 = 3.9e-3) is judged against the error bf16 autocast makes
# on the CPU on the same batch and weights: CUDA's bf16 kernels may round differently but not worse
# than a few times that; the floors keep a near-zero CPU error from making the bound meaningless.
TOLERANCE = {
    "fp32_rel": 1e-3,
    "bf16_factor": 4.0,
    "bf16_floor": {"logits": 2e-2, "loss": 1e-2, "grad": 5e-2},
    "grad_cos_min_bf16": 0.99,
}


def log(message: str) -> None:
    print(f"gpu-check: {message}", file=sys.stderr, flush=True)


def emit(partial: dict[str, Any]) -> None:
    """A section's results so far (the driver keeps the last one, also when the section is killed)."""
    print("PARTIAL " + json.dumps(partial, default=str), flush=True)


def has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


# --------------------------------------------------------------------------------------------------
# 1. numerics
# --------------------------------------------------------------------------------------------------


def _tiny_setup(arch: str, overrides: tuple[str, ...] = ()):
    """(recipe, target_dir, draft_config) of the tiny recipe on the bundled target of `arch`."""
    from dspark_cli.capture.plan import resolve_layer_ids
    from dspark_cli.recipe import load_recipe
    from dspark_cli.targets import Target
    from dspark_cli.training.run import build_draft_config

    target = [] if arch == "mla" else ["target.model=tiny-gqa", "draft.arch=gqa"]
    recipe = load_recipe("tiny", [*target, *overrides])
    target_dir = Target.of(recipe).directory()
    layer_ids = resolve_layer_ids(recipe, Target.of(recipe).geometry().num_hidden_layers)
    return recipe, target_dir, build_draft_config(recipe, layer_ids)


def _synthetic_examples(config, num: int, lengths: list[int], num_anchors: int, seed: int = 0):
    """Captured-like training examples: random target states (bf16, as captured), responses loss-masked."""
    import torch

    from dspark_cli.capture.types import CapturedSequence
    from dspark_cli.training.data import prepare

    gen = torch.Generator().manual_seed(seed)
    features = config.target_hidden_size * len(config.target_layer_ids)
    out = []
    for i in range(num):
        length = lengths[i % len(lengths)]
        mask = torch.zeros(length, dtype=torch.bool)
        mask[length // 8 :] = True
        last = torch.randn(length, config.target_hidden_size, generator=gen).bfloat16()
        last[~mask] = 0
        seq = CapturedSequence(
            f"s/{i}",
            torch.randint(0, config.vocab_size - 1, (length,), generator=gen),
            mask,
            torch.randn(length, features, generator=gen).bfloat16(),
            last,
        )
        out.append(prepare(seq, epoch=0, index=i, seed=seed, num_anchors=num_anchors, max_seq_len=length))
    return out


def _forward_backward(arch: str, examples, device: str, dtype, attn: str, compile: bool):
    """(logits [S, V] fp32 on CPU, loss, {name: grad fp32 CPU}) of one micro-batch, from the trainer's
    seeded weights (`build_step_module`), with `draft.attention` and `train.compile` as given."""
    import torch

    from dspark_cli.training.data import collate
    from dspark_cli.training.distributed import DistEnv
    from dspark_cli.training.session import build_step_module
    from dspark_cli.training.step import local_weight, trainable_slots

    recipe, target_dir, config = _tiny_setup(arch, (f"draft.attention={attn}", f"train.compile={str(compile).lower()}"))
    step = build_step_module(recipe, config, DistEnv(0, 1, 0, torch.device(device)), dtype)
    model, loss_cfg = step.draft, recipe.train.loss
    batch = collate(examples, dtype).to(torch.device(device))
    ok = trainable_slots(batch, config.block_size)
    weight = local_weight(ok, loss_cfg.slot_decay_gamma)
    autocast = torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=dtype == torch.bfloat16)
    with autocast:
        loss, _ = step(batch, ok, weight)
    loss.backward()
    with torch.no_grad(), autocast:
        out = model(batch.aux, batch.input_ids, batch.anchors, seq_lens=batch.seq_lens, anchor_mask=batch.anchor_mask)
        logits = out.logits[out.valid].float().cpu()
    grads = {n: p.grad.detach().float().cpu() for n, p in model.named_parameters() if p.grad is not None}
    return logits, float(loss.detach()), grads


def _flex_forward_cpu(arch: str, examples, logits_ref) -> dict[str, Any]:
    """Flex attention's forward (compiled) on the CPU, the trainer's draft and batch, against the fp32 CPU
    path's logits: what of the CUDA path's attention runs without a GPU (PyTorch has no CPU flex backward)."""
    import torch

    from dspark_cli.training.data import collate
    from dspark_cli.training.distributed import DistEnv
    from dspark_cli.training.session import build_step_module

    recipe, target_dir, config = _tiny_setup(arch, ("draft.attention=flex",))
    step = build_step_module(recipe, config, DistEnv(0, 1, 0, torch.device("cpu")), torch.float32)
    batch = collate(examples, torch.float32)
    try:
        with torch.no_grad():
            out = step.draft(
                batch.aux, batch.input_ids, batch.anchors, seq_lens=batch.seq_lens, anchor_mask=batch.anchor_mask
            )
    except Exception as exc:  # noqa: BLE001 - a failing row is a result
        return {"status": f"error: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}"}
    rel = float((out.logits[out.valid].float() - logits_ref).abs().max() / logits_ref.abs().max())
    return {
        "logits_rel": rel,
        "bound": TOLERANCE["fp32_rel"],
        "status": "ok" if rel <= TOLERANCE["fp32_rel"] else "FAIL ['logits']",
    }


def _compare(ref, got) -> dict[str, float]:
    import torch

    logits_ref, loss_ref, grads_ref = ref
    logits, loss, grads = got
    flat_ref = torch.cat([grads_ref[n].flatten() for n in sorted(grads_ref)])
    flat = torch.cat([grads[n].flatten() for n in sorted(grads_ref)])
    cos = min(
        float(torch.nn.functional.cosine_similarity(grads[n].flatten(), grads_ref[n].flatten(), dim=0))
        for n in grads_ref
        if grads_ref[n].norm() > 0
    )
    return {
        "logits_rel": float((logits - logits_ref).abs().max() / logits_ref.abs().max()),
        "loss_rel": abs(loss - loss_ref) / abs(loss_ref),
        "grad_rel": float((flat - flat_ref).norm() / flat_ref.norm()),
        "grad_cos_min": cos,
        "loss": loss,
    }


def section_numerics(smoke: bool) -> dict[str, Any]:
    import torch

    out: dict[str, Any] = {"tolerance": TOLERANCE, "drafts": {}}
    cuda = has_cuda()
    if not cuda:
        log("numerics: no CUDA device: the CUDA rows are skipped (the CPU reference and bf16 calibration run)")
    failures = []
    for arch in ("mla", "gqa"):
        config = _tiny_setup(arch)[2]
        examples = _synthetic_examples(config, num=2, lengths=[96, 128] if not smoke else [40, 48], num_anchors=16)
        started = time.perf_counter()
        ref = _forward_backward(arch, examples, "cpu", torch.float32, "auto", False)
        rows: dict[str, Any] = {"fp32_cpu": {"loss": ref[1]}}
        bf16_cpu = _compare(ref, _forward_backward(arch, examples, "cpu", torch.bfloat16, "sdpa", False))
        rows["bf16_cpu"] = bf16_cpu
        rows["fp32_cpu_flex_forward"] = _flex_forward_cpu(arch, examples, ref[0])
        if rows["fp32_cpu_flex_forward"]["status"] != "ok":
            failures.append(f"{arch}/fp32_cpu_flex_forward: {rows['fp32_cpu_flex_forward']['status']}")
        variants = [
            ("fp32_cuda_flex", torch.float32, False),
            ("bf16_cuda_flex", torch.bfloat16, False),
            ("bf16_cuda_flex_compiled", torch.bfloat16, True),
        ]
        for name, dtype, compiled in variants:
            if not cuda:
                rows[name] = {"status": "skipped: no CUDA device"}
                continue
            try:
                row = _compare(ref, _forward_backward(arch, examples, "cuda", dtype, "flex", compiled))
            except Exception as exc:  # noqa: BLE001 - a failing variant is a result, the others still run
                rows[name] = {"status": f"error: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}"}
                failures.append(f"{arch}/{name}: {type(exc).__name__}")
                continue
            if dtype == torch.float32:
                bounds = {k: TOLERANCE["fp32_rel"] for k in ("logits", "loss", "grad")}
            else:
                bounds = {
                    k: max(TOLERANCE["bf16_factor"] * bf16_cpu[f"{k}_rel"], TOLERANCE["bf16_floor"][k])
                    for k in ("logits", "loss", "grad")
                }
            bad = [k for k in bounds if row[f"{k}_rel"] > bounds[k]]
            if dtype == torch.bfloat16 and row["grad_cos_min"] < TOLERANCE["grad_cos_min_bf16"]:
                bad.append("grad_cos_min")
            row.update(bounds={k: round(v, 6) for k, v in bounds.items()}, status="ok" if not bad else f"FAIL {bad}")
            failures += [f"{arch}/{name}: {k}" for k in bad]
            rows[name] = row
            out["drafts"][arch] = rows
            emit(out)
        rows["seconds"] = round(time.perf_counter() - started, 1)
        out["drafts"][arch] = rows
    out["status"] = "ok" if not failures else "FAIL: " + "; ".join(failures)
    if not cuda and not failures:
        out["status"] = "cpu only (CUDA rows skipped)"
    return out


# --------------------------------------------------------------------------------------------------
# 2. pipeline
# --------------------------------------------------------------------------------------------------


def section_pipeline(smoke: bool) -> dict[str, Any]:
    import yaml

    if not has_cuda() and not smoke:
        log("pipeline: no CUDA device: skipped")
        return {"status": "skipped: no CUDA device"}
    from dspark_cli.pipeline import run_pipeline
    from dspark_cli.preflight.shared import shared_problems
    from dspark_cli.recipe import load_recipe

    raw = yaml.safe_load((ROOT / "templates/recipes/tiny.yaml").read_text())
    work = Path(tempfile.mkdtemp(prefix="dspark-gpu-pipeline-"))
    raw["output_dir"] = str(work / "run")
    raw["train"]["precision"] = "auto"  # bf16 on CUDA
    raw["datagen"]["engine"] = "hf"  # the recipe's `auto` would take vLLM where installed; this stage checks hf on CUDA
    sizes = (4, 16, 2, 1) if smoke else (200, 256, 200, 10)  # prompts, datagen tokens, steps, bench prompts
    raw["datagen"]["sources"][0]["max_samples"], raw["datagen"]["max_tokens"] = sizes[0], sizes[1]
    raw["train"]["max_steps"], raw["bench"]["num_prompts"] = sizes[2], sizes[3]
    raw["train"]["checkpoint_every"] = max(sizes[2] // 2, 1)
    raw["train"]["warmup_steps"] = min(raw["train"]["warmup_steps"], sizes[2] // 2)
    if smoke:
        raw["bench"].update(max_tokens=8, temperatures=[0.0], context_sweep_conversations=1)  # as a rehearsal
        raw["train"].update(tokens_per_step=512, num_anchors=8)
    path = work / "recipe.yaml"
    path.write_text(yaml.safe_dump(raw))
    recipe = load_recipe(str(path), [])
    problems = shared_problems(recipe)
    if problems:
        return {"status": f"FAIL: recipe: {problems[0]}"}
    stages: dict[str, Any] = {}
    clock = {"t": time.perf_counter()}

    def on_stage(result) -> None:
        now = time.perf_counter()
        stages[result.name] = {"status": result.status, "seconds": round(now - clock["t"], 1)}
        emit({"stages": stages})
        clock["t"] = now
        log(f"pipeline: {result.name} {result.status} in {stages[result.name]['seconds']} s")

    results = run_pipeline(recipe, on_stage=on_stage)
    out: dict[str, Any] = {
        "stages": stages,
        "settings": dict(zip(("prompts", "datagen_max_tokens", "train_steps", "bench_prompts"), sizes)),
    }
    for result in results:
        if result.name == "train" and result.status == "done":  # a TrainSummary (dspark_cli/artifacts/results.py)
            final = result.outputs.final_metrics or {}
            out["train"] = {k: final.get(k) for k in ("loss", "tau_greedy", "tau_t1", "tokens_per_s", "memory_gib")}
        if result.name == "bench" and result.status == "done":  # a BenchSummary
            out["tau"] = [
                {"dataset": line.dataset, "temperature": line.temperature, "tau": line.tau, "ci95": line.ci95}
                for line in result.outputs.tau_lines()
            ]
    out["status"] = "ok" if all(r.status == "done" for r in results) else "FAIL: a stage did not finish"
    return out


# --------------------------------------------------------------------------------------------------
# 3. throughput
# --------------------------------------------------------------------------------------------------


def matmul_peak(device) -> float:
    """Measured bf16 matmul FLOP/s (8192^3 on CUDA, the mean of 10 after 3 warm-ups)."""
    import torch

    n = 8192 if device.type == "cuda" else 512
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(10):
        a @ b
    if device.type == "cuda":
        torch.cuda.synchronize()
    return 2 * n**3 * 10 / (time.perf_counter() - start)


def _template_config(template: str, smoke: bool):
    from dspark_cli.draft.build import draft_config_from_recipe
    from dspark_cli.recipe import load_recipe

    recipe = load_recipe(template, [])
    draft, target = recipe.draft.model_dump(), recipe.target.model_dump()
    if smoke:  # the same code at toy widths: every layer, head and table kept, sizes shrunk
        target.update(hidden_size=64, vocab_size=512)
        draft.update(mask_token_id=511, markov_rank=16, intermediate_size=128, num_attention_heads=4)
        if draft["arch"] == "mla":
            draft.update(q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=16)
        else:
            draft.update(head_dim=16, num_key_value_heads=2)
    return recipe, draft_config_from_recipe(draft, target)


def _throughput_one(template: str, smoke: bool, device, peak: float) -> dict[str, Any]:
    import torch

    from dspark_cli.training.data import Step
    from dspark_cli.training.distributed import DistEnv
    from dspark_cli.training.loop import LoopConfig, train_step
    from dspark_cli.training.session import build_step_module, make_optimizer

    recipe, config = _template_config(template, smoke)
    train = recipe.train
    max_len = 64 if smoke else train.max_seq_len
    lengths = [max_len, max_len * 3 // 4, max_len // 2]  # chat data has mixed lengths: see the compiles
    num_steps = 3 if smoke else 50
    num_anchors = 8 if smoke else train.num_anchors
    started = time.perf_counter()
    bf16 = device.type == "cuda"
    emb_dtype = torch.bfloat16 if bf16 else torch.float32
    embeddings = (
        torch.randn(config.vocab_size, config.target_hidden_size, dtype=emb_dtype),
        torch.randn(config.vocab_size, config.target_hidden_size, dtype=emb_dtype) * 0.02,
    )
    env = DistEnv(0, 1, 0, device)
    module = build_step_module(recipe, config, env, emb_dtype, embeddings=embeddings)
    optimizer = make_optimizer(module, recipe, env)
    build_s = time.perf_counter() - started
    trainable = sum(p.numel() for p in module.parameters() if p.requires_grad)
    examples = _synthetic_examples(config, num=len(lengths), lengths=lengths, num_anchors=num_anchors)
    cfg = LoopConfig(
        num_steps=num_steps,
        lr=train.lr,
        min_lr_ratio=train.min_lr_ratio,
        warmup_steps=0,
        grad_clip=train.grad_clip,
        log_every=10,
        checkpoint_every=num_steps,
        block_size=config.block_size,
        loss=module.loss_config,
        data_dtype=emb_dtype,
        autocast_dtype=torch.bfloat16 if bf16 else None,
        shapes=module.shape_plan,
    )  # the trainer's static shapes (train.length_buckets) on this device
    from dspark_cli.training.shapes import CompileCounter

    compiles = CompileCounter()
    shapes, times, tokens, flops_per_token = set(), [], 0, None
    warmup = min(WARMUP_STEPS, num_steps - 1)
    first_memory = None
    for i in range(num_steps):
        example = examples[i % len(examples)]  # one sequence per step, lengths rotating
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        result = train_step(
            env, module, optimizer, Step([example], {"epoch": 0, "consumed": i}), cfg, train.lr, count=i == 0
        )
        loss_value = float(result.stats[0]) if result.stats.numel() else float("nan")
        if device.type == "cuda":
            torch.cuda.synchronize()
        shapes |= result.signatures
        if result.flops is not None:
            flops_per_token = result.flops / max(result.tokens, 1)
        times.append(time.perf_counter() - t0)
        if i == 0 and device.type == "cuda":  # the FLOP-counted step: eager, under a dispatch mode
            first_memory = torch.cuda.max_memory_allocated(device) / 2**30
        if i + 1 == warmup and device.type == "cuda":  # the peak of the steady steps only, from here
            torch.cuda.reset_peak_memory_stats(device)
        if i >= warmup:  # warm-up (compiles, first FLOP count) excluded
            tokens += result.tokens
    steady = times[warmup:]
    tokens_per_s = tokens / sum(steady)
    memory = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    return {
        "draft": f"{config.arch}, {config.num_hidden_layers} layers, hidden {config.hidden_size}, "
        f"vocab {config.vocab_size}",
        "trainable_parameters": trainable,
        "build_s": round(build_s, 1),
        "steps": num_steps,
        "lengths": lengths,
        "num_anchors": num_anchors,
        "first_step_s": round(times[0], 2),
        "step_s_median": round(sorted(steady)[len(steady) // 2], 4),
        "tokens_per_s": round(tokens_per_s, 1),
        "flops_per_token": flops_per_token,
        "mfu": round(flops_per_token * tokens_per_s / peak, 4) if flops_per_token else None,
        "warmup_steps": warmup,
        "peak_memory_gib": round(memory, 2) if memory is not None else None,
        "first_step_peak_memory_gib": round(first_memory, 2) if first_memory is not None else None,
        "distinct_shapes": len(shapes),
        "compiles": compiles.read()["compiles"],
        "length_buckets": list(module.shape_plan.lengths) if module.shape_plan else None,
        "last_loss_stat": loss_value,
        "status": "ok",
    }


def section_throughput(smoke: bool, only: str | None = None) -> dict[str, Any]:
    import torch

    if not has_cuda() and not smoke:
        log("throughput: no CUDA device: skipped")
        return {"status": "skipped: no CUDA device"}
    device = torch.device("cuda" if has_cuda() else "cpu")
    peak = matmul_peak(device)
    out: dict[str, Any] = {"matmul_peak_tflops": round(peak / 1e12, 1), "drafts": {}}
    for template in [only] if only else THROUGHPUT_TEMPLATES:
        try:
            out["drafts"][template] = _throughput_one(template, smoke, device, peak)
        except Exception as exc:  # noqa: BLE001 - out of memory or a kernel error is the result for this draft
            out["drafts"][template] = {"status": f"error: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}"}
        log(f"throughput: {template}: {out['drafts'][template]}")
        emit(out)
        torch._dynamo.reset()  # compiled code keeps the draft alive: free it before the next one
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
    bad = [k for k, v in out["drafts"].items() if v["status"] != "ok"]
    out["status"] = "ok" if not bad else f"FAIL: {', '.join(bad)}"
    return out


# --------------------------------------------------------------------------------------------------
# 4. fsdp
# --------------------------------------------------------------------------------------------------


def fsdp_worker(workdir: Path, steps: int, resume: str, length: int, crash_after: int | None) -> None:
    """One torchrun rank: the tiny GQA draft trained by `run_train` on synthetic captured states;
    with `crash_after`, the process dies (os._exit, no clean-up) once that step is logged."""
    import torch

    from dspark_cli.capture.types import CapturedSequence
    from dspark_cli.recipe import load_recipe
    from dspark_cli.training.run import run_train

    recipe = load_recipe(
        "tiny",
        [
            "target.model=tiny-gqa",
            "draft.arch=gqa",
            f"output_dir={workdir}",
            f"train.max_steps={steps}",
            f"train.checkpoint_every={max(steps // 3, 1)}",
            "train.log_every=1",
            "train.warmup_steps=2",
            f"train.tokens_per_step={8 * length}",
            f"train.max_seq_len={length}",
            "train.num_anchors=8",
        ],
    )
    _, _, config = _tiny_setup("gqa")
    gen = torch.Generator().manual_seed(1)
    features = config.target_hidden_size * len(config.target_layer_ids)
    data = []
    for i in range(64):
        mask = torch.ones(length, dtype=torch.bool)
        mask[: length // 8] = False
        data.append(
            CapturedSequence(
                f"s/{i}",
                torch.randint(0, config.vocab_size - 1, (length,), generator=gen),
                mask,
                torch.randn(length, features, generator=gen).bfloat16(),
                torch.randn(length, config.target_hidden_size, generator=gen).bfloat16(),
            )
        )
    losses = {}

    def on_log(record: dict[str, Any]) -> None:
        losses[record["step"]] = record["loss"]
        if record["step"] == crash_after:
            os._exit(3)

    summary = run_train(recipe, resume=resume, sequences=lambda: iter(data), on_log=on_log)
    if int(os.environ.get("RANK", 0)) == 0:
        print(
            "RESULT "
            + json.dumps(
                {
                    "losses": losses,
                    "resumed_from": summary.resumed_from,
                    "steps": summary.steps,
                    "world_size": summary.world_size,
                }
            ),
            flush=True,
        )


_children: list[subprocess.Popen] = []  # torchrun launchers running now (see _stop_children)


def _stop(child: subprocess.Popen) -> None:
    """Stop a torchrun launcher with SIGTERM, which it passes on to its ranks (they run in sessions of
    their own, out of reach of a process-group kill); SIGKILL if it takes over 15 s."""
    if child.poll() is None:
        child.terminate()
        try:
            child.wait(timeout=15)
        except subprocess.TimeoutExpired:
            child.kill()


def _stop_children(signum, frame) -> None:
    """SIGTERM of a section (its time is up): stop what it started, then exit."""
    for child in list(_children):
        _stop(child)
    os._exit(128 + signum)


def _torchrun(
    workdir: Path, steps: int, resume: str, length: int, timeout: float, crash_after: int | None = None
) -> dict[str, Any] | None:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=1",
        __file__,
        "--fsdp-worker",
        str(workdir),
        "--steps",
        str(steps),
        "--resume",
        resume,
        "--length",
        str(length),
    ]
    cmd += ["--crash-after", str(crash_after)] if crash_after else []
    child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    _children.append(child)
    try:
        stdout, stderr = child.communicate(timeout=timeout)
    finally:
        _children.remove(child)
        _stop(child)
    proc = subprocess.CompletedProcess(cmd, child.returncode, stdout, stderr)
    if crash_after:
        return None
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"torchrun exited {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]}")
    return json.loads(lines[-1][len("RESULT ") :])


def section_fsdp(smoke: bool, deadline: float) -> dict[str, Any]:
    if not has_cuda() and not smoke:
        log("fsdp: no CUDA device (NCCL): skipped")
        return {"status": "skipped: no CUDA device"}
    work = Path(tempfile.mkdtemp(prefix="dspark-gpu-fsdp-"))
    steps, length = (6, 32) if smoke else (30, 128)
    budget = lambda: max(deadline - time.time(), 1)  # noqa: E731
    started = time.perf_counter()
    straight = _torchrun(work / "straight", steps, "never", length, budget())
    # the same run dies right after its second checkpoint (a checkpoint every third of the steps) and
    # is resumed with `--resume auto`: the steps after the checkpoint must repeat the straight run's
    saved = 2 * max(steps // 3, 1)
    _torchrun(work / "resumed", steps, "never", length, budget(), crash_after=saved + 1)
    resumed = _torchrun(work / "resumed", steps, "auto", length, budget())
    tail = [s for s in straight["losses"] if int(s) > saved]
    diffs = [abs(resumed["losses"][s] - straight["losses"][s]) / abs(straight["losses"][s]) for s in tail]
    # same data order and weights after the resume: the losses agree exactly on CPU (fp32, deterministic
    # kernels) and up to the non-determinism of bf16 atomics-based CUDA kernels (flex's backward) on a GPU
    tolerance = 1e-2 if has_cuda() else 1e-5
    ok = bool(resumed["resumed_from"]) and resumed["steps"] == steps and tail and max(diffs) < tolerance
    return {
        "backend": "nccl" if has_cuda() else "gloo",
        "world_size": straight["world_size"],
        "steps": steps,
        "crashed_after_step": saved + 1,
        "resumed_from": resumed["resumed_from"],
        "max_rel_loss_diff_after_resume": max(diffs) if diffs else None,
        "tolerance": tolerance,
        "seconds": round(time.perf_counter() - started, 1),
        "status": "ok" if ok else "FAIL: the resumed run differs from the straight run",
    }


# --------------------------------------------------------------------------------------------------
# driver
# --------------------------------------------------------------------------------------------------


def result_line(stdout: str, prefix: str) -> dict[str, Any]:
    """The last `prefix` JSON line a section printed ({} if none)."""
    lines = [line for line in stdout.splitlines() if line.startswith(prefix)]
    return json.loads(lines[-1][len(prefix) :]) if lines else {}


def run_section(name: str, smoke: bool, deadline: float) -> dict[str, Any]:
    if name == "throughput":
        return section_throughput(smoke)
    if name == "numerics":
        return section_numerics(smoke)
    if name == "pipeline":
        return section_pipeline(smoke)
    return section_fsdp(smoke, deadline)


def environment() -> dict[str, Any]:
    import platform

    import torch
    import transformers

    import dspark_cli

    info = {
        "dspark_cli": str(Path(dspark_cli.__file__).parent),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cuda": torch.version.cuda,
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
    }
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    return info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/gpu_check.json"))
    parser.add_argument(
        "--time-limit",
        type=float,
        default=540.0,
        help="seconds for the whole check (540 leaves a 600 s device call time to install)",
    )
    parser.add_argument("--smoke", action="store_true", help="run every section at toy sizes on the CPU")
    parser.add_argument(
        "--sections",
        default=",".join(SECTIONS),
        help=f"comma-separated, run in this order whatever the order given: {','.join(SECTIONS)}",
    )
    parser.add_argument("--section", help=argparse.SUPPRESS)  # internal: run one section, print RESULT
    parser.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--fsdp-worker", help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--resume", help=argparse.SUPPRESS)
    parser.add_argument("--length", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--crash-after", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.fsdp_worker:
        fsdp_worker(Path(args.fsdp_worker), args.steps, args.resume, args.length, args.crash_after)
        return 0
    if args.section:
        signal.signal(signal.SIGTERM, _stop_children)
        print("RESULT " + json.dumps(run_section(args.section, args.smoke, args.deadline), default=str), flush=True)
        return 0

    started = time.time()
    deadline = started + args.time_limit
    results: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "time_limit_s": args.time_limit,
        "smoke": args.smoke,
        "environment": environment(),
        "sections": {},
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    wanted = [s for s in args.sections.split(",") if s]
    unknown = [s for s in wanted if s not in SECTIONS]
    if unknown:
        parser.error(f"unknown section(s) {', '.join(unknown)}: choose from {', '.join(SECTIONS)}")
    total_share = sum(BUDGET[s] for s in wanted)
    for name in SECTIONS:
        if name not in wanted:
            results["sections"][name] = {"status": "not asked for"}
            continue
        left = deadline - time.time()
        later = sum(BUDGET[s] for s in SECTIONS[SECTIONS.index(name) + 1 :] if s in wanted) / total_share
        # a section may overrun its share by half, as long as half of every later section's share is left
        allowed = min(left - later * args.time_limit * 0.5, BUDGET[name] / total_share * args.time_limit * 1.5)
        if left < 10 or allowed < 5:
            results["sections"][name] = {"status": "skipped: time limit reached"}
            log(f"{name}: skipped, {left:.0f} s left")
            continue
        log(f"{name}: starting ({allowed:.0f} s allowed)")
        t0 = time.time()
        cmd = [sys.executable, __file__, "--section", name, "--deadline", str(t0 + allowed)] + (
            ["--smoke"] if args.smoke else []
        )
        # its own process group: at the time limit the section and everything it started (torchrun
        # and its ranks) are killed together
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, start_new_session=True
        )
        try:
            stdout, stderr = proc.communicate(timeout=allowed)
            if result_line(stdout, "RESULT "):
                section = result_line(stdout, "RESULT ")
            else:
                section = {
                    **result_line(stdout, "PARTIAL "),
                    "status": f"error: exit {proc.returncode}",
                    "stderr_tail": stderr.strip().splitlines()[-5:],
                }
        except subprocess.TimeoutExpired:
            proc.terminate()  # the section passes it on to what it started (see _stop_children)
            try:
                stdout, stderr = proc.communicate(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                stdout, stderr = proc.communicate()
            section = {
                **result_line(stdout, "PARTIAL "),
                "status": f"timed out after {allowed:.0f} s",
                "stderr_tail": stderr.strip().splitlines()[-5:],
            }
        sys.stderr.write(stderr[-4000:])
        section["wall_s"] = round(time.time() - t0, 1)
        results["sections"][name] = section
        results["wall_s"] = round(time.time() - started, 1)
        tmp = out.with_name(out.name + ".tmp")
        tmp.write_text(json.dumps(results, indent=2, default=str) + "\n")
        tmp.replace(out)  # rewritten after every section: a kill keeps what was measured
        log(f"{name}: {section['status']} ({section['wall_s']} s)")
    log(f"results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
