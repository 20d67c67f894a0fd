#!/usr/bin/env bash
# Download, here, the wheels the GPU machine needs to run dspark (it has no network), into an ignored
# folder that travels with the working tree:
#
#   bash benchmarks/gpu/prepare.sh                          # CPython 3.12 x86-64 (the GPU image), into .gpu-wheels/
#   bash benchmarks/gpu/prepare.sh --python-version 3.11    # this machine's Python (what the tests use)
#
# The list is benchmarks/gpu/requirements.txt. dspark itself is not downloaded: install.sh builds it from
# the working tree on the other machine.
set -euo pipefail
cd "$(dirname "$0")/../.."
PYVER=3.12
DEST=.gpu-wheels
while [ $# -gt 0 ]; do
    case "$1" in
        --python-version) PYVER="$2"; shift 2 ;;
        --dest) DEST="$2"; shift 2 ;;
        *) echo "usage: bash benchmarks/gpu/prepare.sh [--python-version X.Y] [--dest DIR]" >&2; exit 2 ;;
    esac
done
PIP="${PIP:-python3 -m pip}"
mkdir -p "$DEST"
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
    platforms+=(--platform "$p")
done
$PIP download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    --python-version "$PYVER" --implementation cp "${platforms[@]}" \
    -d "$DEST" -r benchmarks/gpu/requirements.txt
# the commit and dirty sources the device run's record names (the device's copy of the tree has no git)
python3 benchmarks/provenance.py stamp gpu_check > "$DEST/record.env"
echo "prepare: $(ls "$DEST" | wc -l) wheels for CPython $PYVER in $DEST ($(du -sh "$DEST" | cut -f1))"
