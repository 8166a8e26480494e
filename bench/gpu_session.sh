#!/usr/bin/env bash
# The runs behind docs/gpu.md's `verl train` figures, in one device session (a fresh machine
# costs minutes, so they go together). After scripts/gpu-bundle.sh, on the GPU machine with
# .gpu and .gl carried:   bash bench/gpu_session.sh "$OUT" webgpu
# and here, for the CPU side (the bundle's CLI on wasm):
#   VERL_CMD="node .gpu/app/bin/verl.js" BENCH_CMD="node .gpu/app/dist/bench/gpu.js" LARGE_TIMEOUT=1 bash bench/gpu_session.sh OUTDIR wasm
# 1: the stories GRPO recipe for STEPS steps (RANKS ranks, default 1; validation off); 2: bench/gpu.ts on the worker
# path and the device step; 3: a fresh ~60M model (LARGE) for LARGE_STEPS steps. Logs and
# metrics.jsonl files go to OUTDIR.
set -uo pipefail
D="$1"; DEV="${2:-webgpu}"; shift 2 || true
VERL_CMD="${VERL_CMD:-bash scripts/gpu-run.sh verl}"
BENCH_CMD="${BENCH_CMD:-bash scripts/gpu-run.sh bench}"
STEPS="${STEPS:-5}"
RANKS="${RANKS:-1}"  # rank threads for part 1 (each its own Dawn device on the one GPU)
LARGE="${LARGE:-hidden_size=640 intermediate_size=1728 num_hidden_layers=12 num_attention_heads=10}"
mkdir -p "$D"
T0=$(date +%s)
echo "== 1. stories GRPO recipe, $STEPS steps, $RANKS rank(s), trainer.device=$DEV"
OUT=/tmp/sg STEPS=$STEPS VERL="$VERL_CMD" MODEL_PATH=.gpu/stories260K/stories260K.bin timeout 240 bash recipes/stories_grpo/run.sh \
  custom_reward_function.path="$PWD/.gpu/reward.mjs" trainer.n_gpus_per_node=$RANKS trainer.device=$DEV \
  trainer.val_before_train=False trainer.test_freq=-1 > "$D/stories.log" 2>&1
echo "rc $? after $(( $(date +%s) - T0 )) s"; cp /tmp/sg/metrics.jsonl "$D/stories_metrics.jsonl" 2>/dev/null; tail -c 3000 "$D/stories.log" | grep -v "^step:" | tail -5
echo "== 2. worker path + device step benchmarks"
timeout 150 $BENCH_CMD --backend $DEV --only worker,actor,logprob --reps 3 > "$D/bench.jsonl" 2> /tmp/bench.err
echo "rc $? after $(( $(date +%s) - T0 )) s"; cut -c1-330 "$D/bench.jsonl"; tail -3 /tmp/bench.err
echo "== 3. fresh model ($LARGE), ${LARGE_STEPS:-3} steps"
ov=(); for kv in $LARGE; do ov+=("+actor_rollout_ref.model.override_config.$kv"); done
# a fresh model never writes "dog"; "a" it does now and then, so the GRPO advantages are not all zero
sed 's/"ground_truth":"dog"/"ground_truth":"a"/' /tmp/sg/data/train.jsonl > /tmp/sg/data/train_a.jsonl
VERL_FILE_LOGGER_PATH="$D/large_metrics.jsonl" timeout ${LARGE_TIMEOUT:-300} $VERL_CMD train algorithm.adv_estimator=grpo \
  data.train_files=/tmp/sg/data/train_a.jsonl data.val_files=/tmp/sg/data/test.jsonl data.max_prompt_length=16 data.max_response_length=16 \
  data.train_batch_size=16 actor_rollout_ref.rollout.n=4 actor_rollout_ref.actor.ppo_mini_batch_size=16 \
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16 actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16 \
  actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16 actor_rollout_ref.model.path=scratch \
  actor_rollout_ref.model.tokenizer_path=.gpu/stories260K "${ov[@]}" actor_rollout_ref.actor.optim.lr=1e-4 \
  actor_rollout_ref.actor.use_kl_loss=True custom_reward_function.path="$PWD/.gpu/reward.mjs" custom_reward_function.name=compute_score \
  trainer.total_training_steps=${LARGE_STEPS:-3} trainer.val_before_train=False trainer.test_freq=-1 'trainer.logger=["console","file"]' \
  trainer.n_gpus_per_node=1 trainer.device=$DEV trainer.resume_mode=disable trainer.default_local_dir=/tmp/large_ckpt > "$D/large.log" 2>&1
echo "rc $? after $(( $(date +%s) - T0 )) s"; grep -v "^step:" "$D/large.log" | tail -4 | cut -c1-600
