#!/usr/bin/env bash
# On the GPU machine (carry .gpu and .gl, built here by scripts/gpu-llama-bundle.sh): the
# 0.5B-shaped GRPO recipe (recipes/qwen05b_shape_grpo) for STEPS steps (default 5), rollout on
# llama.cpp's Vulkan build (rollout.name=llama_cpp, weights synced by GGUF each step), log-probs
# and the update on WebGPU (trainer.device=webgpu); then the timing_s/* of every step.
#   bash scripts/gpu-qwen05b-grpo.sh [extra overrides]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/qwen05b_grpo}"
mkdir -p "$OUT"
STEPS="${STEPS:-5}" OUT="$OUT" VERL="bash $PWD/scripts/gpu-llama-run.sh verl" TOKENIZER=.gpu/stories260K/tok512.bin \
  bash recipes/qwen05b_shape_grpo/run.sh custom_reward_function.path="$PWD/.gpu/reward.mjs" trainer.device=webgpu \
  actor_rollout_ref.rollout.engine_kwargs.llama_cpp.gpu=vulkan "$@"
python3 - "$OUT/metrics.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    m = json.loads(line)
    d = m.get("data", m)
    step = d.get("training/global_step", m.get("step"))
    t = {k: round(v, 2) for k, v in d.items() if k.startswith("timing_s/")}
    print(f"step {step}:", " ".join(f"{k}={v}" for k, v in sorted(t.items())),
          f"rollout_corr/kl={d.get('rollout_corr/kl')}", f"response_length/mean={d.get('response_length/mean')}")
PY
