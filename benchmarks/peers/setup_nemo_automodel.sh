#!/usr/bin/env bash
# NeMo AutoModel 0.7.0 in its own virtual environment (never the project's .venv), CPU only.
#
#   bash benchmarks/peers/setup_nemo_automodel.sh     # -> benchmarks/peers/.venv-nemo-automodel (ignored by git)
#
# nemo_automodel 0.7.0 requires torch>=2.8.0 (unpinned: pip would pull a multi-GB CUDA build), so: torch
# 2.13.0 first (the local CPU wheel), then nemo_automodel with --no-deps, then the runtime requirements
# from its METADATA that its DSpark recipe imports, transformers at its pin, and pillow (imported by its
# datasets package, not declared).
# Left out and why: quack-kernels (CUDA CuTe-DSL kernels), flashoptim (fused CUDA optimizers; the recipe
# uses torch's AdamW unless configured), mistral-common (Mistral tokenizers only), ninja (JIT CUDA builds).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/venv.sh"
peer_venv "${NEMO_AUTOMODEL_VENV:-$here/.venv-nemo-automodel}" nemo_automodel==0.7.0 -- \
  "transformers==5.18.0" "datasets>=4.0.0" pyyaml tiktoken torchdata "torchao>=0.16.0" "megatron-fsdp==0.5.0" \
  safetensors pillow -- \
  "import torch, nemo_automodel.recipes.llm.train_dspark; print('nemo_automodel', __import__('importlib.metadata').metadata.version('nemo_automodel'), 'torch', torch.__version__)"
