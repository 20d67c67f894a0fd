"""Does training work? Expected tau of an untrained vs a trained draft on a bundled tiny target, and the
logged metric against tau measured by real speculative decoding.

    .venv/bin/python benchmarks/train_tau.py --prompts 400 --steps 200      # tiny-gqa, ~15 min on 2 cores
    .venv/bin/python benchmarks/train_tau.py --target tiny-mla --prompts 80 --steps 50   # smaller

Steps, all with the shipped code and the `tiny` recipe (overrides below; the bundled answers are short,
~60 tokens, so steps are 1024 tokens rather than the recipe's 4096 to get more updates per minute): datagen (the target answers
`--prompts` bundled training prompts, greedy) -> capture -> `run_train`; held-out data the same way
from the bundled eval prompts. Then on the held-out sequences: `evaluate_draft` (the teacher-forced
metric training logs: tau_greedy, tau_t1) for a freshly initialised draft and for the trained one,
and greedy speculative decoding with the trained draft in the reference engine
(dspark_cli/bench/engine.py: the target verifies each block as vLLM does) on the same prompts.
Writes results/train_tau.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import provenance  # benchmarks/provenance.py

ROOT = Path(__file__).resolve().parents[1]


def recipe_for(target: str, out: Path, source: str, prompts: int, steps: int, max_tokens: int, tokens_per_step: int):
    from dspark_cli.recipe import load_recipe

    return load_recipe(
        "tiny",
        [
            f"target.model={target}",
            f"output_dir={out}",
            f"draft.arch={'mla' if target.endswith('mla') else 'gqa'}",
            f"datagen.sources=[{{path: {source}, max_samples: {prompts}}}]",
            f"datagen.max_tokens={max_tokens}",
            "datagen.exclude_eval=[]",
            f"train.max_steps={steps}",
            f"train.tokens_per_step={tokens_per_step}",
            "train.log_every=25",
            "train.checkpoint_every=1000",
        ],
    )


def captured(recipe) -> list:
    from dspark_cli.capture import iter_captured, run_capture
    from dspark_cli.datagen.run import run_datagen

    run_datagen(recipe)
    run_capture(recipe)
    return list(iter_captured(recipe.stage_dir("capture")))


def speculative_tau(target_dir: Path, layer_ids: list[int], train_dir: Path, sequences: list, block: int) -> dict:
    config = json.loads((target_dir / "config.json").read_text())
    eos = config.get("eos_token_id")
    stop_ids = frozenset(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    from dspark_cli.bench.engine import DSparkDrafter, HFTarget, Sampling, Speculation, SpeculativeEngine

    target = HFTarget.load(str(target_dir), layer_ids, dtype="float32", device="cpu")
    engine = SpeculativeEngine(target, DSparkDrafter.from_dir(str(train_dir), target), Speculation(block, "greedy"))
    accepted = steps = same = 0
    for seq in sequences:
        first = int(seq.loss_mask.float().argmax())  # the first response token
        response = seq.input_ids[first:].tolist()
        out = engine.generate(
            seq.input_ids[:first].tolist(), Sampling(temperature=0.0, max_tokens=len(response), stop_ids=stop_ids)
        )
        accepted += sum(out.accepted)
        steps += out.num_steps
        same += out.token_ids == response[: len(out.token_ids)]
    return {"tau": (accepted + steps) / steps, "steps": steps, "responses_identical_to_datagen": same}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", default="tiny-gqa")
    parser.add_argument("--prompts", type=int, default=400)
    parser.add_argument("--eval-prompts", type=int, default=24)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--tokens-per-step", type=int, default=1024)
    provenance.add_arguments(parser)
    args = parser.parse_args()
    rec = provenance.Recording("train_tau", allow_dirty=args.allow_dirty)
    import torch

    torch.set_num_threads(1)
    from dspark_cli.capture.plan import resolve_layer_ids
    from dspark_cli.draft.model import DSparkDraftModel
    from dspark_cli.targets import Target, resolve_target
    from dspark_cli.training.evaluate import evaluate_draft, load_trained_draft
    from dspark_cli.training.run import build_draft_config, run_train

    work = Path(tempfile.mkdtemp(prefix="dspark-train-tau-"))
    recipe = recipe_for(
        args.target, work / "train", "tiny-prompts", args.prompts, args.steps, args.max_tokens, args.tokens_per_step
    )
    held = recipe_for(
        args.target, work / "eval", "tiny-eval", args.eval_prompts, args.steps, args.max_tokens, args.tokens_per_step
    )
    captured(recipe)
    held_out = captured(held)
    target_dir = resolve_target(args.target)
    layer_ids = resolve_layer_ids(recipe, Target.of(recipe).geometry().num_hidden_layers)
    config = build_draft_config(recipe, layer_ids)
    untrained = DSparkDraftModel(config)
    untrained.init_weights(generator=torch.Generator().manual_seed(recipe.train.seed))
    untrained.set_target_embeddings(*Target.of(recipe).embeddings())
    before = evaluate_draft(untrained, held_out, num_anchors=100_000)
    summary = run_train(recipe, resume="never")
    train_dir = Path(recipe.stage_dir("train"))
    after = evaluate_draft(load_trained_draft(train_dir, Target.of(recipe)), held_out, num_anchors=100_000)
    real = speculative_tau(target_dir, layer_ids, train_dir, held_out, config.block_size)
    keys = ("tau_greedy", "tau_greedy_decode", "tau_t1", "tau_t1_decode", "acc", "acc_slot", "loss")
    result = {
        "target": args.target,
        "block_size": config.block_size,
        "train_sequences": summary.tokens,
        "train_steps": summary.steps,
        "held_out_sequences": len(held_out),
        "untrained": {k: before[k] for k in keys},
        "trained": {k: after[k] for k in keys},
        "speculative_decoding_greedy": real,
        "train_final_metrics": {k: summary.final_metrics[k] for k in ("tau_greedy", "tau_t1", "loss", "tokens_per_s")},
    }
    rec.write(result, markdown)
    print(markdown(result))


def markdown(result: dict) -> str:
    before, after, real = result["untrained"], result["trained"], result["speculative_decoding_greedy"]
    md = [
        f"# Trained vs untrained draft on {result['target']}",
        "",
        f"{result['train_steps']} steps ({result['train_sequences']:,} tokens) of the `tiny` recipe; held-out: "
        f"{result['held_out_sequences']} answers to bundled eval prompts; block {result['block_size']}.",
        "",
        "| draft | tau greedy: logged metric | replayed | speculative decoding | tau T=1: logged metric | replayed | slot-0 accuracy |",
        "|---|---|---|---|---|---|---|",
        f"| untrained | {before['tau_greedy']:.2f} | {before['tau_greedy_decode']:.2f} | - | {before['tau_t1']:.2f} | "
        f"{before['tau_t1_decode']:.2f} | {before['acc_slot'][0]:.3f} |",
        f"| trained | {after['tau_greedy']:.2f} | {after['tau_greedy_decode']:.2f} | {real['tau']:.2f} ({real['steps']} steps) | "
        f"{after['tau_t1']:.2f} | {after['tau_t1_decode']:.2f} | {after['acc_slot'][0]:.3f} |",
        "",
        "Logged metric: the teacher-forced mean acceptance length over anchors (what training logs; here every "
        "held-out position is an anchor). Replayed: decoding replayed on those acceptances (`evaluate_draft`). "
        "Speculative decoding: the reference engine (dspark_cli/bench/engine.py), greedy drafting and "
        "verification, the same prompts, stopping at the end token. The held-out answers are greedy, so the "
        "T=1 columns are teacher-forced acceptance probabilities on greedy text, not a T=1 decoding run.",
    ]
    return "\n".join(md) + "\n"


if __name__ == "__main__":
    main()
