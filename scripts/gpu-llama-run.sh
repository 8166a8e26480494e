#!/usr/bin/env bash
# On the GPU machine (carry .gpu and .gl, built by scripts/gpu-llama-bundle.sh): unpacks the
# prebuilt llama.cpp Vulkan build into the bundle, then runs scripts/gpu-run.sh with the
# same arguments, e.g.
#   bash scripts/gpu-llama-run.sh node dist/bench/rollout_engines.js --shape 0.5b --gpu vulkan
#   bash scripts/gpu-llama-run.sh verl train ... actor_rollout_ref.rollout.name=llama_cpp
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -d .gpu/app/node_modules/@node-llama-cpp/linux-x64-vulkan/bins ]; then
  python3 -c "import lzma,tarfile; tarfile.open(fileobj=lzma.open('.gpu/llama-vulkan.tar.xz')).extractall('.gpu/app')"
fi
exec bash scripts/gpu-run.sh "$@"
