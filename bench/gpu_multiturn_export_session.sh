#!/usr/bin/env bash
# One device call for issues 24 and 25, on the GPU machine with the bundle of scripts/gpu-bundle.sh
# carried as .gpu and .gl (the device tool's run; OUT set by it):
#  1. transformers (the machine's python3: torch + transformers 5) loads every model family's export
#     as the same class with logits within 1e-4 (the opt-in part of test/models/families_export.test.ts);
#  2. verl's multi-turn GSM8K tool example (recipes/gsm8k_multiturn: tool agent loops, hermes tool
#     calls, calc_gsm8k_reward) trains 2 steps with rollout.name=vllm on a WebGPU rank, i.e. on the
#     WebGPU slot decoder, at Qwen2.5-0.5B's shape (fresh weights, the tok512 tokenizer).
# What .gpu must hold besides the bundle (made here, see docs/gpu.md "Multi-turn on the GPU"):
#   app/dist/test/models/{families_export.test.js,families_fixtures.js}  from the build's dist/test
#   gsm8k_tool/test.parquet   node bin/verl.js preprocess gsm8k --agent (train.parquet is left out to fit
#                             the 64 MiB carry; the test split is used for both)
#   mt_tok/                   tok512.bin + recipes/gsm8k_multiturn/config/chatml_tools.jinja as chat_template.jinja
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-outputs/gpu_checks}"
mkdir -p "$OUT"
status=0
PARTS="${PARTS:-export,multiturn}"   # a comma list: which of the two parts to run

if [[ ",$PARTS," == *",export,"* ]]; then
echo "== 1. transformers reloads every family's export"
mkdir -p .gpu/app/test/models && cp -r test/models/fixtures .gpu/app/test/models/
VERL_TRANSFORMERS_PYTHON=python3 timeout 240 bash scripts/gpu-run.sh node dist/test/models/families_export.test.js 2>&1 | tee "$OUT/families_export.tap" | grep -E "^(not )?ok|# (pass|fail|skip)|diff" || true
grep -q "^# fail 0" "$OUT/families_export.tap" || status=1
fi

[[ ",$PARTS," == *",multiturn,"* ]] || exit $status
echo "== 2. multi-turn GSM8K tool agent, 2 GRPO steps, rollout.name=vllm on WebGPU"
cp .gpu/gsm8k_tool/test.parquet .gpu/gsm8k_tool/train.parquet
M=actor_rollout_ref.model.override_config
VERL="bash $PWD/scripts/gpu-run.sh verl" DATA=.gpu/gsm8k_tool GSM8K_RAW=.gpu MODEL=scratch VERL_FILE_LOGGER_PATH="$OUT/multiturn_metrics.jsonl" \
  timeout "${MULTITURN_TIMEOUT_S:-420}" bash recipes/gsm8k_multiturn/run.sh \
  actor_rollout_ref.model.tokenizer_path=.gpu/mt_tok \
  +$M.model_type=qwen2 "+$M.architectures=[Qwen2ForCausalLM]" +$M.tie_word_embeddings=true +$M.hidden_size=896 \
  +$M.intermediate_size=4864 +$M.num_hidden_layers=24 +$M.num_attention_heads=14 +$M.num_key_value_heads=2 \
  +$M.max_position_embeddings=2048 \
  trainer.device=webgpu actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.calculate_log_probs=True \
  data.train_batch_size=16 data.max_prompt_length=1152 data.max_response_length=256 actor_rollout_ref.rollout.n=4 \
  actor_rollout_ref.actor.ppo_mini_batch_size=16 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8 \
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16 actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16 \
  actor_rollout_ref.rollout.multi_turn.max_assistant_turns=3 trainer.total_training_steps=2 trainer.test_freq=-1 \
  trainer.val_before_train=False trainer.n_gpus_per_node=1 'trainer.logger=["console","file"]' \
  trainer.default_local_dir="$OUT/ckpt" "$@" 2>&1 | tee "$OUT/multiturn.log" | grep -vE "^\s*$" | tail -60
[ "${PIPESTATUS[0]}" = 0 ] || status=1
exit $status
