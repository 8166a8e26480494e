#!/usr/bin/env bash
# The device session behind docs/gpu.md's split-K figures (issue 23, LoRA at full speed), on the GPU
# machine after `bash scripts/gpu-bundle.sh` with the test files it runs copied in (docs/gpu.md,
# "Bundling it"); carry [".gpu", ".gl"]. Parts (PARTS, default all), writing under $OUT:
#   tests    test/engine/webgpu_split_k.test.ts (split-K products on the tensor cores) and
#            test/engine/webgpu_f32_matmul_guard.test.ts (tfjs's float32 product kept off its atomic split-K)
#   splitk   bench/gpu_gemm.ts --only splitk: the 0.5B backward's thin products, split and unsplit
#   lora     recipes/qwen05b_shape_grpo, LoRA rank 32, 16-bit products, split-K on and off (VERL_GEMM_SPLIT_K=0)
#   full     the same recipe, full fine-tuning, split-K on and off (RUNS orders them)
#   update   bench/gpu_decode.ts's actor update at 64 x 96 tokens (the issue's table), split-K on, then off (UPDATE_SPLIT="on off")
#   torch    bench/pytorch_gpu_table.py --only update: PyTorch's update at the same shape on the same GPU
# SPLITK_ARGS adds arguments to the splitk part (e.g. --splitk-targets 256x512,1024x256); PROF=1 runs
# the recipe under Node's --cpu-prof (every thread) and prints bench/profile_summary.ts of each run;
# VERL_LOG_PIPELINES=1 logs each pipeline compiled (dist/bench/pipeline_summary.js RUN.log groups them).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/splitk_session}"
PARTS=",${PARTS:-tests,splitk,lora,full,update},"
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
if [[ $PARTS == *,tests,* ]]; then
  for f in webgpu_split_k webgpu_f32_matmul_guard; do
    timeout 120 bash scripts/gpu-run.sh node dist/test/engine/$f.test.js > "$OUT/test_$f.log" 2>&1
    echo "## test $f"; grep -E "^# |^not ok" "$OUT/test_$f.log" | grep -vE "^# (Subtest|tests|suites|cancelled|todo|duration)" | head -24
  done
fi
if [[ $PARTS == *,splitk,* ]]; then
  timeout "${SPLITK_S:-90}" bash scripts/gpu-run.sh node dist/bench/gpu_gemm.js --only adapter,splitk --reps 20 ${SPLITK_ARGS:-} > "$OUT/splitk.jsonl" 2> "$OUT/splitk.log"
  echo "== splitk exit $?"; grep '"splitk"' "$OUT/splitk.jsonl" | cut -c1-600; tail -3 "$OUT/splitk.log"
fi
grpo() { # name split
  local name=$1 split=$2 prof=""
  [ "${PROF:-0}" = 1 ] && prof="--cpu-prof --cpu-prof-dir=$OUT/prof_$name$split"
  VERL_NODE_FLAGS="$prof" VERL_GEMM_SPLIT_K="$split" OUT="$OUT/$name$split" STEPS="${STEPS:-3}" GRPO_PARTS="$name" PARTS=grpo FULL_S="${GRPO_S:-110}" LORA_S="${GRPO_S:-110}" \
    bash bench/gpu_round3_session.sh 2>&1 | grep -vE "^NVIDIA|^$"
  if [ -n "$prof" ]; then
    bash scripts/gpu-run.sh node dist/bench/profile_summary.js "$OUT/prof_$name$split" --top 45 > "$OUT/prof_$name$split.txt" 2>&1
    head -60 "$OUT/prof_$name$split.txt"; rm -rf "$OUT/prof_$name$split"
  fi
}
# RUNS: which recipe runs, in order, as NAME:SPLIT (SPLIT empty: split-K on; 0: off)
for run in ${RUNS:-lora: full: lora:0 full:0}; do
  name=${run%%:*} split=${run#*:}
  [[ $PARTS == *,$name,* ]] || continue
  echo "## $name, VERL_GEMM_SPLIT_K='$split'"; grpo "$name" "$split"
done
if [[ $PARTS == *,update,* ]]; then
  for mode in ${UPDATE_SPLIT:-on off}; do # split-K on (the default) and off
    split=""; [ "$mode" = off ] && split=0
    VERL_GEMM_SPLIT_K="$split" timeout 120 bash scripts/gpu-run.sh node dist/bench/gpu_decode.js --only update --updates 64x64 --submit 0 --precision f16 --budget-s 90 \
      > "$OUT/update$split.jsonl" 2> "$OUT/update$split.log"
    echo "== update, VERL_GEMM_SPLIT_K='$split': exit $?"; grep '"update_0.5B' "$OUT/update$split.jsonl" | cut -c1-700
  done
fi
if [[ $PARTS == *,torch,* ]]; then
  timeout 150 python3 bench/pytorch_gpu_table.py --only update > "$OUT/torch.jsonl" 2> "$OUT/torch.log"
  echo "== torch exit $?"; cut -c1-400 "$OUT/torch.jsonl"
fi
