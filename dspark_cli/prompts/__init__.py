"""Prompts: where conversations come from, read the same way by datagen (to regenerate) and bench (to measure).

    from dspark_cli.prompts.sources import read_source
    for conversation in read_source(PromptSource(path="tiny-prompts")): ...

- sources.py       local JSONL / JSON / Parquet files, bundled sets by name, Hugging Face datasets
- conversation.py  `Conversation` and the record formats (messages, ShareGPT, prompt/response)
- bundled.py       the prompt sets shipped in bundled/ (tiny-prompts, tiny-eval, tiny-requests, MT-Bench + notice)
"""
