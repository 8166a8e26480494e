#!/usr/bin/env bash
# GRPO on GSM8K (verl's examples/grpo_trainer/run_qwen2-7b.sh, on verl-ts).
#
#   MODEL_PATH=~/models/Qwen2.5-0.5B-Instruct bash recipes/gsm8k_grpo/run.sh
#   bash recipes/gsm8k_grpo/run.sh              # default: stories260K from ../shared (a story model:
#                                               # it cannot solve GSM8K, the reward stays ~0; a plumbing run)
#   SMOKE=1 bash recipes/gsm8k_grpo/run.sh      # two tiny steps, seconds
#
# Env: MODEL_PATH (llama2.c .bin or HF folder), GSM8K_RAW (train.jsonl/test.jsonl or HF parquet),
#      OUT (outputs/gsm8k_grpo). Extra arguments are passed to `verl train` as overrides.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"

MODEL_PATH="${MODEL_PATH:-$SHARED/models/stories260K/stories260K.bin}"
GSM8K_RAW="${GSM8K_RAW:-$SHARED/data/gsm8k}"
OUT="${OUT:-$OUTPUTS/gsm8k_grpo}"
[ -e "$MODEL_PATH" ] || skip "model $MODEL_PATH is absent (set MODEL_PATH)"
[ -e "$GSM8K_RAW/train.jsonl" ] || [ -e "$GSM8K_RAW/train.parquet" ] || ls "$GSM8K_RAW"/*.parquet >/dev/null 2>&1 \
  || skip "GSM8K data is absent in $GSM8K_RAW (set GSM8K_RAW)"

if [ "$SMOKE" = "1" ]; then
  OUT="$OUTPUTS/smoke/gsm8k_grpo"
  fresh_dir "$OUT"
  SIZE=(
    data.train_max_samples=8 data.val_max_samples=4 data.train_batch_size=2 data.max_response_length=16
    actor_rollout_ref.rollout.n=2 actor_rollout_ref.actor.ppo_mini_batch_size=2 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2
    trainer.total_training_steps=2 trainer.test_freq=2 trainer.resume_mode=disable
  )
else
  SIZE=(
    data.train_batch_size=16 data.max_response_length=128
    actor_rollout_ref.rollout.n=8 actor_rollout_ref.actor.ppo_mini_batch_size=16 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8
    trainer.total_epochs=1 trainer.test_freq=20 trainer.save_freq=20
  )
fi
[ -f "$OUT/data/train.parquet" ] || $VERL preprocess gsm8k --local_dataset_path "$GSM8K_RAW" --local_save_dir "$OUT/data"

set -x
VERL_FILE_LOGGER_PATH="$OUT/metrics.jsonl" $VERL train \
  algorithm.adv_estimator=grpo \
  data.train_files="$OUT/data/train.parquet" \
  data.val_files="$OUT/data/test.parquet" \
  data.max_prompt_length=384 \
  data.filter_overlong_prompts=True \
  data.truncation=error \
  actor_rollout_ref.model.path="$MODEL_PATH" \
  actor_rollout_ref.actor.optim.lr=1e-4 \
  actor_rollout_ref.actor.use_kl_loss=True \
  actor_rollout_ref.actor.kl_loss_coef=0.001 \
  actor_rollout_ref.actor.kl_loss_type=low_var_kl \
  actor_rollout_ref.actor.entropy_coeff=0 \
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16 \
  actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16 \
  algorithm.use_kl_in_reward=False \
  trainer.critic_warmup=0 \
  trainer.logger='["console","file"]' \
  trainer.project_name=verl_ts_gsm8k \
  trainer.experiment_name=grpo \
  trainer.default_local_dir="$OUT/checkpoints" \
  trainer.n_gpus_per_node=2 \
  "${SIZE[@]}" "$@"
