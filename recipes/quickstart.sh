#!/usr/bin/env bash
# The quickstart: a from-scratch pipeline that needs nothing from outside the repo.
#   1. verl preprocess arithmetic   synthetic addition problems in GSM8K's layout ("#### N" answers)
#   2. verl sft                     a tiny character-level model trained from scratch on them
#   3. verl train (GRPO)            reinforcement learning from the SFT'd model, rewarded by the GSM8K scorer
# It prints the metrics as it goes and, at the end, the validation accuracy before
# and after GRPO (val-core/openai/gsm8k/reward/mean@1: greedy answers on the held-out problems).
#
#   npm run quickstart                      # = npm run build && bash recipes/quickstart.sh
#   SMOKE=1 bash recipes/quickstart.sh      # the same pipeline in seconds (no learning to speak of)
#
# Env: OUT (outputs/quickstart), SFT_STEPS, STEPS, BATCH, LR (see recipes/arithmetic/).
set -euo pipefail
START=$(date +%s)
GIVEN_OUT="${OUT:-}"
source "$(dirname "${BASH_SOURCE[0]}")/arithmetic/common.sh"
OUT="${GIVEN_OUT:-$OUTPUTS/quickstart}"
if [ "$SMOKE" = "1" ]; then
  OUT="$OUTPUTS/smoke/quickstart"
  export NUM_TRAIN=256 NUM_TEST=32 SFT_STEPS=4 STEPS=2 BATCH=8 TEST_FREQ=2
else
  export NUM_TRAIN="${NUM_TRAIN:-5000}" NUM_TEST="${NUM_TEST:-500}" SFT_STEPS="${SFT_STEPS:-400}" STEPS="${STEPS:-150}" BATCH="${BATCH:-64}" TEST_FREQ="${TEST_FREQ:-25}"
fi
fresh_dir "$OUT"
export OUT DATA="$OUT/data"

echo "== 1/3 data: verl preprocess arithmetic -> $DATA"
$VERL preprocess arithmetic --local_save_dir "$DATA" --num-train "$NUM_TRAIN" --num-test "$NUM_TEST" --seed 0
echo "== 2/3 SFT: a from-scratch model, $SFT_STEPS steps"
SMOKE=0 bash "$ARITH/sft.sh"
echo "== 3/3 GRPO from the SFT'd model, $STEPS steps"
SMOKE=0 bash "$ARITH/run_grpo.sh"

$VERL plot "$OUT/grpo/metrics.jsonl" --out "$OUT/plots" > /dev/null
node --input-type=module - "$OUT" "$START" <<'JS'
import { readFileSync } from "node:fs";
const [out, start] = process.argv.slice(2);
const read = (f) => readFileSync(f, "utf8").trim().split("\n").map((l) => JSON.parse(l));
const key = "val-core/openai/gsm8k/reward/mean@1";
const val = read(`${out}/grpo/metrics.jsonl`).filter((r) => key in r.data);
const sft = read(`${out}/sft/metrics.jsonl`).filter((r) => "val/loss" in r.data).pop();
const first = val[0], last = val[val.length - 1];
const secs = Math.round(Date.now() / 1000 - Number(start));
const pct = (v) => `${(100 * v).toFixed(1)}%`;
console.log("\n== quickstart summary");
if (sft) console.log(`SFT: ${sft.step} steps, val/loss ${sft.data["val/loss"].toFixed(4)}`);
console.log(`validation accuracy (${key}): ${pct(first.data[key])} at step ${first.step} (the SFT model) -> ${pct(last.data[key])} at step ${last.step} (after GRPO)`);
console.log(`wall time: ${Math.floor(secs / 60)} min ${secs % 60} s`);
console.log(`metrics: ${out}/sft/metrics.jsonl, ${out}/grpo/metrics.jsonl; plots: ${out}/plots/`);
const ck = `${out}/grpo/checkpoints`;
const step = readFileSync(`${ck}/latest_checkpointed_iteration.txt`, "utf8").trim();
console.log(`GRPO policy (a Hugging Face folder transformers loads): ${ck}/global_step_${step}/actor/huggingface`);
console.log(`  copy it out with: node bin/verl.js export ${ck} --target_dir my_model`);
JS
