#!/usr/bin/env bash
# Captures the command lines of verl's example scripts (examples/**/run_*.sh): each runs under bash with
# its launchers (python3, python, torchrun, ray, ...) replaced by shims that record their argv as JSON
# lines, so bash expands the scripts' variables exactly as a user's shell would. The result is turned into
# test/config/fixtures/verl_examples.json by scripts/verl-examples-fixture.mjs (CI then needs no verl copy).
# Usage: scripts/capture-verl-examples.sh VERL_CHECKOUT [OUT.jsonl]
#   git -C /work/.mirror/volcengine+verl/repo archive HEAD examples | tar -x -C /tmp/verl
set -uo pipefail
src=${1:?usage: capture-verl-examples.sh VERL_CHECKOUT [OUT.jsonl]}
out=$(realpath -m "${2:-/tmp/verl-examples.jsonl}")
shims=$(mktemp -d)
trap 'rm -rf "$shims"' EXIT
recorder="$shims/record.mjs"
cat > "$recorder" <<'JS'
import { appendFileSync } from "node:fs";
const [launcher, ...argv] = process.argv.slice(2);
appendFileSync(process.env.CAPTURE_OUT, JSON.stringify({ script: process.env.CAPTURE_SCRIPT, launcher, argv }) + "\n");
JS
node_bin=$(command -v node)
for name in python3 python torchrun ray accelerate deepspeed nvidia-smi pip pip3 huggingface-cli hf wget hdfs; do
  printf '#!/bin/sh\nexec "%s" "%s" "%s" "$@"\n' "$node_bin" "$recorder" "$name" > "$shims/$name"
  chmod +x "$shims/$name"
done
: > "$out"
cd "$src" || exit 2
run() {
  CAPTURE_OUT=$out CAPTURE_SCRIPT=$1 PATH="$shims:$PATH" HOME=/home/user \
    timeout 20 bash "$@" < /dev/null > /dev/null 2>&1
}
find examples -name 'run_*.sh' | sort | while read -r script; do
  before=$(grep -c . "$out")
  run "$script"
  # A script that stops at its usage line wants positional arguments (nproc_per_node, save_path):
  # run it again with some; scripts that take none would pass them on as overrides ("$@").
  if [ "$(grep -c . "$out")" = "$before" ]; then run "$script" 1 /tmp/verl-save; fi
done
echo "captured $(wc -l < "$out") launcher calls into $out"
