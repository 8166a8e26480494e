#!/usr/bin/env bash
# GRPO on a fresh policy of Qwen2.5-0.5B's shape (hidden 896, intermediate 4864, 24 layers,
# 14 heads, 2 KV heads, q/k/v biases; the stories tokenizer, so 358M parameters), the size
# issue 17 measures: 16 prompts x 4 samples, responses up to 64 tokens. The reward is the
# stories recipe's (1 when the story mentions WORD). Rollout runs on rollout.name=vllm by default,
# as verl's scripts say: the WebGPU decoder on a WebGPU rank, the host decoder elsewhere; with
# verl's token-level rollout correction. ROLLOUT=webgpu, tfjs or llama_cpp (weights synced to
# llama.cpp by GGUF each step) pick an engine.
#
#   bash recipes/qwen05b_shape_grpo/run.sh trainer.device=webgpu       # on a GPU (5 steps; docs/gpu.md)
#   SMOKE=1 bash recipes/qwen05b_shape_grpo/run.sh                     # the same code paths at a tiny size, seconds on CPU
#   ROLLOUT=tfjs STEPS=2 bash recipes/qwen05b_shape_grpo/run.sh
#
# Env: TOKENIZER (default ../shared/models/stories260K/tok512.bin), ROLLOUT (vllm), WORD (dog),
# STEPS (5), OUT (outputs/qwen05b_shape_grpo), DYNAMIC_BSZ_ON (1: micro-batches by token budget).
# Extra arguments are passed to `verl train` as overrides.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"

TOKENIZER="${TOKENIZER:-$SHARED/models/stories260K/tok512.bin}"
ROLLOUT="${ROLLOUT:-vllm}"
WORD="${WORD:-dog}"
STEPS="${STEPS:-5}"
OUT="${OUT:-$OUTPUTS/qwen05b_shape_grpo}"
[ -e "$TOKENIZER" ] || skip "tokenizer $TOKENIZER is absent (set TOKENIZER)"
if [ "$ROLLOUT" = "llama_cpp" ] && [ "$VERL" = "node $ROOT/bin/verl.js" ] && ! (cd "$ROOT" && node -e 'import("node-llama-cpp").catch(() => process.exit(1))' 2>/dev/null); then
  skip "rollout.name=llama_cpp needs the optional package node-llama-cpp@3.21.1 (or set ROLLOUT=tfjs)"
fi
[[ "$WORD" =~ ^[a-zA-Z]+$ ]] || { echo "WORD must be one word of letters, got '$WORD'" >&2; exit 2; }

M=actor_rollout_ref.model.override_config
# Micro-batches by token budget, as verl's *_seq_balance examples run: on a GPU each micro-batch
# costs ~0.6 s of host time recording its commands at this shape (docs/gpu.md, "Where an update's
# time goes"), so one micro-batch of the whole mini-batch's ~5k tokens beats eight of 8 rows.
# DYNAMIC_BSZ_ON=0 keeps the fixed micro-batches of ppo_micro_batch_size_per_gpu.
DYNAMIC_BSZ=()
if [ "${DYNAMIC_BSZ_ON:-1}" = "1" ]; then
  DYNAMIC_BSZ=(
    actor_rollout_ref.actor.use_dynamic_bsz=True actor_rollout_ref.actor.ppo_max_token_len_per_gpu=16384
    actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=16384
    actor_rollout_ref.ref.log_prob_use_dynamic_bsz=True actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=16384
  )
fi
if [ "$SMOKE" = "1" ]; then
  OUT="$OUTPUTS/smoke/qwen05b_shape_grpo"
  SHAPE=(+$M.hidden_size=64 +$M.intermediate_size=128 +$M.num_hidden_layers=2 +$M.num_attention_heads=4 +$M.num_key_value_heads=2)
  SIZE=(
    data.train_batch_size=2 data.max_response_length=16 actor_rollout_ref.rollout.n=2
    actor_rollout_ref.actor.ppo_mini_batch_size=2 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4
    trainer.total_training_steps=2
    # one llama.cpp thread: its default spins on a small shared VM
    actor_rollout_ref.rollout.engine_kwargs.llama_cpp.threads=1
    "${DYNAMIC_BSZ[@]}"
  )
else
  SHAPE=(+$M.hidden_size=896 +$M.intermediate_size=4864 +$M.num_hidden_layers=24 +$M.num_attention_heads=14 +$M.num_key_value_heads=2)
  SIZE=(
    data.train_batch_size=16 data.max_response_length=64 actor_rollout_ref.rollout.n=4
    actor_rollout_ref.actor.ppo_mini_batch_size=16 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8
    trainer.total_training_steps="$STEPS"
    "${DYNAMIC_BSZ[@]}"
  )
fi
fresh_dir "$OUT/data"

OPENINGS=("Once upon a time" "One day" "Tom and Lily" "There was a big" "Lily wanted to" "Tim was" "Mom said" "Sue had a")
for split in train test; do
  : > "$OUT/data/$split.jsonl"
  for ((i = 0; i < 64; i++)); do
    printf '{"data_source":"tinystories/mention","prompt":[{"role":"user","content":"%s"}],"ability":"story","reward_model":{"style":"rule","ground_truth":"%s"},"extra_info":{"index":%d}}\n' \
      "${OPENINGS[$((i % ${#OPENINGS[@]}))]}" "$WORD" "$i" >> "$OUT/data/$split.jsonl"
  done
done

set -x
VERL_FILE_LOGGER_PATH="$OUT/metrics.jsonl" $VERL train \
  algorithm.adv_estimator=grpo \
  data.train_files="$OUT/data/train.jsonl" \
  data.val_files="$OUT/data/test.jsonl" \
  data.max_prompt_length=16 \
  actor_rollout_ref.model.path=scratch \
  actor_rollout_ref.model.tokenizer_path="$TOKENIZER" \
  +$M.model_type=qwen2 "+$M.architectures=[Qwen2ForCausalLM]" +$M.tie_word_embeddings=true \
  "${SHAPE[@]}" \
  actor_rollout_ref.actor.optim.lr=1e-5 \
  actor_rollout_ref.actor.use_kl_loss=True \
  actor_rollout_ref.actor.kl_loss_coef=0.001 \
  actor_rollout_ref.actor.kl_loss_type=low_var_kl \
  actor_rollout_ref.rollout.name="$ROLLOUT" \
  actor_rollout_ref.rollout.calculate_log_probs=True \
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16 \
  actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16 \
  algorithm.rollout_correction.rollout_is=token \
  algorithm.rollout_correction.rollout_is_threshold=2.0 \
  custom_reward_function.path="$RECIPES/stories_grpo/reward.ts" \
  custom_reward_function.name=compute_score \
  trainer.logger='["console","file"]' \
  trainer.project_name=verl_ts_qwen05b_shape \
  trainer.experiment_name="grpo_${ROLLOUT}" \
  trainer.default_local_dir="$OUT/checkpoints" \
  trainer.resume_mode=disable \
  trainer.val_before_train=False \
  trainer.test_freq=-1 \
  trainer.n_gpus_per_node=1 \
  "${SIZE[@]}" "$@"
