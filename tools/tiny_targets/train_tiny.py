"""Train one tiny target on the tokenized stdlib chat corpus (one process, one fixed thread count).

    python -m tools.tiny_targets.build_tiny --out /tmp/tiny --steps 20     # a 1-minute smoke run of the build

Called by `build_tiny` once per target, each in its own process so the two train side by side on 2 cores.
Conversations are packed whole into rows of `seq_len` tokens (first fit, in a seeded shuffle order, the rest
padded); the loss covers assistant tokens and their EOS only, so the model learns to answer and to stop,
not to imitate prompts.
"""

from __future__ import annotations

import json
import math
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

IGNORE = -100


@dataclass
class TrainConfig:
    """One target's optimisation settings; every field is recorded in the card."""

    steps: int = 1000
    batch_size: int = 16  # rows per step
    seq_len: int = 320  # tokens per row; the longest corpus conversation is shorter
    lr: float = 2e-3  # peak AdamW learning rate (tiny models train well hot)
    min_lr_ratio: float = 0.1  # cosine floor, as a fraction of `lr`
    warmup_steps: int = 40
    weight_decay: float = 0.05
    grad_clip: float = 1.0
    seed: int = 0
    num_threads: int = 1  # fixed: the result of a CPU matmul can depend on the thread count

    def __post_init__(self) -> None:
        if self.steps < 1 or self.batch_size < 1 or self.seq_len < 16:
            raise ValueError("steps, batch_size must be >= 1 and seq_len >= 16")
        if not 0 <= self.warmup_steps <= self.steps:
            self.warmup_steps = min(self.warmup_steps, self.steps)


def pack_rows(
    examples: list[tuple[list[int], list[int]]], seq_len: int, pad_id: int, seed: int
) -> list[tuple[list[int], list[int]]]:
    """First-fit packing of (ids, loss_mask) conversations into rows of exactly `seq_len + 1` tokens.

    One extra token per row because inputs are row[:-1] and labels row[1:]. Conversations longer than a row
    are dropped (the corpus caps response length, so this is rare and logged by the caller).
    """
    order = list(range(len(examples)))
    random.Random(seed).shuffle(order)
    width = seq_len + 1
    rows: list[tuple[list[int], list[int]]] = []
    open_rows: list[int] = []  # indices of rows with room left, oldest first
    for i in order:
        ids, mask = examples[i]
        if len(ids) > width:
            continue
        for r in open_rows:
            if len(rows[r][0]) + len(ids) <= width:
                rows[r][0].extend(ids)
                rows[r][1].extend(mask)
                break
        else:
            rows.append((list(ids), list(mask)))
            open_rows.append(len(rows) - 1)
        # A row that cannot take even a short conversation is closed: keeps first-fit linear in practice.
        open_rows = [r for r in open_rows if width - len(rows[r][0]) >= 24][-64:]
    for ids, mask in rows:
        missing = width - len(ids)
        ids.extend([pad_id] * missing)
        mask.extend([0] * missing)
    return rows


def cosine_lr(step: int, total: int, lr: float, warmup: int, floor: float) -> float:
    """Linear warm-up over `warmup` steps, then cosine from `lr` down to `floor * lr` at step `total`."""
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return lr * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


def lr_at(step: int, cfg: TrainConfig) -> float:
    return cosine_lr(step, cfg.steps, cfg.lr, cfg.warmup_steps, cfg.min_lr_ratio)


def train(model_config, rows: list[tuple[list[int], list[int]]], cfg: TrainConfig, log_path: Path, name: str):
    """Train a fresh model of `model_config` on packed `rows`; returns it (fp32, eval mode) and the step log."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(cfg.num_threads)
    torch.manual_seed(cfg.seed)
    model = AutoModelForCausalLM.from_config(model_config, attn_implementation="sdpa", dtype=torch.float32)
    model.train()
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "embed" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and "embed" not in n)]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr,
        betas=(0.9, 0.95),
        eps=1e-8,
    )
    ids_all = torch.tensor([r[0] for r in rows], dtype=torch.long)  # [num_rows, seq_len + 1]
    mask_all = torch.tensor([r[1] for r in rows], dtype=torch.bool)
    gen = torch.Generator().manual_seed(cfg.seed)
    perm = torch.randperm(len(rows), generator=gen)
    cursor = 0
    log = []
    start = time.time()
    with open(log_path, "w") as log_file:
        for step in range(cfg.steps):
            if cursor + cfg.batch_size > len(perm):  # next epoch, new order
                perm, cursor = torch.randperm(len(rows), generator=gen), 0
            idx = perm[cursor : cursor + cfg.batch_size]
            cursor += cfg.batch_size
            batch = ids_all[idx]
            labels = batch[:, 1:].masked_fill(~mask_all[idx, 1:], IGNORE)
            for group in opt.param_groups:
                group["lr"] = lr_at(step, cfg)
            t0 = time.time()
            logits = model(input_ids=batch[:, :-1]).logits  # [batch, seq_len, vocab]
            # Own cross-entropy: transformers' `labels=` would shift the already shifted labels again.
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            opt.step()
            opt.zero_grad(set_to_none=True)
            entry = {
                "step": step + 1,
                "loss": round(loss.item(), 4),
                "grad_norm": round(grad_norm.item(), 3),
                "lr": round(lr_at(step, cfg), 6),
                "step_s": round(time.time() - t0, 3),
                "elapsed_s": round(time.time() - start, 1),
            }
            log.append(entry)
            log_file.write(json.dumps(entry) + "\n")
            if (step + 1) % 50 == 0 or step == 0 or step + 1 == cfg.steps:
                log_file.flush()
                print(f"[{name}] " + " ".join(f"{k}={v}" for k, v in entry.items()), flush=True)
    model.eval()
    return model, log


def config_dict(cfg: TrainConfig) -> dict:
    return asdict(cfg)
