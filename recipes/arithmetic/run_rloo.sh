#!/usr/bin/env bash
# RLOO on the synthetic addition task (leave-one-out baseline over the n samples of a
# prompt), KL to the reference inside the reward (verl's rloo example settings).
#
#   bash recipes/arithmetic/run_rloo.sh
#   SMOKE=1 bash recipes/arithmetic/run_rloo.sh
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
EXTRA=("$@")
run_rl rloo \
  algorithm.adv_estimator=rloo \
  actor_rollout_ref.actor.use_kl_loss=False \
  algorithm.use_kl_in_reward=True \
  algorithm.kl_penalty=kl \
  algorithm.kl_ctrl.kl_coef=0.001
