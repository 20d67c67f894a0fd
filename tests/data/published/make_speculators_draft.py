"""Write tests/data/published/speculators-tiny-gqa/: a DSpark draft saved by speculators 0.9.0's own code.

    benchmarks/peers/.venv-speculators/bin/python tests/data/published/make_speculators_draft.py

Built the way `speculators train` builds a draft (speculators/train/cli.py): the draft decoder's
`transformer_layer_config` from the verifier (`create_transformer_layer_config`, here the bundled
`tiny-gqa` target: hidden 160, vocab 4096, 6 layers), then `DSparkDraftModel.from_training_args`
(which also loads the verifier's embedding and lm_head, as training does), random weights from a fixed
seed, and speculators' own `save_pretrained` (config.json + model.safetensors, the embedding and
lm_head left out as speculators always does). Kept small: one draft layer, a narrow MLP, Markov rank 4,
bfloat16. The verifier is recorded as the bundled target's name, `tiny-gqa` (what a published draft
names: a hub id, not a path on the machine that made it).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import torch
from speculators.models.dspark import DSparkDraftModel
from speculators.train.cli import create_transformer_layer_config

HERE = Path(__file__).resolve().parent
TARGET = HERE.parents[2] / "dspark_cli" / "targets" / "tiny" / "tiny-gqa"
OUT = HERE / "speculators-tiny-gqa"
AUX_LAYER_IDS = [2, 5]  # speculators' convention (hidden_states index): vLLM's target_layer_ids [1, 4]
MASK_TOKEN_ID = 3


def main() -> None:
    torch.manual_seed(0)
    layer_config = create_transformer_layer_config(
        verifier_name_or_path=str(TARGET),
        num_layers=1,
        draft_arch="qwen3",
        hidden_act=None,
        sliding_window=0,
        full_attention_indices=[0],
    )
    layer_config.intermediate_size = 64  # small enough to commit
    model = DSparkDraftModel.from_training_args(
        verifier_config=layer_config,
        verifier_name_or_path=str(TARGET),
        draft_vocab_size=layer_config.vocab_size,
        block_size=4,
        target_layer_ids=AUX_LAYER_IDS,
        mask_token_id=MASK_TOKEN_ID,
        markov_rank=4,
        draft_attn_impl="sdpa",
    )
    model.config.speculators_config.verifier.name_or_path = "tiny-gqa"
    model = model.to(torch.bfloat16)
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        if OUT.exists():
            shutil.rmtree(OUT)
        OUT.mkdir()
        for name in ("config.json", "model.safetensors"):
            shutil.copyfile(Path(tmp) / name, OUT / name)
        left = sorted(p.name for p in Path(tmp).iterdir() if p.name not in ("config.json", "model.safetensors"))
    from importlib.metadata import version

    (OUT / "README.md").write_text(
        f"A tiny DSpark draft for the bundled `tiny-gqa` target, random weights, saved by speculators "
        f"{version('speculators')}'s own `save_pretrained` (speculators format); of the files it wrote, config.json and model.safetensors (it also writes `config.py`, the config class source its `auto_map` names, which dspark refuses as code and vLLM does not need).\n"
        f"Made by `benchmarks/peers/.venv-speculators/bin/python tests/data/published/make_speculators_draft.py`.\n"
    )
    config = json.loads((OUT / "config.json").read_text())
    print(f"wrote {OUT}: {config['architectures']}, other files save_pretrained wrote: {left or 'none'}")


if __name__ == "__main__":
    main()
