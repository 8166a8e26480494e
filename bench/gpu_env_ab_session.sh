#!/usr/bin/env bash
# A/B of environment switches on recipes/qwen05b_shape_grpo (16-bit products), one device call
# after `bash scripts/gpu-bundle.sh` (carry [".gpu", ".gl"]). Each variant is a run of its own,
# in the order given, so alternate them where the machine's drift matters:
#   VARIANTS="lora: lora:VERL_GEMM_THIN=f32 full:" OUT=$OUT/ab STEPS=4 RUN_S=100 bash bench/gpu_env_ab_session.sh
# A variant is PARTS:ENV, PARTS full or lora, ENV space-free assignments joined by commas
# (e.g. lora:VERL_GEMM_THIN=f32,VERL_WEBGPU_SUBMIT_BATCH=64). Each run's steps and update profile
# (VERL_PROFILE_UPDATE=1) are printed under "== NAME"; logs and metrics stay under $OUT/NAME.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/env_ab}"
i=0
for v in ${VARIANTS:-lora: lora:VERL_GEMM_THIN=f32}; do
  i=$((i + 1))
  parts=${v%%:*} envs=${v#*:}
  [[ $parts == full || $parts == lora ]] || { echo "variant '$v': expected full:ENV or lora:ENV" >&2; exit 2; }
  name="$i-$parts${envs:+-${envs//[=,]/_}}"
  IFS=, read -r -a assign <<< "$envs"
  echo "== $name (${envs:-defaults})"
  env ${assign[@]+"${assign[@]}"} OUT="$OUT/$name" STEPS="${STEPS:-4}" PARTS=grpo GRPO_PARTS="$parts" FULL_S="${RUN_S:-100}" LORA_S="${RUN_S:-100}" \
    bash bench/gpu_round3_session.sh 2>&1 | grep -v "^NVIDIA\|^nvidia"
done
