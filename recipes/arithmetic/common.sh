# Shared by the arithmetic recipes: the synthetic addition task (verl preprocess
# arithmetic: "What is 23+58?" -> "23+58=81\n#### 81", graded by the GSM8K scorer),
# a character-level tokenizer, and the SFT'd starting model.
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
ARITH="$RECIPES/arithmetic"
OUT="${OUT:-$OUTPUTS/arithmetic}"
DATA="${DATA:-$OUT/data}"
SFT_DIR="$OUT/sft"
# ARITHMETIC_ALPHABET (src/data/preprocess/arithmetic.ts), as a char tokenizer spec.
CHAR_TOKENIZER='char:\n #+0123456789=?Wahist'

make_data() {
  [ -f "$DATA/train.parquet" ] || $VERL preprocess arithmetic --local_save_dir "$DATA" --num-train "${NUM_TRAIN:-5000}" --num-test "${NUM_TEST:-500}" --seed 0
}

# The Hugging Face folder of the last SFT checkpoint (sft.sh writes it).
sft_model_path() {
  echo "$SFT_DIR/global_step_$(cat "$SFT_DIR/latest_checkpointed_iteration.txt")/huggingface"
}

# POLICY: the starting policy's overrides. SMOKE: a fresh tiny model; else the SFT'd
# model, trained first by sft.sh when $SFT_DIR has none.
policy_args() {
  if [ "$SMOKE" = "1" ]; then
    POLICY=(
      actor_rollout_ref.model.path=scratch actor_rollout_ref.model.tokenizer_path="\"$CHAR_TOKENIZER\""
      +actor_rollout_ref.model.override_config.hidden_size=32 +actor_rollout_ref.model.override_config.num_hidden_layers=1
    )
  else
    [ -f "$SFT_DIR/latest_checkpointed_iteration.txt" ] || OUT="$OUT" DATA="$DATA" bash "$ARITH/sft.sh"
    POLICY=(actor_rollout_ref.model.path="$(sft_model_path)")
  fi
}

# RL settings every algorithm shares; SIZE scales them (SMOKE: a couple of tiny steps).
rl_args() {
  COMMON=(
    data.train_files="$DATA/train.parquet"
    data.val_files="$DATA/test.parquet"
    data.max_prompt_length=16
    data.max_response_length=24
    actor_rollout_ref.rollout.temperature=1.0
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=128
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=128
    trainer.logger='["console","file"]'
    trainer.project_name=verl_ts_arithmetic
    trainer.n_gpus_per_node=2
    trainer.resume_mode=disable
    trainer.save_freq="${SAVE_FREQ:-1000000}"   # > the steps: the final policy only (actor/huggingface is transformers-loadable)
  )
  if [ "$SMOKE" = "1" ]; then
    SIZE=(
      data.train_batch_size=4 data.val_max_samples=8 actor_rollout_ref.rollout.n=2
      actor_rollout_ref.actor.ppo_mini_batch_size=4 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4
      trainer.total_training_steps=2 trainer.test_freq=2
    )
  else
    SIZE=(
      data.train_batch_size="${BATCH:-64}" actor_rollout_ref.rollout.n=8
      actor_rollout_ref.actor.ppo_mini_batch_size="${BATCH:-64}" actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu="${MICRO:-32}"
      actor_rollout_ref.actor.optim.lr="${LR:-3e-4}" actor_rollout_ref.actor.optim.lr_warmup_steps=5
      trainer.total_training_steps="${STEPS:-150}" trainer.test_freq="${TEST_FREQ:-25}"
    )
  fi
}

# run_rl NAME overrides...: one RL run into $OUT/NAME (metrics.jsonl, checkpoints).
run_rl() {
  local name="$1"; shift
  if [ "$SMOKE" = "1" ]; then OUT="$OUTPUTS/smoke/arithmetic"; DATA="$OUT/data"; NUM_TRAIN=64 NUM_TEST=16; fresh_dir "$OUT"; fi
  make_data
  policy_args
  rl_args
  mkdir -p "$OUT/$name"
  set -x
  VERL_FILE_LOGGER_PATH="$OUT/$name/metrics.jsonl" $VERL train "$@" \
    trainer.experiment_name="$name" trainer.default_local_dir="$OUT/$name/checkpoints" \
    "${POLICY[@]}" "${COMMON[@]}" "${SIZE[@]}" "${EXTRA[@]}"
  { set +x; } 2>/dev/null
}
