"""Anti-repetition fine-tuning of a trained tiny target: MLE steps alternated with unlikelihood steps.

    python -m tools.tiny_targets.finetune_tiny dspark_cli/targets/tiny/tiny-gqa --out /tmp/ft/tiny-gqa

Run by `build_tiny` after the base training, on the *saved* (bf16) weights loaded as float32, so that
fine-tuning the shipped weights gives exactly what a full rebuild gives. Tiny greedy models fall into
repetition loops (`_de_de_de...`, one line five times); sequence-level unlikelihood training (Welleck et
al. 2019) fixes that where it happens: each iteration is (a) one ordinary MLE step on packed corpus rows,
as in `train_tiny.train`, and (b) one unlikelihood step: the model greedily continues a batch of
*training* prompts, and every continuation token that completes an n-gram already seen earlier in that
continuation gets the loss -log(1 - p(token)). `ul_mode="none"` runs the MLE steps alone (the control).
"""

from __future__ import annotations

import argparse
import json
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from tools.tiny_targets.train_tiny import IGNORE, cosine_lr


@dataclass
class FinetuneConfig:
    """The stage's settings; every field is recorded in build.json under "finetune"."""

    iterations: int = 100  # one MLE step + one unlikelihood step each
    lr: float = 3e-4  # peak; a short, gentle fine-tune of a converged model
    min_lr_ratio: float = 0.1  # cosine floor as a fraction of `lr` (1.0: constant after warmup)
    warmup_steps: int = 10
    weight_decay: float = 0.05
    grad_clip: float = 1.0
    batch_size: int = 16  # packed rows per MLE step
    ul_prompts: int = 16  # training prompts greedily continued per unlikelihood step
    ul_new_tokens: int = 96
    ul_mode: str = "ngram"  # "ngram": repeated n-grams are candidates; "none": MLE steps only (control)
    # n = 4 (the paper's) also hits legitimate repeats in code (12% of corpus answers repeat a 4-gram, 3% an
    # 8-gram) and cost held-out accuracy; n = 8 still catches every loop that runs past period + 8 tokens.
    ngram: int = 8
    ul_weight: float = 1.0
    seed: int = 1
    num_threads: int = 1  # fixed: the result of a CPU matmul can depend on the thread count

    def __post_init__(self) -> None:
        if self.ul_mode not in ("ngram", "none"):
            raise ValueError(f"ul_mode must be 'ngram' or 'none', not {self.ul_mode!r}")


def repeated_ngram_positions(ids: list[int], n: int) -> list[int]:
    """Indices t of `ids` whose n-gram ids[t-n+1 : t+1] already occurred (ending) before t (Welleck's C_t)."""
    seen: set[tuple[int, ...]] = set()
    out = []
    for t in range(n - 1, len(ids)):
        gram = tuple(ids[t - n + 1 : t + 1])
        if gram in seen:
            out.append(t)
        seen.add(gram)
    return out


def lr_at(it: int, cfg: FinetuneConfig) -> float:
    return cosine_lr(it, cfg.iterations, cfg.lr, cfg.warmup_steps, cfg.min_lr_ratio)


def _greedy(model, tokenizer, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """Greedy continuations (cut after the first EOS), one left-padded batch with KV cache."""
    import torch

    width = max(len(p) for p in prompts)
    pad = tokenizer.pad_token_id
    x = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    attn = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.no_grad():
        y = model.generate(
            x,
            attention_mask=attn,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=pad,
        )
    outs = []
    for row in y[:, width:].tolist():
        outs.append(row[: row.index(tokenizer.eos_token_id) + 1] if tokenizer.eos_token_id in row else row)
    return outs


def _ul_batch(prompts: list[list[int]], conts: list[list[int]], cfg: FinetuneConfig, pad_id: int):
    """Right-padded prompt+continuation rows and the candidate mask over the label positions."""
    import torch

    width = max(len(p) + len(c) for p, c in zip(prompts, conts))
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    cand = torch.zeros((len(prompts), width - 1), dtype=torch.bool)
    for r, (p, c) in enumerate(zip(prompts, conts)):
        ids[r, : len(p) + len(c)] = torch.tensor(p + c)
        for t in repeated_ngram_positions(c, cfg.ngram):
            cand[r, len(p) + t - 1] = True  # logits at position i predict token i + 1
    return ids, cand


def finetune(model, tokenizer, rows, prompts: list[list[int]], cfg: FinetuneConfig, log_path: Path, name: str):
    """Fine-tune `model` (fp32) in place on packed `rows` and training `prompts`; returns it (eval mode) and the log."""
    import torch

    torch.set_num_threads(cfg.num_threads)
    torch.manual_seed(cfg.seed)
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "embed" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and "embed" not in n)]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr,
        betas=(0.9, 0.95),
        eps=1e-8,
    )
    ids_all = torch.tensor([r[0] for r in rows], dtype=torch.long)
    mask_all = torch.tensor([r[1] for r in rows], dtype=torch.bool)
    gen = torch.Generator().manual_seed(cfg.seed)
    perm, cursor = torch.randperm(len(rows), generator=gen), 0
    prompt_order = list(range(len(prompts)))
    random.Random(cfg.seed).shuffle(prompt_order)
    prompt_cursor = 0
    log = []
    start = time.time()

    def step(loss, lr):
        for group in opt.param_groups:
            group["lr"] = lr
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return norm.item()

    with open(log_path, "w") as log_file:
        for it in range(cfg.iterations):
            lr = lr_at(it, cfg)
            entry: dict = {"iteration": it + 1, "lr": round(lr, 7)}
            # (a) MLE on packed rows, exactly as in train_tiny.train
            if cursor + cfg.batch_size > len(perm):
                perm, cursor = torch.randperm(len(rows), generator=gen), 0
            idx = perm[cursor : cursor + cfg.batch_size]
            cursor += cfg.batch_size
            batch = ids_all[idx]
            labels = batch[:, 1:].masked_fill(~mask_all[idx, 1:], IGNORE)
            model.train()
            logits = model(input_ids=batch[:, :-1]).logits
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE)
            entry["mle_loss"] = round(loss.item(), 4)
            entry["mle_grad_norm"] = round(step(loss, lr), 3)
            # (b) unlikelihood on the model's own greedy continuations of training prompts
            if cfg.ul_mode != "none":
                if prompt_cursor + cfg.ul_prompts > len(prompt_order):
                    prompt_cursor = 0
                chosen = [prompts[i] for i in prompt_order[prompt_cursor : prompt_cursor + cfg.ul_prompts]]
                prompt_cursor += cfg.ul_prompts
                model.eval()
                conts = _greedy(model, tokenizer, chosen, cfg.ul_new_tokens)
                model.train()
                ids, cand = _ul_batch(chosen, conts, cfg, tokenizer.pad_token_id)
                entry["ul_eos_rows"] = sum(bool(c) and c[-1] == tokenizer.eos_token_id for c in conts)
                entry["ul_candidates"] = int(cand.sum())
                entry["ul_rows_with_candidates"] = int(cand.any(1).sum())
                if cand.any():
                    logits = model(input_ids=ids[:, :-1]).logits
                    logp = torch.log_softmax(logits[cand].float(), -1).gather(1, ids[:, 1:][cand][:, None])[:, 0]
                    # -log(1 - p), computed stably from log p
                    one_minus = torch.clamp(-torch.expm1(logp), min=1e-5)
                    ul = -torch.log(one_minus).mean()
                    entry["ul_loss"] = round(ul.item(), 4)
                    entry["ul_grad_norm"] = round(step(cfg.ul_weight * ul, lr), 3)
            entry["elapsed_s"] = round(time.time() - start, 1)
            log.append(entry)
            log_file.write(json.dumps(entry) + "\n")
            if (it + 1) % 10 == 0 or it == 0 or it + 1 == cfg.iterations:
                log_file.flush()
                print(f"[{name} ft] " + " ".join(f"{k}={v}" for k, v in entry.items()), flush=True)
    model.eval()
    return model, log


def training_prompts(tokenizer, pairs) -> list[list[int]]:
    """Chat-templated prompts (generation prompt included) of the training pairs, in corpus order."""
    from tools.tiny_targets.eval_tiny import prompt_ids

    return [prompt_ids(tokenizer, p) for p in pairs]


def config_dict(cfg: FinetuneConfig) -> dict:
    return asdict(cfg)


def save_target(model, tokenizer, src: Path, out: Path) -> None:
    """Save as the build does: bf16 weights, config dtype float32, the source dir's tokenizer/generation files."""
    import shutil

    import torch

    out.mkdir(parents=True, exist_ok=True)
    model.to(torch.bfloat16)
    model.save_pretrained(out)
    config_path = out / "config.json"
    config_path.write_text(json.dumps({**json.loads(config_path.read_text()), "dtype": "float32"}, indent=2) + "\n")
    if src.resolve() != out.resolve():
        for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
            if (src / f).exists():
                shutil.copy(src / f, out / f)
    model.to(torch.float32)


def main() -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tools.tiny_targets.corpus import build_corpus
    from tools.tiny_targets.tokenizer import encode_chat
    from tools.tiny_targets.train_tiny import TrainConfig, pack_rows

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("src", type=Path, help="a saved tiny target directory (the base weights)")
    parser.add_argument("--out", type=Path, required=True)
    for field, default in asdict(FinetuneConfig()).items():
        parser.add_argument("--" + field.replace("_", "-"), type=type(default), default=default)
    args = parser.parse_args()
    cfg = FinetuneConfig(**{k: getattr(args, k) for k in asdict(FinetuneConfig())})
    torch.set_num_threads(cfg.num_threads)
    tokenizer = AutoTokenizer.from_pretrained(args.src)
    corpus = build_corpus()
    examples = [encode_chat(tokenizer, p.messages()) for p in corpus.train]
    rows = pack_rows(examples, TrainConfig().seq_len, tokenizer.pad_token_id, seed=0)
    model = AutoModelForCausalLM.from_pretrained(args.src, dtype=torch.float32, attn_implementation="sdpa")
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    model, _ = finetune(
        model,
        tokenizer,
        rows,
        training_prompts(tokenizer, corpus.train),
        cfg,
        args.out / "finetune_log.jsonl",
        args.src.name,
    )
    wall = time.time() - t0
    save_target(model, tokenizer, args.src, args.out)
    (args.out / "finetune.json").write_text(
        json.dumps({"finetune": config_dict(cfg), "finetune_s": round(wall, 1)}, indent=2)
    )
    print(f"[{args.src.name} ft] done in {wall:.0f}s -> {args.out}", flush=True)


if __name__ == "__main__":
    main()
