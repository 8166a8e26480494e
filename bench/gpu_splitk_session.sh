#!/usr/bin/env bash
# The device session behind docs/gpu.md's split-K figures (issue 23, LoRA at full speed), on the GPU
# machine after `bash scripts/gpu-bundle.sh` with the test files it runs copied in (docs/gpu.md,
# "Bundling it"); carry [".gpu", ".gl"]. Parts (PARTS, default all), writing under $OUT:
#   tests    test/engine/webgpu_split_k.test.ts (split-K products on the tensor cores)
#   splitk   bench/gpu_gemm.ts --only splitk: the 0.5B backward's thin products, split and unsplit
#   lora     recipes/qwen05b_shape_grpo, LoRA rank 32, 16-bit products, split-K on and off (VERL_GEMM_SPLIT_K=0)
#   full     the same recipe, full fine-tuning, split-K on and off (RUNS orders them)
#   update   bench/gpu_decode.ts's actor update at 64 x 96 tokens (the issue's table), split-K on, then off
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/splitk_session}"
PARTS=",${PARTS:-tests,splitk,lora,full,update},"
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
if [[ $PARTS == *,tests,* ]]; then
  timeout 120 bash scripts/gpu-run.sh node dist/test/engine/webgpu_split_k.test.js > "$OUT/test_split_k.log" 2>&1
  grep -E "^# (pass|fail|skip)|^not ok|rel|split" "$OUT/test_split_k.log" | head -12
fi
if [[ $PARTS == *,splitk,* ]]; then
  timeout "${SPLITK_S:-90}" bash scripts/gpu-run.sh node dist/bench/gpu_gemm.js --only adapter,splitk --reps 20 > "$OUT/splitk.jsonl" 2> "$OUT/splitk.log"
  echo "== splitk exit $?"; grep '"splitk"' "$OUT/splitk.jsonl" | cut -c1-600; tail -3 "$OUT/splitk.log"
fi
grpo() { # name split
  local name=$1 split=$2
  VERL_GEMM_SPLIT_K="$split" OUT="$OUT/$name$split" STEPS="${STEPS:-3}" GRPO_PARTS="$name" PARTS=grpo FULL_S="${GRPO_S:-110}" LORA_S="${GRPO_S:-110}" \
    bash bench/gpu_round3_session.sh 2>&1 | grep -vE "^NVIDIA|^$"
}
# RUNS: which recipe runs, in order, as NAME:SPLIT (SPLIT empty: split-K on; 0: off)
for run in ${RUNS:-lora: full: lora:0 full:0}; do
  name=${run%%:*} split=${run#*:}
  [[ $PARTS == *,$name,* ]] || continue
  echo "## $name, VERL_GEMM_SPLIT_K='$split'"; grpo "$name" "$split"
done
if [[ $PARTS == *,update,* ]]; then
  for split in "" 0; do
    VERL_GEMM_SPLIT_K="$split" timeout 120 bash scripts/gpu-run.sh node dist/bench/gpu_decode.js --only update --updates 64x64 --submit 0 --precision f16 --budget-s 90 \
      > "$OUT/update$split.jsonl" 2> "$OUT/update$split.log"
    echo "== update, VERL_GEMM_SPLIT_K='$split': exit $?"; grep '"update_0.5B' "$OUT/update$split.jsonl" | cut -c1-700
  done
fi
