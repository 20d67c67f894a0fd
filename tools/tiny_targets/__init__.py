"""Build the bundled tiny targets (dspark_cli/targets/tiny/): corpus, tokenizer, training, evaluation, cards.

    python -m tools.tiny_targets.build_tiny --out dspark_cli/targets/tiny     # run from the repository root
    python -m tools.tiny_targets.eval_tiny tiny-mla                           # the numbers on the card
    python -m tools.tiny_targets.prompt_sets                                  # the bundled tiny prompt sets

Maintainer tools: the dspark package ships the weights and cards they produce, not these modules.
"""
