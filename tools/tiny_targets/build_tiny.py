"""Rebuild the bundled tiny targets (tiny-mla, tiny-gqa) from scratch, deterministically, on CPU.

    python -m tools.tiny_targets.build_tiny --out dspark_cli/targets/tiny              # the shipped weights
    python -m tools.tiny_targets.build_tiny --out /tmp/tiny --steps 20 --finetune-iterations 4 --eval-held-out 64  # smoke run
    python -m tools.tiny_targets.build_tiny --out dspark_cli/targets/tiny --cards-only  # re-render the cards

Steps: (1) the stdlib chat corpus (`corpus.py`), (2) one byte-level BPE tokenizer for both (`tokenizer.py`),
(3) both models trained side by side, one process and one thread each (`train_tiny.py`), saved in bf16,
then fine-tuned against repetition loops from those saved weights (`finetune_tiny.py`: MLE steps alternated
with unlikelihood steps on the model's own greedy continuations; finetune_log.jsonl) and saved again,
(4) each reloaded from its saved files and evaluated (`eval_tiny.py`; EOS / loop rates on more held-out
prompts with vLLM where it is installed, `loop_rates.py`), (5) a card (README.md) and
build.json per target; train_log.jsonl has every step. Everything is built under `<out>/.build/` and renamed into place at the end.

Determinism: fixed seeds, one torch thread per model, sorted file walks, a hash-based split; the corpus
depends on the Python version, which the card records. Budget: ~36 min on an unloaded 2-core machine (base
training ~27 min, the anti-repetition stage ~8 min, both targets side by side).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

from tools.tiny_targets.card import write_card

REPO_ROOT = Path(__file__).resolve().parents[2]

TARGETS = ("tiny-mla", "tiny-gqa")
# Steps per target, chosen so both finish together on 2 cores (an MLA step costs ~1.3x a GQA step on CPU).
DEFAULT_STEPS = {"tiny-mla": 800, "tiny-gqa": 1000}
# Overrides of FinetuneConfig per target for the anti-repetition stage after the base training.
# MLA decodes ~4x slower than GQA under transformers on CPU, so it gets fewer iterations in the same time.
FINETUNE: dict[str, dict] = {"tiny-mla": {"iterations": 64}, "tiny-gqa": {}}
VOCAB_SIZE = 4096


def _prepare(build_dir: Path, vocab_size: int) -> dict:
    """Corpus + tokenizer; saves the tokenizer into each target dir and the packed rows for the workers."""
    import torch

    from tools.tiny_targets.corpus import build_corpus, python_version
    from tools.tiny_targets.tokenizer import encode_chat, train_tokenizer
    from tools.tiny_targets.train_tiny import TrainConfig, pack_rows

    t0 = time.time()
    corpus = build_corpus()
    tokenizer = train_tokenizer((p.prompt + "\n" + p.response for p in corpus.train), vocab_size)
    examples = [encode_chat(tokenizer, p.messages()) for p in corpus.train]
    seq_len = TrainConfig().seq_len
    too_long = sum(len(ids) > seq_len + 1 for ids, _ in examples)
    rows = pack_rows(examples, seq_len, tokenizer.pad_token_id, seed=0)
    torch.save(
        {
            "ids": torch.tensor([r[0] for r in rows], dtype=torch.int16),
            "mask": torch.tensor([r[1] for r in rows], dtype=torch.bool),
        },
        build_dir / "rows.pt",
    )
    for name in TARGETS:
        tokenizer.save_pretrained(build_dir / name)
    info = {
        "python": python_version(),
        "num_train_pairs": len(corpus.train),
        "num_held_out_pairs": len(corpus.held_out),
        "num_train_tokens": sum(len(ids) for ids, _ in examples),
        "num_train_loss_tokens": sum(sum(m) for _, m in examples),
        "num_dropped_too_long": too_long,
        "num_rows": len(rows),
        "vocab_size": len(tokenizer),
        "prepare_s": round(time.time() - t0, 1),
    }
    print(f"[build] corpus + tokenizer: {json.dumps(info)}", flush=True)
    return info


def _finetune(name: str, out: Path, tokenizer, rows, iterations: int | None = None) -> dict:
    """The anti-repetition stage on the *saved* bf16 weights (as float32), saved over them in the same way."""
    import torch
    from transformers import AutoModelForCausalLM

    from tools.tiny_targets.corpus import build_corpus
    from tools.tiny_targets.finetune_tiny import FinetuneConfig, config_dict, finetune, save_target, training_prompts

    cfg = FinetuneConfig(**{**FINETUNE.get(name, {}), **({"iterations": iterations} if iterations else {})})
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, attn_implementation="sdpa")
    prompts = training_prompts(tokenizer, build_corpus().train)
    t0 = time.time()
    model, log = finetune(model, tokenizer, rows, prompts, cfg, out / "finetune_log.jsonl", name)
    finetune_s = time.time() - t0
    save_target(model, tokenizer, out, out)
    return {
        **config_dict(cfg),
        "finetune_s": round(finetune_s, 1),
        "final_mle_loss": sum(e["mle_loss"] for e in log[-20:]) / len(log[-20:]),
    }


def _worker(
    name: str, build_dir: Path, steps: int, eval_held_out: int | None, finetune_iterations: int | None = None
) -> None:
    """One target: train, save in bf16 (config dtype float32, so engines compute in fp32 by default), evaluate."""
    import torch
    from transformers import AutoTokenizer, GenerationConfig

    from tools.tiny_targets.architectures import ARCHITECTURES
    from tools.tiny_targets.eval_tiny import evaluate_dir
    from tools.tiny_targets.finetune_tiny import save_target
    from tools.tiny_targets.train_tiny import TrainConfig, config_dict, train

    out = build_dir / name
    tokenizer = AutoTokenizer.from_pretrained(out)
    cfg = TrainConfig(steps=steps)
    torch.set_num_threads(cfg.num_threads)
    data = torch.load(build_dir / "rows.pt")
    rows = list(zip(data["ids"].long().tolist(), data["mask"].int().tolist()))
    model_config = ARCHITECTURES[name](len(tokenizer), tokenizer.eos_token_id, tokenizer.pad_token_id)
    t0 = time.time()
    model, log = train(model_config, rows, cfg, out / "train_log.jsonl", name)
    train_s = time.time() - t0
    save_target(model, tokenizer, out, out)  # bf16 storage (8 MB budget), config dtype float32 for engines
    GenerationConfig(
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        do_sample=False,
    ).save_pretrained(out)
    finetune_result = _finetune(name, out, tokenizer, rows, finetune_iterations) if finetune_iterations != 0 else None
    t1 = time.time()
    metrics = evaluate_dir(str(out), num_held_out=eval_held_out)
    step_s = sorted(e["step_s"] for e in log)
    result = {
        "train": config_dict(cfg),
        "train_s": round(train_s, 1),
        "eval_s": round(time.time() - t1, 1),
        "step_s_median": step_s[len(step_s) // 2],
        "step_s_p10": step_s[len(step_s) // 10],
        "final_train_loss": sum(e["loss"] for e in log[-20:]) / len(log[-20:]),
        "num_params": sum(p.numel() for p in model.parameters()),
        **({"finetune": finetune_result} if finetune_result else {}),
        **metrics,
    }
    (build_dir / f"{name}.result.json").write_text(json.dumps(result, indent=2))
    print(
        f"[{name}] done: train {train_s:.0f}s, held-out acc {metrics['eval_prompts']['accuracy']:.3f}, "
        f"eos {metrics['generation']['eos_share']:.2f}, ast {metrics['generation']['ast_share']:.2f}",
        flush=True,
    )


def _held_out_rates(target_dir: Path, env: dict) -> dict | None:
    """EOS / loop rates on many held-out prompts (`loop_rates.py`, vLLM); None where vLLM is not installed."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        print(f"[build] vllm is not installed: {target_dir.name}'s card skips the held-out loop rates", flush=True)
        return None
    out = target_dir / ".loop_rates.json"
    subprocess.run(
        [sys.executable, "-m", "tools.tiny_targets.loop_rates", str(target_dir), "--out", str(out)],
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    result = json.loads(out.read_text())
    out.unlink()
    return result


def build(
    out: Path,
    steps: dict[str, int],
    vocab_size: int = VOCAB_SIZE,
    eval_held_out: int | None = None,
    finetune_iterations: int | None = None,
) -> None:
    wall0 = time.time()
    out.mkdir(parents=True, exist_ok=True)
    build_dir = out / ".build"
    shutil.rmtree(build_dir, ignore_errors=True)
    build_dir.mkdir()
    info = _prepare(build_dir, vocab_size)
    # Two processes, one thread each: the 2 cores train both models at once, and a single-threaded model
    # is bit-reproducible regardless of how many cores the rebuilding machine has.
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    # the workers import tools.tiny_targets from this checkout, wherever the build is started from
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    procs = {}
    for name in TARGETS:
        cmd = [
            sys.executable,
            "-m",
            "tools.tiny_targets.build_tiny",
            "--worker",
            name,
            "--out",
            str(out),
            "--steps",
            str(steps[name]),
        ]
        if eval_held_out:
            cmd += ["--eval-held-out", str(eval_held_out)]
        if finetune_iterations is not None:
            cmd += ["--finetune-iterations", str(finetune_iterations)]
        procs[name] = subprocess.Popen(cmd, env=env)
    failed = [name for name, proc in procs.items() if proc.wait() != 0]
    if failed:
        raise SystemExit(f"build failed for {', '.join(failed)}; see the output above (build dir {build_dir})")
    held_out = {name: _held_out_rates(build_dir / name, env) for name in TARGETS}
    wall_s = time.time() - wall0
    host = {
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
        "torch_threads_per_model": 1,
        "load_average_at_end": os.getloadavg()[0],
    }
    for name in TARGETS:
        result = json.loads((build_dir / f"{name}.result.json").read_text())
        record = {
            "name": name,
            "build_wall_s": round(wall_s, 1),
            "host": host,
            **info,
            **result,
            "generation_held_out": held_out[name],
        }
        (build_dir / name / "build.json").write_text(json.dumps(record, indent=2) + "\n")
        write_card(build_dir / name, record)
    for name in TARGETS:
        final = out / name
        shutil.rmtree(final, ignore_errors=True)
        (build_dir / name).rename(final)
    shutil.rmtree(build_dir)
    print(f"[build] both targets in {out} after {wall_s / 60:.1f} min", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description="Rebuild the bundled tiny targets from scratch on CPU.")
    parser.add_argument("--out", type=Path, required=True, help="folder that receives tiny-mla/ and tiny-gqa/")
    parser.add_argument(
        "--steps",
        type=int,
        default=None,
        help="training steps for each target (default: "
        + ", ".join(f"{k} {v}" for k, v in DEFAULT_STEPS.items())
        + ")",
    )
    parser.add_argument("--vocab-size", type=int, default=VOCAB_SIZE)
    parser.add_argument(
        "--eval-held-out",
        type=int,
        default=None,
        help="evaluate loss/accuracy on only this many held-out pairs (smoke runs)",
    )
    parser.add_argument(
        "--cards-only",
        action="store_true",
        help="only rewrite each target's README.md from its build.json (no training)",
    )
    parser.add_argument(
        "--finetune-iterations",
        type=int,
        default=None,
        help="iterations of the anti-repetition stage (finetune_tiny.py) after the base training; "
        "0 skips it (default: finetune_tiny.FinetuneConfig, per target overrides in FINETUNE)",
    )
    parser.add_argument("--worker", choices=TARGETS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.cards_only:
        for name in TARGETS:
            write_card(args.out / name, json.loads((args.out / name / "build.json").read_text()))
        return
    if args.worker:
        _worker(args.worker, args.out / ".build", args.steps, args.eval_held_out, args.finetune_iterations)
        return
    steps = {name: args.steps or DEFAULT_STEPS[name] for name in TARGETS}
    build(args.out, steps, args.vocab_size, args.eval_held_out, args.finetune_iterations)


if __name__ == "__main__":
    main()
