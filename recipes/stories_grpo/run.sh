#!/usr/bin/env bash
# GRPO on stories260K (a 260K-parameter TinyStories model) with a custom reward:
# 1 when the story mentions WORD (default "dog"), else 0 (reward.ts, loaded through
# custom_reward_function.path). The pretrained model mentions a dog in ~8% of its
# 64-token stories; GRPO raises that rate while the KL loss keeps the policy near
# the reference (actor/kl_loss in the metrics).
#
#   bash recipes/stories_grpo/run.sh                 # 30 steps, minutes on 2 CPU cores
#   SMOKE=1 bash recipes/stories_grpo/run.sh         # two tiny steps, seconds
#   WORD=cat STEPS=60 bash recipes/stories_grpo/run.sh
#
# Env: MODEL_PATH (default ../shared/models/stories260K/stories260K.bin), WORD, STEPS, OUT
# (outputs/stories_grpo). Extra arguments are passed to `verl train` as overrides.
# Plots: verl plot $OUT/metrics.jsonl --out $OUT/plots
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
HERE="$RECIPES/stories_grpo"

MODEL_PATH="${MODEL_PATH:-$SHARED/models/stories260K/stories260K.bin}"
WORD="${WORD:-dog}"
STEPS="${STEPS:-30}"
OUT="${OUT:-$OUTPUTS/stories_grpo}"
[ -e "$MODEL_PATH" ] || skip "model $MODEL_PATH is absent (set MODEL_PATH)"
[[ "$WORD" =~ ^[a-zA-Z]+$ ]] || { echo "WORD must be one word of letters, got '$WORD'" >&2; exit 2; }

if [ "$SMOKE" = "1" ]; then
  OUT="$OUTPUTS/smoke/stories_grpo"
  SIZE=(
    data.train_batch_size=2 data.max_response_length=16 actor_rollout_ref.rollout.n=2
    actor_rollout_ref.actor.ppo_mini_batch_size=2 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2
    actor_rollout_ref.rollout.val_kwargs.n=1 trainer.total_training_steps=2 trainer.test_freq=2
  )
else
  SIZE=(
    data.train_batch_size=16 data.max_response_length=64 actor_rollout_ref.rollout.n=8
    actor_rollout_ref.actor.ppo_mini_batch_size=16 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32
    actor_rollout_ref.rollout.val_kwargs.n=2 trainer.total_training_steps="$STEPS" trainer.test_freq=10
  )
fi
fresh_dir "$OUT/data"

# Prompts: story openings; every row asks for the same word (reward_model.ground_truth).
OPENINGS=(
  "Once upon a time" "One day" "Once upon a time, there was a little girl" "Once upon a time, there was a boy"
  "One day, a little" "Tom and Lily" "There was a big" "Once there was a" "Lily wanted to" "Tim was"
  "The sun was shining" "It was a rainy day" "Mom said" "Sue had a" "Ben and his mom" "In a small house"
)
write_rows() { # FILE ROWS
  local file="$1" rows="$2" i
  : > "$file"
  for ((i = 0; i < rows; i++)); do
    printf '{"data_source":"tinystories/mention","prompt":[{"role":"user","content":"%s"}],"ability":"story","reward_model":{"style":"rule","ground_truth":"%s"},"extra_info":{"index":%d}}\n' \
      "${OPENINGS[$((i % ${#OPENINGS[@]}))]}" "$WORD" "$i" >> "$file"
  done
}
write_rows "$OUT/data/train.jsonl" 64
write_rows "$OUT/data/test.jsonl" 64

set -x
VERL_FILE_LOGGER_PATH="$OUT/metrics.jsonl" $VERL train \
  algorithm.adv_estimator=grpo \
  data.train_files="$OUT/data/train.jsonl" \
  data.val_files="$OUT/data/test.jsonl" \
  data.max_prompt_length=16 \
  actor_rollout_ref.model.path="$MODEL_PATH" \
  actor_rollout_ref.actor.optim.lr=2e-4 \
  actor_rollout_ref.actor.use_kl_loss=True \
  actor_rollout_ref.actor.kl_loss_coef=0.05 \
  actor_rollout_ref.actor.kl_loss_type=low_var_kl \
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=64 \
  actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=64 \
  actor_rollout_ref.rollout.val_kwargs.do_sample=True \
  actor_rollout_ref.rollout.val_kwargs.temperature=1.0 \
  custom_reward_function.path="$HERE/reward.ts" \
  custom_reward_function.name=compute_score \
  trainer.logger='["console","file"]' \
  trainer.project_name=verl_ts_stories \
  trainer.experiment_name="grpo_mention_$WORD" \
  trainer.default_local_dir="$OUT/checkpoints" \
  trainer.resume_mode=disable \
  trainer.n_gpus_per_node=2 \
  "${SIZE[@]}" "$@"
