#!/usr/bin/env bash
# Multi-turn GRPO on GSM8K with the calc_gsm8k_reward tool: verl's
# examples/sglang_multiturn/run_qwen2.5-3b_gsm8k_tool_agent_mlflow.sh, on verl-ts.
# Every row runs the tool_agent loop: the model reasons, may call the tool
# (<tool_call>{"name": "calc_gsm8k_reward", ...}</tool_call>), reads its verdict,
# and answers "#### N"; tool tokens are masked out of the policy loss.
#
#   npm run build && bash recipes/gsm8k_multiturn/run.sh            # Qwen2.5-0.5B-Instruct (HF folder in $MODEL)
#   npm run build && SMOKE=1 bash recipes/gsm8k_multiturn/run.sh    # plumbing check on a tiny fresh model, minutes on a CPU
#
# Env: MODEL (HF folder), GSM8K_RAW (train.jsonl/test.jsonl or HF parquet folder), DATA (output folder),
#      INTERACTION=1 to add the simulated user. Extra arguments are passed to `verl train` as overrides.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
VERL="${VERL:-node $ROOT/bin/verl.js}"
SHARED="${VERL_SHARED_DIR:-$ROOT/../shared}"
SMOKE="${SMOKE:-0}"
GSM8K_RAW="${GSM8K_RAW:-$SHARED/data/gsm8k}"

if [ "$VERL" = "node $ROOT/bin/verl.js" ] && [ ! -f "$ROOT/dist/src/index.js" ]; then
  echo "build first: npm run build" >&2
  exit 2
fi
if [ ! -d "$GSM8K_RAW" ] || { [ "${SMOKE:-0}" = "1" ] && [ ! -f "$SHARED/models/stories260K/tok512.bin" ]; }; then
  echo "SKIP gsm8k_multiturn/run.sh: GSM8K ($GSM8K_RAW) or the stories260K tokenizer under $SHARED is absent" >&2
  exit 0
fi

if [ "$SMOKE" = "1" ]; then
  DATA="${DATA:-$(mktemp -d)/gsm8k_tool}"
  $VERL preprocess gsm8k --local_dataset_path "$GSM8K_RAW" --local_save_dir "$DATA" --agent --num-train 16 --num-test 4
  # The smoke run checks the plumbing (chat template with tool schemas, tool
  # agent loops on the batching server, masks, GRPO update), not learning: a
  # fresh 2-layer model, since the templated agent prompts (~1000 tok512 tokens)
  # do not fit stories260K's 512 positions. The tok512 tokenizer gets the
  # ChatML-with-tools template through a folder.
  TOK="$(mktemp -d)"
  cp "$SHARED/models/stories260K/tok512.bin" "$TOK/tok512.bin"
  cp "$HERE/config/chatml_tools.jinja" "$TOK/chat_template.jinja"
  MODEL_ARGS=(
    actor_rollout_ref.model.path=scratch
    actor_rollout_ref.model.tokenizer_path="$TOK"
  )
  SIZE_ARGS=(
    data.train_batch_size=4
    data.train_max_samples=16
    data.val_max_samples=4
    data.max_prompt_length=1152
    data.max_response_length=96
    actor_rollout_ref.rollout.n=2
    actor_rollout_ref.actor.ppo_mini_batch_size=4
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4
    actor_rollout_ref.actor.optim.lr=1e-4
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8
    actor_rollout_ref.rollout.multi_turn.max_assistant_turns=3
    trainer.total_training_steps=2
    trainer.test_freq=2
    trainer.experiment_name=gsm8k-tool-agent-smoke
  )
else
  DATA="${DATA:-$HOME/data/gsm8k_tool}"
  MODEL="${MODEL:-$HOME/models/Qwen2.5-0.5B-Instruct}"
  [ -f "$DATA/train.parquet" ] || $VERL preprocess gsm8k --local_dataset_path "$GSM8K_RAW" --local_save_dir "$DATA" --agent
  MODEL_ARGS=(actor_rollout_ref.model.path="$MODEL")
  SIZE_ARGS=(
    data.train_batch_size=32
    data.max_prompt_length=1024
    data.max_response_length=1024
    actor_rollout_ref.rollout.n=8
    actor_rollout_ref.actor.ppo_mini_batch_size=32
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8
    actor_rollout_ref.actor.optim.lr=1e-6
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8
    actor_rollout_ref.rollout.multi_turn.max_assistant_turns=5
    trainer.total_epochs=15
    trainer.test_freq=20
    trainer.experiment_name=gsm8k-tool-agent-grpo
  )
fi

INTERACTION_ARGS=()
if [ "${INTERACTION:-0}" = "1" ]; then
  INTERACTION_ARGS=(actor_rollout_ref.rollout.multi_turn.interaction_config_path="$HERE/config/gsm8k_interaction_config.yaml")
fi

set -x
$VERL train \
  algorithm.adv_estimator=grpo \
  algorithm.use_kl_in_reward=False \
  data.train_files="$DATA/train.parquet" \
  data.val_files="$DATA/test.parquet" \
  data.filter_overlong_prompts=True \
  data.truncation=error \
  data.return_raw_chat=True \
  actor_rollout_ref.actor.use_kl_loss=True \
  actor_rollout_ref.actor.kl_loss_coef=0.001 \
  actor_rollout_ref.actor.kl_loss_type=low_var_kl \
  actor_rollout_ref.actor.entropy_coeff=0 \
  actor_rollout_ref.rollout.multi_turn.enable=True \
  actor_rollout_ref.rollout.multi_turn.format=hermes \
  actor_rollout_ref.rollout.multi_turn.tool_config_path="$HERE/config/gsm8k_tool_config.yaml" \
  actor_rollout_ref.rollout.agent.max_concurrent_loops=64 \
  trainer.critic_warmup=0 \
  trainer.logger='[console]' \
  trainer.project_name=gsm8k_tool-agent \
  trainer.save_freq=-1 \
  "${MODEL_ARGS[@]}" "${SIZE_ARGS[@]}" "${INTERACTION_ARGS[@]}" "$@"
