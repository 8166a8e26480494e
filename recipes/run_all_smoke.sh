#!/usr/bin/env bash
# Every recipe with SMOKE=1 (a couple of tiny steps each): the CI check that the
# recipes still run. Fails when any recipe fails; logs in outputs/smoke/logs/.
set -uo pipefail
RECIPES="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
LOGS="${OUTPUTS:-$RECIPES/../outputs}/smoke/logs"
mkdir -p "$LOGS"
LIST=(
  quickstart.sh
  arithmetic/sft.sh arithmetic/run_grpo.sh arithmetic/run_rloo.sh arithmetic/run_reinforce_plus_plus.sh
  stories_grpo/run.sh gsm8k_grpo/run.sh gsm8k_ppo/run.sh qwen05b_shape_grpo/run.sh
)
[ -f "$RECIPES/gsm8k_multiturn/run.sh" ] && LIST+=(gsm8k_multiturn/run.sh)

failed=()
all_start=$(date +%s)
for r in "${LIST[@]}"; do
  log="$LOGS/${r//\//_}.log"
  start=$(date +%s)
  if SMOKE=1 bash "$RECIPES/$r" > "$log" 2>&1; then
    note=$(grep -m1 '^SKIP ' "$log" || true)
    echo "ok    $r ($(( $(date +%s) - start )) s)${note:+  $note}"
  else
    echo "FAIL  $r ($(( $(date +%s) - start )) s): log $log"
    tail -n 15 "$log" | sed 's/^/      /'
    failed+=("$r")
  fi
done
echo "smoke recipes: $(( ${#LIST[@]} - ${#failed[@]} ))/${#LIST[@]} passed in $(( $(date +%s) - all_start )) s"
[ ${#failed[@]} -eq 0 ]
