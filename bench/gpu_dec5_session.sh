#!/usr/bin/env bash
# The device calls behind docs/gpu.md's 2026-12-05 figures (issue 23), on the GPU machine after
# `bash scripts/gpu-bundle.sh` here (carry [".gpu", ".gl"]). Parts (PARTS), each with its own limit:
#   ranks2   recipes/qwen05b_shape_grpo, 16-bit, two rank threads on the one GPU, with
#            VERL_PROFILE_UPDATE=1 (the optimizer step's read-back, collective and upload per rank)
#   lora     the same recipe with LoRA (rank 32), one rank, profiled
#   prof     bench/gpu_decode.ts's actor update (64 x 96, f16) under Node's --cpu-prof (xz'd under $OUT)
#   rollout  the WebGPU decoder (512 x 256 new tokens, vocabulary 151,936, f16) beside HF generate on
#            the same GPU (bench/pytorch_gpu_table.py --only rollout)
#   torch    PyTorch's matmul and update on the same GPU (bench/pytorch_gpu_table.py --only matmul,update)
#   table    the issue's table in one call: the default tensor-core GEMM at 4096^3 (both toggle sets), the
#            actor update (64 x 96, f16), the decoder (512 x 256, vocabulary 512 and 151,936, f16), then
#            PyTorch's matmul, update and HF generate (bench/pytorch_gpu_table.py)
#   fused    bench/gpu_fused_layers.ts: the actor update (0.5B shape, 24 layers, 64 x 96, bf16) with the fused
#            RMSNorm/SwiGLU kernels and with the composites, dispatches and ms each, one process (the fused
#            layers' and attention's tests first)
#   staged   bench/gpu_gemm.ts: the staged kernels under both toggle sets, and the first staged kernel (debug, staged_old)
#   pydata   test/data/python_data.test.ts with VERL_PYTHON set to the machine's python3 (it has transformers):
#            verl's Python dataset class with Hugging Face's tokenizer (needs the compiled tests in
#            .gpu/app/dist/test: `cp -r dist-gpu/test .gpu/app/dist/`)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/dec5}"
PARTS=",${PARTS:-ranks2,lora,prof},"
mkdir -p "$OUT"
if [[ $PARTS == *,fused,* ]]; then
  # the kernels against the composites on the H200 first (values, gradients, same bits twice)
  timeout 120 bash scripts/gpu-run.sh node dist/test/engine/webgpu_fused_layers.test.js > "$OUT/fused_test.log" 2>&1
  echo "== fused test exit $?"; grep -E "^# (pass|fail|skip)|^not ok" "$OUT/fused_test.log" | head -6
  timeout 120 bash scripts/gpu-run.sh node dist/test/engine/webgpu_fused_attention.test.js > "$OUT/fused_attention_test.log" 2>&1
  echo "== fused attention test exit $?"; grep -E "^# (pass|fail|skip)|^not ok|dispatches" "$OUT/fused_attention_test.log" | head -8
  timeout 120 bash scripts/gpu-run.sh node dist/test/engine/webgpu_fused_rope.test.js > "$OUT/fused_rope_test.log" 2>&1
  echo "== fused rope test exit $?"; grep -E "^# (pass|fail|skip)|^not ok" "$OUT/fused_rope_test.log" | head -6
  timeout "${FUSED_S:-170}" bash scripts/gpu-run.sh node dist/bench/gpu_fused_layers.js --shape 0.5b --layers 24 --rows 64 --micro 64 \
    --prompt 32 --response 64 --reps 3 --precision bf16 > "$OUT/fused.jsonl" 2> "$OUT/fused.log"
  echo "== fused exit $?"; grep '^{' "$OUT/fused.jsonl" | cut -c1-900; tail -3 "$OUT/fused.log" | cut -c1-300
fi
if [[ $PARTS == *,staged,* ]]; then
  # the staged kernels after the CPU checker (test/engine/webgpu_gemm_sim.test.ts): right under default toggles,
  # wrong only under disable_robustness? and the first staged kernel's double-buffer fix
  timeout "${STAGED_S:-110}" bash scripts/gpu-run.sh node dist/bench/gpu_gemm.js --only sweep --toggles default,disable_robustness \
    --candidates staged_2x2_4x4_k2_b1,staged_2x2_4x4_k2_b2,direct_2x2_4x4_pf_baked --budget-s "$(( ${STAGED_S:-110} - 20 ))" > "$OUT/staged.jsonl" 2> "$OUT/staged.log"
  echo "== staged exit $?"; grep '"sweep_summary"' "$OUT/staged.jsonl" | cut -c1-1500; grep '"sweep"' "$OUT/staged.jsonl" | grep -o '"kernel":"[^"]*"\|"toggles":"[^"]*"\|"max_rel_err":[^,]*' | paste -sd' ' | cut -c1-1500
  timeout 60 bash scripts/gpu-run.sh node dist/bench/gpu_gemm.js --only debug,staged_old > "$OUT/staged_old.jsonl" 2> "$OUT/staged_old.log"
  echo "== staged_old exit $?"; grep -E 'debug_case|staged_old' "$OUT/staged_old.jsonl" | cut -c1-300 | head -12
fi
if [[ $PARTS == *,pydata,* ]]; then
  # the compiled test finds its fixtures and the shipped bridge.py beside the package root
  ln -sfn "$PWD/test" .gpu/app/test; mkdir -p .gpu/app/src; ln -sfn "$PWD/src/data" .gpu/app/src/data; ln -sfn "$PWD/src/reward" .gpu/app/src/reward
  python3 -c "import transformers, torch; print('python3', transformers.__version__, torch.__version__)"
  VERL_PYTHON="$(command -v python3)" timeout "${PYDATA_S:-120}" bash scripts/gpu-run.sh node dist/test/data/python_data.test.js > "$OUT/pydata.log" 2>&1
  echo "== pydata exit $?"; grep -E "^# (pass|fail|skip)|^not ok|^ok .*transformers|# SKIP" "$OUT/pydata.log" | head -12
fi
if [[ $PARTS == *,ranks2,* ]]; then
  RANKS=2 GRPO_PARTS=full PARTS=grpo FULL_S="${RANKS2_S:-170}" OUT="$OUT/r2" bash bench/gpu_round3_session.sh 2>&1 | tail -12
  grep -h "optimizer.step" "$OUT"/r2/grpo/*.log | tail -4 | cut -c1-600
  grep -h -i "uncaptured\|device lost" "$OUT"/r2/grpo/*.log | head -5
fi
if [[ $PARTS == *,lora,* ]]; then
  GRPO_PARTS=lora PARTS=grpo LORA_S="${LORA_S:-120}" OUT="$OUT/lora" bash bench/gpu_round3_session.sh 2>&1 | tail -8
fi
if [[ $PARTS == *,prof,* ]]; then
  mkdir -p "$OUT/prof"
  VERL_PROFILE_UPDATE=1 VERL_NODE_FLAGS="--cpu-prof --cpu-prof-dir=$OUT/prof" timeout "${PROF_S:-120}" bash scripts/gpu-run.sh node dist/bench/gpu_decode.js \
    --only update --updates 64x64 --submit 0 --precision f16 --budget-s 90 > "$OUT/prof/update.jsonl" 2> "$OUT/prof/update.log"
  echo "== prof exit $?"; grep '"update_0.5B' "$OUT/prof/update.jsonl" | cut -c1-700; grep "actor.updatePolicy" "$OUT/prof/update.log" | tail -2 | cut -c1-500
  for f in "$OUT"/prof/*.cpuprofile; do [ -f "$f" ] && xz -T4 -6 "$f"; done; ls -la "$OUT/prof"
fi
if [[ $PARTS == *,rollout,* ]]; then
  timeout "${TORCH_ROLLOUT_S:-120}" python3 bench/pytorch_gpu_table.py --only rollout > "$OUT/torch_rollout.jsonl" 2> "$OUT/torch_rollout.log"
  echo "== torch rollout exit $?"; cut -c1-400 "$OUT/torch_rollout.jsonl"
  timeout "${DECODE_S:-120}" bash scripts/gpu-run.sh node dist/bench/gpu_decode.js --only decode --vocab 151936 --precision f16 --budget-s 100 \
    > "$OUT/decode.jsonl" 2> "$OUT/decode.log"
  echo "== webgpu decode exit $?"; grep '^{' "$OUT/decode.jsonl" | grep decode | cut -c1-900
fi
if [[ $PARTS == *,torch,* ]]; then
  timeout "${TORCH_S:-150}" python3 bench/pytorch_gpu_table.py --only matmul,update > "$OUT/torch.jsonl" 2> "$OUT/torch.log"
  echo "== torch exit $?"; cut -c1-400 "$OUT/torch.jsonl"
fi
if [[ $PARTS == *,table,* ]]; then
  timeout "${GEMM_S:-80}" bash scripts/gpu-run.sh node dist/bench/gpu_gemm.js --only sweep --candidates direct_2x2_4x4_pf_baked \
    --toggles "${GEMM_TOGGLES:-default,disable_robustness}" --budget-s "$(( ${GEMM_S:-80} - 20 ))" > "$OUT/gemm.jsonl" 2> "$OUT/gemm.log"
  echo "== gemm exit $?"; grep '4096' "$OUT/gemm.jsonl" | cut -c1-400 | head -4
  timeout "${TABLE_S:-200}" bash scripts/gpu-run.sh node dist/bench/gpu_decode.js --only update,decode --updates 64x64 --submit 0 --vocab 512,151936 \
    --precision f16 --budget-s "$(( ${TABLE_S:-200} - 20 ))" > "$OUT/table.jsonl" 2> "$OUT/table.log"
  echo "== webgpu table exit $?"; grep '^{' "$OUT/table.jsonl" | grep -E 'update_0.5B|webgpu_decode' | cut -c1-700
  timeout 220 python3 bench/pytorch_gpu_table.py > "$OUT/torch_table.jsonl" 2> "$OUT/torch_table.log"
  echo "== torch table exit $?"; cut -c1-400 "$OUT/torch_table.jsonl"
fi
