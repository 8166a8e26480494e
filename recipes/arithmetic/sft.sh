#!/usr/bin/env bash
# Supervised fine-tuning of a from-scratch character-level model on the synthetic
# addition task (verl's examples/sft/gsm8k/run_*.sh layout: prompt and response
# from extra_info.question / extra_info.answer). The final model is a Hugging
# Face folder, $OUT/sft/global_step_N/huggingface, that the RL recipes start from.
# Two choices matter at this size: 8 heads of width 8 (with 4 heads the model stalls
# at ~6% accuracy for hundreds of steps) and an untied lm_head (87% greedy accuracy
# after 600 steps against 76% with tied embeddings, in our runs).
#
#   bash recipes/arithmetic/sft.sh               # a 2-layer, 64-wide, 8-head model, minutes on 2 CPU cores
#   SMOKE=1 bash recipes/arithmetic/sft.sh       # a few tiny steps, seconds
#
# Env: OUT (outputs/arithmetic), SFT_STEPS (400), SFT_EPOCHS (8: the cosine schedule spans 8
# epochs of 78 steps; the run stops at SFT_STEPS, as verl's total_training_steps does, leaving
# the model mid-schedule, still learning), SFT_LR. Extra arguments go to `verl sft`.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

if [ "$SMOKE" = "1" ]; then
  OUT="$OUTPUTS/smoke/arithmetic_sft"; DATA="$OUT/data"; SFT_DIR="$OUT/sft"
  fresh_dir "$OUT"
  NUM_TRAIN=64 NUM_TEST=16
  SIZE=(
    +model.override_config.hidden_size=32 +model.override_config.num_hidden_layers=1
    data.train_batch_size=16 trainer.total_training_steps=3 trainer.test_freq=3
  )
else
  SIZE=(
    +model.override_config.hidden_size=64 +model.override_config.num_hidden_layers=2
    data.train_batch_size=64 trainer.total_epochs="${SFT_EPOCHS:-8}" trainer.total_training_steps="${SFT_STEPS:-400}" trainer.test_freq=100
  )
fi
make_data
mkdir -p "$SFT_DIR"

set -x
VERL_FILE_LOGGER_PATH="$SFT_DIR/metrics.jsonl" $VERL sft \
  data.train_files="$DATA/train.parquet" \
  data.val_files="$DATA/test.parquet" \
  data.prompt_key=extra_info \
  data.response_key=extra_info \
  data.prompt_dict_keys='[question]' \
  data.response_dict_keys='[answer]' \
  data.max_length=40 \
  data.micro_batch_size_per_gpu=32 \
  model.partial_pretrain=scratch \
  model.tokenizer_path="\"$CHAR_TOKENIZER\"" \
  +model.override_config.num_attention_heads=8 \
  +model.override_config.tie_word_embeddings=false \
  optim.lr="${SFT_LR:-3e-3}" \
  optim.lr_warmup_steps_ratio=0.05 \
  optim.lr_scheduler=cosine \
  trainer.default_local_dir="$SFT_DIR" \
  trainer.logger='["console","file"]' \
  trainer.project_name=verl_ts_arithmetic \
  trainer.experiment_name=sft \
  trainer.n_gpus_per_node=2 \
  "${SIZE[@]}" "$@"
