#!/usr/bin/env bash
# The device session behind docs/gpu.md's "0.5B-shaped GRPO on the H200" figures (issue 17), one
# call on the GPU machine after `bash scripts/gpu-bundle.sh` here (carry [".gpu", ".gl"]):
#   A. recipes/qwen05b_shape_grpo, 5 steps, full fine-tuning, rollout.name=webgpu, trainer.device=webgpu
#   B. the same with LoRA (lora_rank=32, alpha 32)
#   C. bench/gpu_decode.ts: the WebGPU decoder at 64 x 8 x 256 new tokens (and the adapter's features)
#   D. bench/rollout_engines.ts: the host decoder on the same shape (a slice: it runs ~20 tokens/s)
# Each part has its own time limit and writes under $OUT, so one failure keeps the others.
#   OUT=/tmp/s bash bench/gpu_qwen05b_session.sh
# PARTS (default full,lora,decode,host) picks parts; GRPO_EXTRA adds overrides to A and B, e.g. the
# 16-bit step: GRPO_EXTRA="actor_rollout_ref.rollout.dtype=bfloat16 +actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=bf16 +actor_rollout_ref.ref.fsdp_config.mixed_precision.param_dtype=bf16"
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/qwen05b_session}"
STEPS="${STEPS:-5}"
PARTS=",${PARTS:-full,lora,decode,host},"
read -r -a EXTRA <<< "${GRPO_EXTRA:-}"
mkdir -p "$OUT"
VERL="bash $PWD/scripts/gpu-run.sh verl"
summary() {
  python3 - "$1" <<'PY'
import json, sys
try:
    lines = open(sys.argv[1]).read().splitlines()
except OSError as e:
    print("no metrics:", e); sys.exit(0)
for line in lines:
    m = json.loads(line); d = m.get("data", m)
    t = {k[9:]: round(v, 2) for k, v in d.items() if k.startswith("timing_s/")}
    keep = ["critic/score/mean", "actor/kl_loss", "actor/grad_norm", "response_length/mean", "rollout_corr/kl", "perf/throughput"]
    print(f"step {m.get('step')}:", " ".join(f"{k}={v}" for k, v in sorted(t.items())), "|", " ".join(f"{k}={d.get(k)}" for k in keep if k in d))
PY
}
grpo() { # name timeout extra-overrides...
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  OUT="$OUT/$name" STEPS="$STEPS" ROLLOUT=webgpu VERL="$VERL" TOKENIZER="$PWD/.gpu/stories260K/tok512.bin" \
    timeout "$limit" bash recipes/qwen05b_shape_grpo/run.sh custom_reward_function.path="$PWD/.gpu/reward.mjs" \
    trainer.device=webgpu "${EXTRA[@]}" "$@" > "$OUT/$name.log" 2>&1
  echo "== $name: exit $? after $((SECONDS - t0)) s"
  summary "$OUT/$name/metrics.jsonl"
  grep -iE "error|warn" "$OUT/$name.log" | grep -v '^+' | head -5
}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
[[ $PARTS == *,full,* ]] && grpo full "${FULL_S:-170}"
[[ $PARTS == *,lora,* ]] && grpo lora "${LORA_S:-150}" actor_rollout_ref.model.lora_rank=32 actor_rollout_ref.model.lora_alpha=32 actor_rollout_ref.actor.optim.lr=5e-5
[[ $PARTS == *,decode,* ]] || exit 0
t0=$SECONDS
timeout "${DECODE_S:-100}" bash scripts/gpu-run.sh node dist/bench/gpu_decode.js --only adapter,decode --vocab 512 --budget-s 80 > "$OUT/decode.log" 2>&1
echo "== webgpu decode bench: exit $? after $((SECONDS - t0)) s"; grep '^{' "$OUT/decode.log" | tail -3 | cut -c1-1500
[[ $PARTS == *,host,* ]] || exit 0
t0=$SECONDS
timeout "${HOST_S:-70}" bash scripts/gpu-run.sh node dist/bench/rollout_engines.js --shape 0.5b --weights none --host-rows 8 --host-new 8 \
  --tokenizer "$PWD/.gpu/stories260K/tok512.bin" --out "$OUT/host.json" > "$OUT/host.log" 2>&1
echo "== host decoder: exit $? after $((SECONDS - t0)) s"; cat "$OUT/host.json" 2>/dev/null | head -40
