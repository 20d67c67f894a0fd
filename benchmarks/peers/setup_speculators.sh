#!/usr/bin/env bash
# speculators 0.9.0 (vLLM's training project) in its own virtual environment (never the project's .venv), CPU only.
#
#   bash benchmarks/peers/setup_speculators.sh        # -> benchmarks/peers/.venv-speculators (ignored by git)
#
# speculators 0.9.0 requires torch<=2.14.1 plus torchvision and torchaudio, which nothing in its training
# path imports (checked: no import of either in the wheel); an unpinned torchvision/torchaudio would pull
# a second torch build. So: torch 2.13.0 first (the local CPU wheel), then speculators and hs-connectors
# (its hidden-state file reader, same release) with --no-deps, then its remaining runtime requirements
# from its METADATA at their caps.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/venv.sh"
peer_venv "${SPECULATORS_VENV:-$here/.venv-speculators}" speculators==0.9.0 hs-connectors==0.9.0 -- \
  "transformers>=5.0.0,<=5.19.0" "datasets>=4.0.0,<=5.1.0" "loguru>=0.7.2,<=0.7.3" "numpy>=2.0.0,<=2.5.4" \
  "tqdm>=4.66.3,<=4.70.1" aiohttp click httpx huggingface-hub "openai>=2.0.0" protobuf psutil "pydantic>=2.0.0" \
  "pydantic-settings>=2.0.0" rich safetensors "typer>=0.12.0" -- \
  "import torch, speculators.train.trainer, speculators.models.dspark; print('speculators', __import__('importlib.metadata').metadata.version('speculators'), 'torch', torch.__version__)"
