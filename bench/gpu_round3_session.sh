#!/usr/bin/env bash
# The device session behind docs/gpu.md's 2026-12-04 evening figures (issues 23 and 24), one call on
# the GPU machine after `bash scripts/gpu-bundle.sh` here plus the test files it runs copied in:
#   mkdir -p .gpu/app/dist/test/{rollout,engine,models}; for f in rollout/webgpu_slots rollout/webgpu_decoder_f16 \
#     rollout/webgpu_packed_producers rollout/webgpu_qk_norm; do cp dist-gpu/test/$f.test.js .gpu/app/dist/test/$f.test.js; done
#   cp dist-gpu/test/engine/webgpu_adapter.js dist-gpu/test/models/stories.js ... (their helpers)
# carry [".gpu", ".gl"]. Parts (PARTS, default all of them), each with its own time limit, writing under $OUT:
#   tests    the WebGPU tests that need the H200's tensor cores (f16 decoder, slot decoder, packed producers, q/k norm)
#   grpo     recipes/qwen05b_shape_grpo with 16-bit products (rollout.dtype and param_dtype bf16), full and LoRA,
#            VERL_PROFILE_UPDATE=1 (where the update's time goes); RANKS=2 adds trainer.n_gpus_per_node=2
#   slots    the agent loops' slot decoder at 64 rows, vocabulary 151,936 (device vs host sampling, f32 and f16)
#   update   bench/gpu_decode.ts's actor update at 64 x 96 tokens, f16 products, one micro-batch
#   torch    bench/pytorch_gpu_table.py --only matmul,update on the same GPU
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/round3_session}"
PARTS=",${PARTS:-tests,grpo,slots,update,torch},"
STEPS="${STEPS:-4}"
mkdir -p "$OUT"
B16="actor_rollout_ref.rollout.dtype=bfloat16 +actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=bf16 +actor_rollout_ref.ref.fsdp_config.mixed_precision.param_dtype=bf16"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
if [[ $PARTS == *,tests,* ]]; then
  mkdir -p /tmp/verl_shared/models && ln -sfn "$PWD/.gpu/stories260K" /tmp/verl_shared/models/stories260K
  for f in rollout/webgpu_decoder_f16 rollout/webgpu_packed_producers rollout/webgpu_qk_norm rollout/webgpu_slots; do
    echo "## test $f"
    VERL_SHARED_DIR=/tmp/verl_shared timeout 150 bash scripts/gpu-run.sh node "dist/test/$f.test.js" > "$OUT/test_$(basename $f).log" 2>&1
    grep -E "^# (pass|fail|skip)|^not ok" "$OUT/test_$(basename $f).log" | head -6
  done
fi
if [[ $PARTS == *,grpo,* ]]; then
  extra=""; [ "${RANKS:-1}" != 1 ] && extra="trainer.n_gpus_per_node=${RANKS}"
  VERL_PROFILE_UPDATE=1 STEPS="$STEPS" FULL_S="${FULL_S:-100}" LORA_S="${LORA_S:-100}" PARTS="${GRPO_PARTS:-full,lora}" GRPO_EXTRA="$B16 $extra ${GRPO_EXTRA:-}" \
    OUT="$OUT/grpo" bash bench/gpu_qwen05b_session.sh 2>&1 | grep -E "^step|^== " 
  grep -h "actor.updatePolicy" "$OUT"/grpo/*.log 2>/dev/null | cut -c1-420
fi
if [[ $PARTS == *,slots,* ]]; then
  timeout "${SLOTS_S:-150}" bash scripts/gpu-run.sh node dist/bench/gpu_decode.js --only slots --vocab 151936 --slot-rows 64 --new 128 \
    --precision f32,f16 --slot-sampling device,host --budget-s "${SLOTS_BUDGET:-120}" > "$OUT/slots.jsonl" 2> "$OUT/slots.log"
  echo "== slots exit $?"; grep '^{' "$OUT/slots.jsonl" | grep -v '"webgpu"' | cut -c1-700
fi
if [[ $PARTS == *,update,* ]]; then
  timeout 120 bash scripts/gpu-run.sh node dist/bench/gpu_decode.js --only update --updates 64x64 --submit 0 --precision f16 --budget-s 90 > "$OUT/update.jsonl" 2> "$OUT/update.log"
  echo "== update exit $?"; grep '"update_0.5B' "$OUT/update.jsonl" | cut -c1-900
fi
if [[ $PARTS == *,torch,* ]]; then
  timeout 150 python3 bench/pytorch_gpu_table.py --only matmul,update > "$OUT/torch.jsonl" 2> "$OUT/torch.log"
  echo "== torch exit $?"; cut -c1-400 "$OUT/torch.jsonl"
fi
