#!/usr/bin/env bash
# Install dspark and the wheels prepare.sh downloaded into a folder, offline, without touching the
# machine's own packages (runs on the GPU machine; the tests run it here into a clean venv):
#
#   bash benchmarks/gpu/install.sh /tmp/site && export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
#
# --no-deps everywhere: torch, transformers & co. are the machine's own. dspark is built from the working
# tree (build isolation takes setuptools and wheel from the same folder, so nothing is fetched).
set -euo pipefail
cd "$(dirname "$0")/../.."
SITE="${1:?usage: bash benchmarks/gpu/install.sh TARGET_DIR [WHEELS_DIR]}"
WHEELS="${2:-.gpu-wheels}"
PYTHON="${PYTHON:-python3}"
ls "$WHEELS"/*.whl >/dev/null 2>&1 || { echo "install: no wheels in $WHEELS; run benchmarks/gpu/prepare.sh first" >&2; exit 2; }
pip_install() {
    "$PYTHON" -m pip install --quiet --disable-pip-version-check --no-index --no-deps --no-compile \
        --no-cache-dir --upgrade --target "$SITE" "$@"
}
deps=()
for w in "$WHEELS"/*.whl; do
    case "$(basename "$w")" in setuptools-*|wheel-*) ;; *) deps+=("$w") ;; esac
done
pip_install "${deps[@]}"
pip_install --find-links "$WHEELS" .
echo "install: dspark and ${#deps[@]} wheels in $SITE"
