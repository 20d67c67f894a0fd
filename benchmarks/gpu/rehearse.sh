#!/usr/bin/env bash
# Rehearse the GPU check here, on the CPU, under the GPU image's versions (Python 3.12, torch 2.11.0 --
# its cu130 wheel from PyPI, the GPU image's build, run on the CPU -- transformers 5.17.0): the check's
# `--smoke` installed exactly as run.sh installs it on the GPU machine, then the flex / compile tests.
# A maintainer script, not CI: the torch wheel and its CUDA libraries are ~5 GB in the venv.
#
#   bash benchmarks/gpu/rehearse.sh [--allow-dirty]   # ~25 min on 2 cores -> benchmarks/results/gpu_rehearsal.{json,md}
#
# PY312 (default /root/.pyenv/versions/3.12.1/bin/python3) makes the venv, VENV (default .venv-gpu312,
# git-ignored) holds it; an existing venv is reused. The record is written by benchmarks/provenance.py, which
# runs this script again under it (commit, command, CPU, load during the run): this script writes $RECORD_DATA
# and renders $RECORD_MARKDOWN from it.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ -z "${RECORD_DATA:-}" ]; then
    allow=()
    if [ "${1:-}" = "--allow-dirty" ]; then allow=(--allow-dirty); shift; fi
    exec .venv/bin/python benchmarks/provenance.py run gpu_rehearsal ${allow[@]+"${allow[@]}"} \
        ${RESULTS:+--out-dir "$RESULTS"} -- bash benchmarks/gpu/rehearse.sh "$@"
fi
PY312="${PY312:-/root/.pyenv/versions/3.12.1/bin/python3}"
VENV="${VENV:-.venv-gpu312}"
SITE="$(mktemp -d /tmp/dspark-rehearse-site.XXXXXX)"
WORK="$(mktemp -d /tmp/dspark-rehearse.XXXXXX)"
trap 'rm -rf "$SITE" "$WORK"' EXIT
# the GPU image's packages (device tool: KINDS.md) at its versions where they matter, plus pytest for the tests
IMAGE=(torch==2.11.0 transformers==5.17.0 safetensors tokenizers numpy pyyaml rich huggingface-hub matplotlib click)
if [ ! -x "$VENV/bin/python" ]; then
    "$PY312" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "${IMAGE[@]}" pytest
PY="$VENV/bin/python"
"$PY" -c "import sys, torch, transformers; print(f'rehearse: Python {sys.version.split()[0]}, torch {torch.__version__}, '
          f'transformers {transformers.__version__}, CUDA available: {torch.cuda.is_available()}')"

# 1. the check, installed and run as run.sh does on the GPU machine (wheels for CPython 3.12, offline install)
bash benchmarks/gpu/prepare.sh
mkdir -p "$WORK/out"
start=$(date +%s)
PYTHON="$PY" DSPARK_GPU_SITE="$SITE" OUT="$WORK/out" bash benchmarks/gpu/run.sh --smoke --time-limit 1800 \
    > "$WORK/check.stdout" 2>&1 || true
check_s=$(( $(date +%s) - start ))

# 2. the flex / compile / bf16 tests, from the working tree, with the installed wheels (pydantic, typer)
TESTS=(
    tests/training/test_train_gpu_path.py
    tests/draft/test_draft_numerics.py::test_attention_impls_agree
    tests/training/test_train_runs.py::test_compiled_training_over_static_shapes_gives_the_loss_curve_of_eager
    tests/training/test_train_runs.py::test_bf16_with_fsdp2_mixed_precision_trains_on_two_processes
)
start=$(date +%s)
PYTHONPATH="$PWD:$SITE" "$PY" -m pytest -q -p no:cacheprovider -o addopts="" "${TESTS[@]}" \
    > "$WORK/pytest.txt" 2>&1 || true
tests_s=$(( $(date +%s) - start ))

# 3. the record's data and its rendering (benchmarks/provenance.py adds the provenance and writes both)
"$PY" - "$WORK" "$check_s" "$tests_s" "${TESTS[@]}" <<'EOF'
import json, os, sys
from pathlib import Path
work, check_s, tests_s, tests = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
out = work / "out" / "gpu_check.json"
check = json.loads(out.read_text()) if out.is_file() else {"sections": {}, "environment": {}}
summary = [line for line in (work / "pytest.txt").read_text().splitlines() if line.strip()]
record = {
    "check": check,
    "check_s": check_s,
    "tests": tests,
    "tests_s": tests_s,
    "tests_outcome": [line for line in summary if line.startswith(("FAILED", "ERROR", "SKIPPED"))] + summary[-1:],
}
Path(os.environ["RECORD_DATA"]).write_text(json.dumps(record, indent=2) + "\n")
env = check["environment"]
lines = ["# GPU check rehearsal (CPU, the GPU image's versions)", "",
         f"Python {env.get('python')}, torch {env.get('torch')}, transformers {env.get('transformers')}, "
         f"triton {env.get('triton')}, device {env.get('device')}.", "",
         f"## `check.py --smoke` (installed as run.sh does; {check_s} s)", "",
         "| section | status | wall s |", "|---|---|---|"]
for name, section in check["sections"].items():
    lines.append(f"| {name} | {section['status']} | {section.get('wall_s', '')} |")
lines += ["", f"## flex / compile / bf16 tests ({tests_s} s)", ""] + [f"- `{t}`" for t in tests]
lines += ["", "```", *record["tests_outcome"], "```"]
Path(os.environ["RECORD_MARKDOWN"]).write_text("\n".join(lines) + "\n")
print("\n".join(lines))
EOF
