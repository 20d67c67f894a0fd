#!/usr/bin/env bash
# SpecForge 0.2.0 in its own virtual environment (never the project's .venv), CPU only.
#
#   bash benchmarks/peers/setup_specforge.sh          # -> benchmarks/peers/.venv-specforge (ignored by git)
#
# specforge 0.2.0 pins torch==2.11.0 and sglang==0.5.14. Both are for its GPU paths: an unpinned
# torch pulls a multi-GB CUDA build and sglang only serves its online capture, which we do not use
# (we hand it offline features). So: torch 2.13.0 first (the local CPU wheel), then specforge with
# --no-deps, then its remaining runtime requirements from its METADATA, transformers at its pin.
# Left out and why: sglang (online capture server), yunchang (sequence-parallel attention, USP only),
# wandb / tensorboard (tracking off), openai-harmony (gpt-oss chat template only).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/venv.sh"
peer_venv "${SPECFORGE_VENV:-$here/.venv-specforge}" specforge==0.2.0 -- \
  "transformers==5.8.1" datasets accelerate huggingface-hub numpy pydantic psutil pyyaml safetensors requests tqdm \
  typing-extensions -- \
  "import torch, specforge.cli, specforge.modeling.draft.dspark; print('specforge', __import__('importlib.metadata').metadata.version('specforge'), 'torch', torch.__version__)"
