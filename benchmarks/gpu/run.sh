#!/usr/bin/env bash
# The command the GPU machine runs (device tool, `carry: [".gpu-wheels"]`, timeout_s 600), twice:
#
#   bash benchmarks/gpu/run.sh --sections throughput,numerics --time-limit 540   # call 1: the most valuable rows
#   bash benchmarks/gpu/run.sh --sections pipeline,fsdp --time-limit 540         # call 2
#
# Each installs dspark + wheels into /tmp/dspark-site (~20 s) and runs check.py.
#
# Results: $OUT/gpu_check.json and $OUT/gpu_check.log (benchmarks/results/ when OUT is unset); the JSON is a
# record (benchmarks/provenance.py) naming the commit prepare.sh stamped into the wheels folder.
# Prepare first, here, right before the device calls: bash benchmarks/gpu/prepare.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON="${PYTHON:-python3}"
SITE="${DSPARK_GPU_SITE:-/tmp/dspark-site}"
WHEELS="${DSPARK_GPU_WHEELS:-.gpu-wheels}"
OUTDIR="${OUT:-benchmarks/results}"
mkdir -p "$OUTDIR"
PYTHON="$PYTHON" bash benchmarks/gpu/install.sh "$SITE" "$WHEELS"
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" PATH="$SITE/bin:$PATH" PYTHONUNBUFFERED=1 \
    HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false HF_HUB_DISABLE_PROGRESS_BARS=1
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
if [ -f "$WHEELS/record.env" ]; then set -a; . "$WHEELS/record.env"; set +a; fi
"$PYTHON" benchmarks/provenance.py run gpu_check --out-dir "$OUTDIR" --data "$OUTDIR/gpu_check.json" \
    -- "$PYTHON" benchmarks/gpu/check.py --out "$OUTDIR/gpu_check.json" "$@" 2>&1 | tee "$OUTDIR/gpu_check.log"
