#!/usr/bin/env bash
# On the GPU machine (after scripts/gpu-bundle.sh; carry [".gpu", ".gl"]): runs
# bench/gpu_shutdown.ts in the variants docs/gpu.md reports, one process each, and prints each
# exit code (139 = segmentation fault). Usage: bash scripts/gpu-shutdown-probe.sh ["ARGS" ...]
set -uo pipefail
cd "$(dirname "$0")/.."
[ $# -gt 0 ] || set -- "--ranks 2" "--ranks 2" "--ranks 2" "--ranks 2" "--ranks 2" "--ranks 2" \
  "--ranks 2 --no-hook" "--ranks 2 --no-hook" "--ranks 2 --no-hook" "--ranks 2 --no-hook" "--ranks 1" "--ranks 2 --driver-gpu"
for args in "$@"; do
  t0=$(date +%s%N)
  timeout 120 bash scripts/gpu-run.sh node dist/bench/gpu_shutdown.js $args 2>&1 | grep -v "^v20" | tail -4
  rc=${PIPESTATUS[0]}
  echo "== $args: rc $rc in $(( ($(date +%s%N) - t0) / 1000000 )) ms"
done
