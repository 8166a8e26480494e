#!/usr/bin/env bash
# GRPO on the synthetic addition task, from the SFT'd model (sft.sh runs first when
# there is none), KL to the reference as a loss term (verl's run_qwen2-7b.sh settings).
#
#   bash recipes/arithmetic/run_grpo.sh          # STEPS=150 BATCH=64 LR=3e-4 by default
#   SMOKE=1 bash recipes/arithmetic/run_grpo.sh  # a fresh tiny model, two steps, seconds
#
# Metrics: $OUT/grpo/metrics.jsonl (val-core/openai/gsm8k/reward/mean@1 is the accuracy).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
EXTRA=("$@")
run_rl grpo \
  algorithm.adv_estimator=grpo \
  actor_rollout_ref.actor.use_kl_loss=True \
  actor_rollout_ref.actor.kl_loss_coef=0.001 \
  actor_rollout_ref.actor.kl_loss_type=low_var_kl \
  actor_rollout_ref.actor.entropy_coeff=0 \
  algorithm.use_kl_in_reward=False
