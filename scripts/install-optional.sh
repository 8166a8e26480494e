#!/usr/bin/env bash
# The packages verl-ts installs on request, not with `npm ci` (keeps a plain install under 400 MB):
#   webgpu  trainer.device=webgpu: Dawn (webgpu, 132 MB of prebuilts) + @tensorflow/tfjs-backend-webgpu
#   llama   rollout.name=llama_cpp: node-llama-cpp and its prebuilt llama.cpp builds (~720 MB with CUDA)
# Usage: bash scripts/install-optional.sh webgpu|llama ...   (installs the missing ones; exits 0 when present)
# `npm install --no-save` drops other unsaved packages, so every set already present is named again.
set -euo pipefail
cd "$(dirname "$0")/.."
declare -A PKGS=(
  [webgpu]="webgpu@0.6.2 @tensorflow/tfjs-backend-webgpu@4.22.0"
  [llama]="node-llama-cpp@3.21.1"
)
declare -A PRESENT=(
  [webgpu]="node_modules/webgpu/package.json node_modules/@tensorflow/tfjs-backend-webgpu/package.json"
  [llama]="node_modules/node-llama-cpp/package.json"
)
have() { local f; for f in ${PRESENT[$1]}; do [ -f "$f" ] || return 1; done; }
want=() missing=0
for set in "$@"; do
  [ -n "${PKGS[$set]:-}" ] || { echo "unknown set '$set' (webgpu, llama)" >&2; exit 2; }
  have "$set" || missing=1
done
[ "$missing" = 1 ] || exit 0
for set in "${!PKGS[@]}"; do
  if have "$set" || [[ " $* " == *" $set "* ]]; then want+=(${PKGS[$set]}); fi
done
echo "installing on request: ${want[*]}" >&2
npm install --no-save --no-audit --no-fund "${want[@]}"
