"""Helpers for the bench tests: table models that speak the engine's Target / Drafter protocols,
a chi-square p-value, and tiny random transformers targets with matching random DSpark drafts."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import torch

from dspark_cli.bench.engine import Proposal


def chi_square_pvalue(observed: torch.Tensor, expected: torch.Tensor) -> tuple[float, int, float]:
    """(statistic, df, p-value) of Pearson's test; cells with expected 0 must be empty."""
    observed, expected = observed.double(), expected.double()
    keep = expected > 0
    assert observed[~keep].sum() == 0, "a sequence the target can never produce was emitted"
    stat = float(((observed[keep] - expected[keep]) ** 2 / expected[keep]).sum())
    df = int(keep.sum()) - 1
    p = torch.special.gammaincc(
        torch.tensor(df / 2.0, dtype=torch.float64), torch.tensor(stat / 2.0, dtype=torch.float64)
    )
    return stat, df, float(p)


class TableLM:
    """Logits of the next token from (position mod 3, token two back, previous token): a tiny 'LM'."""

    def __init__(self, vocab: int, seed: int, scale: float = 1.5) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.vocab = vocab
        self.table = scale * torch.randn(3, vocab + 1, vocab + 1, vocab, generator=gen)  # vocab = "none"

    def logits(self, prefix: list[int]) -> torch.Tensor:
        prev1 = prefix[-1] if prefix else self.vocab
        prev2 = prefix[-2] if len(prefix) > 1 else self.vocab
        return self.table[len(prefix) % 3, prev2, prev1]


class TableTarget:
    """The engine's Target protocol over a TableLM; aux row of a position = its token id (1 feature)."""

    def __init__(self, lm: TableLM) -> None:
        self.lm, self.vocab_size = lm, lm.vocab
        self.tokens: list[int] = []

    def reset(self) -> None:
        self.tokens = []

    def forward(self, token_ids: list[int], last_only: bool = False):
        logits = []
        for token in token_ids:
            self.tokens.append(token)
            logits.append(self.lm.logits(self.tokens))
        return torch.stack(logits), torch.tensor(token_ids, dtype=torch.float32).unsqueeze(-1)

    def crop(self, length: int) -> None:
        assert length <= len(self.tokens)
        self.tokens = self.tokens[:length]


class TableDrafter:
    """Drafts from another TableLM given the verified prefix it was told about (its context cache)."""

    has_confidence = True

    def __init__(self, lm: TableLM) -> None:
        self.lm = lm
        self.context: list[int] = []

    def begin(self, aux: torch.Tensor) -> None:
        self.context = [int(x) for x in aux[:, 0].tolist()]

    def accept(self, aux: torch.Tensor) -> None:
        self.context += [int(x) for x in aux[:, 0].tolist()]

    def end(self) -> None:
        pass

    def propose(self, anchor, *, temperature, greedy, num_tokens, generator, history=None):
        prefix = [*self.context, anchor]
        tokens, logits = [], []
        for _ in range(num_tokens):
            row = self.lm.logits(prefix)
            if greedy:
                token = int(row.argmax())
            else:
                token = int(torch.multinomial((row / temperature).softmax(-1), 1, generator=generator))
            tokens.append(token)
            logits.append(row)
            prefix.append(token)
        confidence = torch.full((num_tokens,), 0.8)
        return Proposal(torch.tensor(tokens), None if greedy else torch.stack(logits), confidence)


def table_law(lm: TableLM, prompt: list[int], length: int, temperature: float, top_p: float) -> torch.Tensor:
    """Exact probability of every continuation of `length` tokens, lexicographic order."""
    from dspark_cli.bench.verify import target_probs

    law = []
    for seq in itertools.product(range(lm.vocab), repeat=length):
        value, prefix = 1.0, list(prompt)
        for token in seq:
            value *= float(target_probs(lm.logits(prefix), temperature, top_p)[token])
            prefix.append(token)
        law.append(value)
    return torch.tensor(law, dtype=torch.float64)


# -- tiny random transformers targets with matching random DSpark drafts ------------------------------

TINY_HIDDEN, TINY_VOCAB, TINY_LAYERS, TINY_LAYER_IDS = 64, 96, 4, [0, 1, 3]


def tiny_random_target(seed: int = 0):
    """A 4-layer random Qwen3 with a vocabulary of 96 (logits scaled so greedy text is not constant)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=TINY_VOCAB,
        hidden_size=TINY_HIDDEN,
        intermediate_size=128,
        num_hidden_layers=TINY_LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        eos_token_id=TINY_VOCAB - 2,
        bos_token_id=TINY_VOCAB - 2,
        pad_token_id=0,
    )
    model = Qwen3ForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(25.0)
    return model


def write_random_draft(directory: Path, *, block_size: int = 4, seed: int = 0, confidence_bias: float = 2.0) -> Path:
    """An exported-format random GQA draft for `tiny_random_target` (config.json + model.safetensors)."""
    from safetensors.torch import save_file

    from dspark_cli.draft.build import draft_config_from_values
    from dspark_cli.draft.config import vllm_config_dict
    from dspark_cli.draft.model import DSparkDraftModel

    cfg = draft_config_from_values(
        arch="gqa",
        target_hidden_size=TINY_HIDDEN,
        vocab_size=TINY_VOCAB,
        num_layers=1,
        block_size=block_size,
        target_layer_ids=TINY_LAYER_IDS,
        target_num_hidden_layers=TINY_LAYERS,
        markov_rank=8,
        mask_token_id=TINY_VOCAB - 1,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        intermediate_size=128,
        rope_theta=10000.0,
    )
    model = DSparkDraftModel(cfg)
    model.init_weights(std=0.05, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        model.confidence_head.proj.bias.fill_(confidence_bias)
    directory.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps(vllm_config_dict(cfg, "float32")), encoding="utf-8")
    return directory


def export_random_draft(recipe, directory: Path, *, seed: int = 0) -> Path:
    """A freshly initialised draft for the recipe's target, exported by `dspark export` (contract, manifest)."""
    import dataclasses

    from safetensors.torch import save_file

    from dspark_cli.capture.plan import contract_for_recipe, resolve_layer_ids
    from dspark_cli.draft.config import vllm_config_dict
    from dspark_cli.draft.model import DSparkDraftModel
    from dspark_cli.export.writer import export_draft
    from dspark_cli.targets import Target
    from dspark_cli.training.run import build_draft_config

    config = build_draft_config(recipe, resolve_layer_ids(recipe, Target.of(recipe).geometry().num_hidden_layers))
    model = DSparkDraftModel(config)
    model.init_weights(generator=torch.Generator().manual_seed(seed))
    train = directory.parent / f"{directory.name}-train"
    (train / "final").mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(train / "final" / "model.safetensors"))
    (train / "final" / "config.json").write_text(json.dumps(vllm_config_dict(config, "float32")), encoding="utf-8")
    contract = dataclasses.replace(
        contract_for_recipe(recipe), mask_token_id=config.mask_token_id, block_size=config.block_size
    )
    (train / "manifest.json").write_text(
        json.dumps(
            {
                "kind": "dspark.train",
                "complete": True,
                "contract": contract.to_dict(),
                "recipe": recipe.model_dump(mode="json"),
            }
        ),
        encoding="utf-8",
    )
    export_draft(train, directory, recipe=recipe, dtype="float32", force=True)
    return directory


# -- published-draft benches (tests/bench/test_bench_published.py, test_bench_many.py) ------------------------

# the recipe every such run is given (a published draft carries none): the tiny-gqa target, block size 4
PUBLISHED_RECIPE = ["--recipe", "tiny", "target.model=tiny-gqa", "draft.arch=gqa", "draft.block_size=4"]
SMALL_BENCH = [
    "bench.datasets=[mt_bench]",
    "bench.num_prompts=1",
    "bench.max_tokens=16",
    "bench.temperatures=[0.0, 1.0]",
    "bench.confidence_thresholds=[0.0, 0.5]",
    "bench.model_concurrency=[1, 4]",
]
