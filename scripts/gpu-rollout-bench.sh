#!/usr/bin/env bash
# On the GPU machine (carry .gpu and .gl, built by scripts/gpu-llama-bundle.sh): the rollout engines
# side by side at issue 17's size (bench/rollout_engines.ts): the 0.5B-shaped policy, 64 prompts x 8
# samples x 256 new tokens on llama.cpp's Vulkan build (f32 and f16 GGUF weights, f32 KV cache), and
# the host decoder on 8 rows x 16 tokens. JSON to $OUT/rollout_engines.json (rewritten after each phase).
#   bash scripts/gpu-rollout-bench.sh [extra bench flags, e.g. --weights f32 --kv f16]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp}"
bash scripts/gpu-llama-run.sh node dist/bench/rollout_engines.js --shape 0.5b --prompts 64 --n 8 --new 256 \
  --gpu vulkan --weights f32,f16 --host-rows 8 --host-new 16 --tokenizer .gpu/stories260K/tok512.bin \
  --out "$OUT/rollout_engines.json" "$@"
