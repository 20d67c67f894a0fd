"""Training raises expected acceptance length, and the logged tau agrees with real speculative decoding.

    .venv/bin/python -m pytest tests/training/test_train_tau.py -q        # ~40 s on 2 cores

Target: the random tiny Qwen3 of train_fixtures (hidden 64, 4 layers, vocab 256, peaked), data: its
own greedy continuations. The draft is trained in-process with `run_train`, then measured twice on
held-out prompts: teacher-forced (`evaluate_draft`, every position an anchor: the metric training
logs, and decoding replayed on those acceptances) and by greedy speculative decoding in the reference
engine (dspark_cli/bench/engine.py, the target verifying every block as vLLM does). With greedy data,
teacher forcing sees exactly the prefixes real decoding sees while drafts are accepted, so the replay
matches decoding; the logged mean differs only in weighting every position alike.
"""

from __future__ import annotations

import pytest
import torch
import train_fixtures

pytestmark = (
    pytest.mark.slow
)  # every test here runs dspark stages in processes (torchrun, producers, training): minutes


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from dspark_cli.training.run import run_train

    torch.set_num_threads(1)
    work = tmp_path_factory.mktemp("tau")
    target = train_fixtures.make_target(work / "target")
    train = train_fixtures.make_sequences(target, num=32, seed=0)
    held_out = train_fixtures.make_sequences(target, num=8, seed=1)
    recipe = train_fixtures.tiny_recipe(
        work,
        [
            "train.max_steps=150",
            "train.log_every=50",
            "train.checkpoint_every=150",
            "train.lr=5e-3",
            "train.warmup_steps=10",
            "train.num_anchors=24",
        ],
    )
    summary = run_train(recipe, resume="never", sequences=lambda: iter(train))
    return work, target, held_out, summary


def test_trained_tau_rises_far_above_an_untrained_draft(trained):
    from dspark_cli.draft.model import DSparkDraftModel
    from dspark_cli.targets import Target
    from dspark_cli.training.evaluate import evaluate_draft, load_trained_draft

    work, target, held_out, _ = trained
    model = load_trained_draft(work / "run" / "train", Target.named(str(target)))
    untrained = DSparkDraftModel(model.config)
    untrained.init_weights(generator=torch.Generator().manual_seed(0))
    untrained.set_target_embeddings(*Target.named(str(target)).embeddings())
    before = evaluate_draft(untrained, held_out, num_anchors=1000)
    after = evaluate_draft(model, held_out, num_anchors=1000)
    print(
        f"tau greedy {before['tau_greedy']:.2f} -> {after['tau_greedy']:.2f}, "
        f"T=1 {before['tau_t1']:.2f} -> {after['tau_t1']:.2f}"
    )
    assert before["tau_greedy"] < 1.3 and before["tau_t1"] < 1.6
    assert after["tau_greedy"] > before["tau_greedy"] + 1.0
    assert after["tau_t1"] > before["tau_t1"] + 0.5
    assert after["acc_slot"][0] > 0.6


def test_logged_tau_agrees_with_real_greedy_speculative_decoding(trained):
    from dspark_cli.bench.engine import DSparkDrafter, HFTarget, Sampling, Speculation, SpeculativeEngine
    from dspark_cli.targets import Target
    from dspark_cli.training.evaluate import evaluate_draft, load_trained_draft

    work, target, held_out, _ = trained
    metric = evaluate_draft(
        load_trained_draft(work / "run" / "train", Target.named(str(target))), held_out, num_anchors=1000
    )
    engine_target = HFTarget.load(str(target), train_fixtures.LAYER_IDS, dtype="float32", device="cpu")
    drafter = DSparkDrafter.from_dir(str(work / "run" / "train"), engine_target)
    engine = SpeculativeEngine(engine_target, drafter, Speculation(4, "greedy", "standard"))
    accepted = steps = 0
    for seq in held_out:
        prompt = seq.input_ids[: train_fixtures.PROMPT].tolist()
        out = engine.generate(
            prompt, Sampling(temperature=0.0, max_tokens=train_fixtures.LENGTH - train_fixtures.PROMPT)
        )
        assert out.token_ids == seq.input_ids[train_fixtures.PROMPT :].tolist()[: len(out.token_ids)]  # lossless
        accepted += sum(out.accepted)
        steps += out.num_steps
    real_tau = (accepted + steps) / steps
    print(
        f"teacher-forced tau: mean {metric['tau_greedy']:.2f}, replayed {metric['tau_greedy_decode']:.2f}; "
        f"speculative decoding tau {real_tau:.2f}"
    )
    assert real_tau > 2.0
    # replaying decoding on the teacher-forced acceptances is what decoding measures (up to the end of each
    # text, where the engine keeps drafting past max_tokens as vLLM counts it)
    assert abs(real_tau - metric["tau_greedy_decode"]) <= 0.08 * real_tau
    # the logged mean over anchors: within 20% even on this cyclic text (easy cycles, hard tails), the case
    # that biases it most; on natural text it was within 3% (benchmarks/results/train_tau.md)
    assert abs(real_tau - metric["tau_greedy"]) <= 0.2 * real_tau
