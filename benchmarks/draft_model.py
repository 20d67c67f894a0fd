"""Speed of the DSpark draft on CPU: training forward(+backward) and per-block drafting latency.

    .venv/bin/python benchmarks/draft_model.py            # ~2 min on 2 cores; writes
                                                          # results/draft_model.{json,md}
    .venv/bin/python benchmarks/draft_model.py --quick    # fewer repeats, for a smoke run

Tiny draft geometry (random weights; speed does not depend on them): target hidden 256,
vocab 4096, 6 target layers of which 3 feed the draft, 2 draft layers, block 7. Training
shapes: 4 sequences x 128 tokens with 32 anchors each (224 query slots per sequence, the
issue's shape), and 1 x 1024 tokens with 128 anchors, where attention weighs more.
MLA: 4 heads, q_lora 64, kv_lora 64, nope 32, rope 32, v 32. GQA: 4 heads, 2 KV heads, dim 64.

Attention implementations compared (dspark_cli/draft/attention.py):
- training forward+backward: "sdpa" (boolean block mask) vs "eager" (explicit fp32 softmax);
  "flex" has no backward on CPU, so it is timed forward-only next to the others' forward;
- drafting (`draft_block`, greedy, context 128 cached, incremental append of 8 rows):
  sdpa / eager / flex.
Median of `--repeat` runs after warm-up (flex's first call compiles; its compile time is
reported separately). The record's provenance keeps the load around and during the run
(benchmarks/provenance.py); findings about these numbers live in results/draft_model.notes.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import provenance  # noqa: E402  (benchmarks/provenance.py)

from dspark_cli.draft.build import draft_config_from_values  # noqa: E402
from dspark_cli.draft.drafting import ContextCache, draft_block  # noqa: E402
from dspark_cli.draft.model import DSparkDraftModel  # noqa: E402

HIDDEN, VOCAB, SEQ, ANCHORS, BATCH, BLOCK = 256, 4096, 128, 32, 4, 7
# (batch, seq_len, anchors): the shape, and a long one where attention weighs more
TRAIN_SHAPES = [(BATCH, SEQ, ANCHORS), (1, 1024, 128)]
GEOMETRY = {
    "mla": dict(
        num_attention_heads=4, q_lora_rank=64, kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=32, v_head_dim=32
    ),
    "gqa": dict(num_attention_heads=4, num_key_value_heads=2, head_dim=64),
}


def build(arch: str, impl: str) -> DSparkDraftModel:
    cfg = draft_config_from_values(
        arch=arch,
        target_hidden_size=HIDDEN,
        vocab_size=VOCAB,
        num_layers=2,
        block_size=BLOCK,
        target_layer_ids=[1, 3, 5],
        target_num_hidden_layers=6,
        markov_rank=64,
        mask_token_id=VOCAB - 1,
        intermediate_size=2 * HIDDEN,
        **GEOMETRY[arch],
    )
    torch.manual_seed(0)
    model = DSparkDraftModel(cfg, attn_impl=impl)
    model.init_weights()
    model.set_target_embeddings(torch.randn(VOCAB, HIDDEN), torch.randn(VOCAB, HIDDEN) * 0.05)
    return model


def batch(bsz: int = BATCH, seq_len: int = SEQ, num_anchors: int = ANCHORS):
    gen = torch.Generator().manual_seed(1)
    aux = torch.randn(bsz, seq_len, 3 * HIDDEN, generator=gen)
    ids = torch.randint(0, VOCAB - 1, (bsz, seq_len), generator=gen)
    anchors = torch.stack([torch.randperm(seq_len - 1, generator=gen)[:num_anchors].sort().values for _ in range(bsz)])
    return aux, ids, anchors


def timed(fn, repeat: int, warmup: int = 1) -> tuple[float, float]:
    """(median seconds, first-call seconds)."""
    start = time.perf_counter()
    fn()
    first = time.perf_counter() - start
    for _ in range(warmup - 1):
        fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), first


def bench_training(arch: str, impl: str, repeat: int, backward: bool, shape: tuple) -> dict:
    model = build(arch, impl)
    bsz, seq_len, num_anchors = shape
    aux, ids, anchors = batch(*shape)

    def step():
        if backward:
            model.zero_grad(set_to_none=True)
            out = model(aux, ids, anchors)
            loss = out.logits.float().logsumexp(-1).mean() + out.confidence.mean()
            loss.backward()
        else:
            with torch.no_grad():
                model(aux, ids, anchors)

    seconds, first = timed(step, repeat, warmup=2)
    return {
        "arch": arch,
        "attn_impl": impl,
        "backward": backward,
        "batch": bsz,
        "seq_len": seq_len,
        "anchors": num_anchors,
        "seconds": seconds,
        "first_call_seconds": first,
        "seq_tokens_per_s": bsz * seq_len / seconds,
        "block_slots_per_s": bsz * num_anchors * BLOCK / seconds,
    }


def bench_drafting(arch: str, impl: str, repeat: int, num_requests: int) -> dict:
    model = build(arch, impl)
    aux, ids, _ = batch()
    cache = ContextCache(model, capacity=SEQ + 64)
    slots = [cache.add_request() for _ in range(num_requests)]
    cache.extend({s: aux[s % BATCH, :SEQ] for s in slots})
    anchors = ids[torch.arange(num_requests) % BATCH, -1]
    seconds, first = timed(lambda: draft_block(model, cache, slots, anchors, attn_impl=impl), repeat, warmup=3)

    def append_and_roll_back():  # one verification step: 8 new rows per request
        cache.extend({s: aux[s % BATCH, :8] for s in slots})
        for s in slots:
            cache.truncate(s, SEQ)

    append, _ = timed(append_and_roll_back, repeat, warmup=2)
    return {
        "arch": arch,
        "attn_impl": impl,
        "requests": num_requests,
        "context": SEQ,
        "block": BLOCK,
        "draft_block_ms": 1e3 * seconds,
        "first_call_ms": 1e3 * first,
        "append_8_rows_ms": 1e3 * append,
    }


def markdown(result: dict) -> str:
    lines = [
        "# DSpark draft model on CPU",
        "",
        f"{result['threads']} torch threads. Geometry: target hidden 256, vocab 4096, 3 aux layers, 2 draft layers, "
        "block 7. `first call` includes flex's compile.",
        "",
        "## Training forward (+ backward)",
        "",
        "B x T / A: sequences x tokens / anchors per sequence; block slots = B * A * 7.",
        "",
        "| arch | B x T / A | attn | backward | ms / batch | seq tokens/s | block slots/s | first call ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in result["training"]:
        lines.append(
            f"| {r['arch']} | {r['batch']} x {r['seq_len']} / {r['anchors']} | "
            f"{r['attn_impl']} | {r['backward']} | "
            f"{1e3 * r['seconds']:.1f} | {r['seq_tokens_per_s']:.0f} | "
            f"{r['block_slots_per_s']:.0f} | {1e3 * r['first_call_seconds']:.0f} |"
        )
    lines += [
        "",
        "## Drafting one block (greedy, 128 cached context positions)",
        "",
        "| arch | attn | requests | ms / block | append 8 rows ms | first call ms |",
        "|---|---|---|---|---|---|",
    ]
    for r in result["drafting"]:
        lines.append(
            f"| {r['arch']} | {r['attn_impl']} | {r['requests']} | "
            f"{r['draft_block_ms']:.2f} | {r['append_8_rows_ms']:.2f} | "
            f"{r['first_call_ms']:.0f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="repeat=2, MLA+GQA sdpa only")
    # 1 thread by default: on a shared 2-core box, 2 OpenMP threads competing with another
    # process run tiny matmuls 10-40x slower (spin-waiting), which measures the neighbour.
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=provenance.RESULTS, help="the folder the record goes to")
    provenance.add_arguments(parser)
    args = parser.parse_args()
    rec = provenance.Recording("draft_model", allow_dirty=args.allow_dirty, out_dir=args.out)
    torch.set_num_threads(args.threads)
    repeat = 2 if args.quick else args.repeat
    impls_train = ["sdpa"] if args.quick else ["sdpa", "eager"]
    impls_fwd = ["sdpa"] if args.quick else ["sdpa", "eager", "flex"]
    result = {
        "threads": args.threads,
        "training": [],
        "drafting": [],
    }
    for arch in ("mla", "gqa"):
        for shape in TRAIN_SHAPES[:1] if args.quick else TRAIN_SHAPES:
            for impl in impls_train:
                result["training"].append(bench_training(arch, impl, repeat, True, shape))
            for impl in impls_fwd:
                result["training"].append(bench_training(arch, impl, repeat, False, shape))
        for impl in impls_fwd:
            for requests in (1, 8):
                result["drafting"].append(bench_drafting(arch, impl, 4 * repeat, requests))
    rec.write(result, markdown)
    print(markdown(result))


if __name__ == "__main__":
    main()
