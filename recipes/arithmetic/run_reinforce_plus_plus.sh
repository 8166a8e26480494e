#!/usr/bin/env bash
# REINFORCE++ on the synthetic addition task (returns whitened over the whole batch,
# no critic), KL to the reference inside the reward (verl's reinforce_plus_plus example).
#
#   bash recipes/arithmetic/run_reinforce_plus_plus.sh
#   SMOKE=1 bash recipes/arithmetic/run_reinforce_plus_plus.sh
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
EXTRA=("$@")
run_rl reinforce_plus_plus \
  algorithm.adv_estimator=reinforce_plus_plus \
  actor_rollout_ref.actor.use_kl_loss=False \
  algorithm.use_kl_in_reward=True \
  algorithm.kl_penalty=kl \
  algorithm.kl_ctrl.kl_coef=0.001
