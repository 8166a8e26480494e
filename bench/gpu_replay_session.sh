#!/usr/bin/env bash
# The device session behind docs/gpu.md's "Replayed decode steps" (issue 23, 2026-12-06): one call on
# the GPU machine after `bash scripts/gpu-bundle.sh` here plus the tests it runs copied in:
#   mkdir -p .gpu/app/dist/test/{rollout,engine,models}
#   for f in rollout/webgpu_decoder rollout/webgpu_decoder_f16 engine/webgpu_replay engine/webgpu_split_k engine/webgpu_adapter models/stories; do
#     cp dist-gpu/test/$f*.js .gpu/app/dist/test/$(dirname $f)/; done
# carry [".gpu", ".gl"]. Parts (PARTS, default tests,decode,torch), each with its own time limit, writing under $OUT:
#   tests   the replay's and split-K's tests and the WebGPU decoder's (f32 and f16) on the GPU (TESTS: others)
#   decode  bench/gpu_decode.ts's rollout, 512 rows x 256 new tokens, f16 products, vocabularies VOCAB (151,936 and 512),
#           each with the decode steps replayed (the default) and the variants DECODE_ONLY names (noreplay: recorded
#           through tfjs; perhead: one attention workgroup a query head) and TILES lists (gpu_decode.ts --tiles);
#           PROFILE_STEP=N times each dispatch of replayed step N
#   torch   HF generate at the same shapes on the same GPU (bench/pytorch_gpu_table.py --only rollout; vocabularies
#           VOCAB, the best of TORCH_REPS runs each)
#   grpo    recipes/qwen05b_shape_grpo, 16-bit, full fine-tuning and LoRA (bench/gpu_round3_session.sh's grpo part)
#   update  bench/gpu_decode.ts's actor update at 64 x 96 tokens, f16 products, full fine-tuning and LoRA r=32, once per
#           setting of HOST_AB (default new,old,new): new = as built, old = the changes of 2026-12-07 off
#           (VERL_WEBGPU_POOL_ORDER=0 VERL_WEBGPU_UNIFORM_CACHE=0 VERL_FROZEN_PACK=0 VERL_LORA_PAD_SLOTS=0
#           VERL_GEMM_ACTIVATION_PACK_MB=0), nohost = only the first two off, each = every micro-batch's scalars read
#           before the next is recorded and the norm read before the update is recorded (VERL_READ_EACH_MICRO_BATCH=1
#           VERL_DEVICE_CLIP=0 VERL_FLAT_BY_COPIES=0, the last also stacking q/k/v and gate/up by tf.concat),
#           logprob = the token log-probs by the log-softmax composite (VERL_WEBGPU_FUSED_LOGPROB=0), ppo = the PPO loss and
#           masked reductions by their composites (VERL_WEBGPU_FUSED_PPO=0 VERL_WEBGPU_FUSED_MASKED=0); UPDATES (default 64x64: ROWSxMICRO, a list) and
#           UPDATE_LORA (default 0,32) pick the shapes; TORCH_UPDATE=1 adds PyTorch's
#           update at the same shape (bench/pytorch_gpu_table.py --only update)
#   transfer bench/gpu_transfer.ts: read-backs and uploads of TRANSFER_MIB (default 64,256,1024) each way, tfjs's
#           and the direct ones (src/engine/webgpu_transfer.ts), with a raw read-back's phases
#   hostprof the same update (full and LoRA r=32) with a V8 CPU profile of the steady update and every Dawn call named
#           (VERL_PROFILE_GPU_CALLS=1): bench/profile_summary.ts's top functions per profile, printed
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/replay_session}"
PARTS=",${PARTS:-tests,decode,torch},"
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
if [[ $PARTS == *,tests,* ]]; then
  mkdir -p /tmp/verl_shared/models && ln -sfn "$PWD/.gpu/stories260K" /tmp/verl_shared/models/stories260K
  for f in ${TESTS:-engine/webgpu_replay engine/webgpu_split_k rollout/webgpu_decoder rollout/webgpu_decoder_f16}; do
    echo "## test $f"
    VERL_SHARED_DIR=/tmp/verl_shared timeout "${TEST_S:-120}" bash scripts/gpu-run.sh node "dist/test/$f.test.js" > "$OUT/test_$(basename $f).log" 2>&1
    grep -E "^# (pass|fail|skip)|^not ok" "$OUT/test_$(basename $f).log" | head -6
  done
fi
if [[ $PARTS == *,decode,* ]]; then
  extra=()
  [[ -n ${TILES:-} ]] && extra+=(--tiles "$TILES")
  [[ -n ${PROFILE_STEP:-} ]] && extra+=(--profile-step "$PROFILE_STEP")
  timeout "${DECODE_S:-200}" bash scripts/gpu-run.sh node dist/bench/gpu_decode.js --only "decode,${DECODE_ONLY:-noreplay}" --vocab "${VOCAB:-151936,512}" --precision f16 \
    --budget-s "$(( ${DECODE_S:-200} - 30 ))" ${extra[@]+"${extra[@]}"} > "$OUT/decode.jsonl" 2> "$OUT/decode.log"
  echo "== webgpu decode exit $?"; grep '^{' "$OUT/decode.jsonl" | grep decode | cut -c1-1100
fi
if [[ $PARTS == *,torch,* ]]; then
  timeout "${TORCH_S:-150}" python3 bench/pytorch_gpu_table.py --only rollout --rollout-vocab "${VOCAB:-151936,512}" --rollout-reps "${TORCH_REPS:-1}" > "$OUT/torch_rollout.jsonl" 2> "$OUT/torch_rollout.log"
  echo "== torch rollout exit $?"; cut -c1-500 "$OUT/torch_rollout.jsonl"
fi
if [[ $PARTS == *,grpo,* ]]; then
  OUT="$OUT/grpo" PARTS=grpo STEPS="${STEPS:-4}" GRPO_PARTS="${GRPO_PARTS:-full,lora}" FULL_S="${FULL_S:-110}" LORA_S="${LORA_S:-110}" bash bench/gpu_round3_session.sh
fi
if [[ $PARTS == *,update,* ]]; then
  IFS=, read -ra settings <<< "${HOST_AB:-new,old,new}"
  i=0
  for setting in "${settings[@]}"; do
    i=$((i + 1))
    envs=()
    [[ $setting == old ]] && envs=(VERL_WEBGPU_POOL_ORDER=0 VERL_WEBGPU_UNIFORM_CACHE=0 VERL_FROZEN_PACK=0 VERL_LORA_PAD_SLOTS=0 VERL_GEMM_ACTIVATION_PACK_MB=0)
    [[ $setting == nohost ]] && envs=(VERL_WEBGPU_POOL_ORDER=0 VERL_WEBGPU_UNIFORM_CACHE=0)
    [[ $setting == each ]] && envs=(VERL_READ_EACH_MICRO_BATCH=1 VERL_DEVICE_CLIP=0 VERL_FLAT_BY_COPIES=0)
    [[ $setting == logprob ]] && envs=(VERL_WEBGPU_FUSED_LOGPROB=0)
    [[ $setting == ppo ]] && envs=(VERL_WEBGPU_FUSED_PPO=0 VERL_WEBGPU_FUSED_MASKED=0)
    env ${envs[@]+"${envs[@]}"} timeout "${UPDATE_S:-120}" bash scripts/gpu-run.sh node dist/bench/gpu_decode.js --only update --updates "${UPDATES:-64x64}" --submit 0 \
      --precision f16 --lora "${UPDATE_LORA:-0,32}" --budget-s "$(( ${UPDATE_S:-120} - 20 ))" > "$OUT/update_${i}_$setting.jsonl" 2> "$OUT/update_${i}_$setting.log"
    echo "== update ($setting) exit $?"
    grep '"update_0.5B' "$OUT/update_${i}_$setting.jsonl" | python3 -c '
import json, sys
for line in sys.stdin:
    d = json.loads(line); c, f = d["config"], d["figures"]
    print(json.dumps({"lora": c.get("lora_rank"), "micro": c.get("micro"), "ms": round(f["ms"], 1), "tokens_per_s": round(f["tokens_per_s"]), "dispatches": f["dispatches"], "submits": f["submits"], "writes": f["writes"], "bind_groups": f.get("bind_groups"), "uniforms": f.get("uniforms"), "ms_next": round(f.get("ms_next", 0), 1), "bind_groups_next": f.get("bind_groups_next"), "pool": f.get("pool"), "pool_next": f.get("pool_next")}))'
    grep -h '"error"' "$OUT/update_${i}_$setting.jsonl" | cut -c1-600
  done
  if [[ ${TORCH_UPDATE:-0} == 1 ]]; then
    timeout 150 python3 bench/pytorch_gpu_table.py --only update > "$OUT/torch_update.jsonl" 2> "$OUT/torch_update.log"
    echo "== torch update exit $?"; cut -c1-400 "$OUT/torch_update.jsonl"
  fi
fi
if [[ $PARTS == *,transfer,* ]]; then
  timeout "${TRANSFER_S:-80}" bash scripts/gpu-run.sh node dist/bench/gpu_transfer.js --mib "${TRANSFER_MIB:-64,256,1024}" --reps "${TRANSFER_REPS:-2}" > "$OUT/transfer.jsonl" 2> "$OUT/transfer.log"
  echo "== transfer exit $?"
  grep '"gpu_transfer"' "$OUT/transfer.jsonl" | python3 -c '
import json, sys
for line in sys.stdin:
    d = json.loads(line)
    if "error" in d: print(d["error"]); continue
    f = d["figures"]
    print(json.dumps({"mib": d["config"]["mib"], **{k: v for k, v in f.items() if k.endswith("_gbps") or "raw_read_kept_" in k}}))'
fi
if [[ $PARTS == *,hostprof,* ]]; then
  VERL_PROFILE_GPU_CALLS=1 timeout "${PROF_S:-100}" bash scripts/gpu-run.sh node dist/bench/gpu_decode.js --only update --updates 64x64 --submit 0 \
    --precision f16 --lora "${PROF_LORA:-0,32}" --budget-s "$(( ${PROF_S:-100} - 20 ))" --cpu-profile "$OUT/cpu" > "$OUT/hostprof.jsonl" 2> "$OUT/hostprof.log"
  echo "== hostprof exit $?"
  grep '"update_0.5B' "$OUT/hostprof.jsonl" | python3 -c '
import json, sys
for line in sys.stdin:
    d = json.loads(line); c, f = d["config"], d["figures"]
    print(json.dumps({"lora": c.get("lora_rank"), "ms": round(f["ms"], 1), "ms_next (profiled)": round(f.get("ms_next", 0), 1), "dispatches": f["dispatches"]}))'
  for f in "$OUT"/cpu/*.cpuprofile; do
    [ -f "$f" ] && bash scripts/gpu-run.sh node dist/bench/profile_summary.js "$f" --top "${PROF_TOP:-30}" | head -$(( ${PROF_TOP:-30} + 24 ))
  done
  xz -T4 -6 "$OUT"/cpu/*.cpuprofile 2>/dev/null
fi
