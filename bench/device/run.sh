#!/usr/bin/env bash
# Runs on the machine bench/device/pack.sh packed for: unpacks Node, then runs the
# suite's actor-update benchmark and the PyTorch reference (bench/pytorch_actor_update.py,
# with that machine's python3) on the same CPU, pinned to the same 2 cores (the project
# machine's count); BENCHES (run-all --only syntax) names other or further benchmarks.
# Results (JSON lines) go to ${OUT:-outputs/bench/device}.
set -euo pipefail
cd "$(dirname "$0")/../.."
DEST=dist-bench/device
RESULTS="${OUT:-outputs/bench/device}"
mkdir -p "$RESULTS"
[ -x /tmp/node ] || python3 -c "import lzma,shutil; shutil.copyfileobj(lzma.open('$DEST/node.xz'), open('/tmp/node','wb'))"
chmod +x /tmp/node
export VERL_SHARED_DIR="$PWD/$DEST/shared" VERL_LOG_LEVEL=warn PYTHONUNBUFFERED=1
PIN=()
if taskset -c 0,1 true 2>/dev/null; then PIN=(taskset -c 0,1); fi
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2) cores: $(nproc) pinned: ${PIN[*]:-no} load: $(cut -d' ' -f1-3 /proc/loadavg)"
"${PIN[@]}" /tmp/node "$DEST/dist/bench/run-all.js" --only "${BENCHES:-actor_update,pytorch_actor_update}" --out "$RESULTS/results.jsonl"
