#!/usr/bin/env bash
# Adds the llama_cpp rollout engine to the GPU bundle (run scripts/gpu-bundle.sh first, or
# let this script run it): node-llama-cpp's JavaScript and the files it loads at run time
# (traced by esbuild, as gpu-bundle.sh traces ours) go into .gpu/app/node_modules; its
# prebuilt Vulkan build (@node-llama-cpp/linux-x64-vulkan: libggml-vulkan.so is 55 MB,
# 5.8 MB under xz) travels as .gpu/llama-vulkan.tar.xz, unpacked on the GPU machine by
# scripts/gpu-llama-run.sh. Nothing is downloaded or compiled: both packages come from
# node_modules (scripts/install-optional.sh installs them on request).
set -euo pipefail
cd "$(dirname "$0")/.."
# node-llama-cpp (and the WebGPU packages gpu-bundle.sh needs) install on request, not with npm ci.
bash scripts/install-optional.sh webgpu llama
[ -d node_modules/@node-llama-cpp/linux-x64-vulkan ] || {
  echo "@node-llama-cpp/linux-x64-vulkan is missing after installing node-llama-cpp (it installs on linux-x64 only)" >&2; exit 2; }
# always rebuild the app (dist is compiled from this checkout); Node and dawn.node are kept
bash scripts/gpu-bundle.sh
APP=.gpu/app
meta=$(mktemp -d)
nice -n 19 npx esbuild node_modules/node-llama-cpp/dist/index.js --bundle --platform=node --format=esm --target=node20 \
  --outdir="$meta/out" --metafile="$meta/meta.json" --log-level=error --main-fields=main --conditions=node \
  --external:'@node-llama-cpp/*' --external:'@reflink/*' --external:'*.node'
node scripts/esbuild-inputs.mjs "$meta/meta.json" "$meta/files"
# read at run time by path: the binding metadata and the addon sources list (not the 34 MB git bundle)
find node_modules/node-llama-cpp/llama -maxdepth 1 -type f -name '*.json' >> "$meta/files"
find node_modules/node-llama-cpp/package.json node_modules/@node-llama-cpp/linux-x64-vulkan -type f -not -path '*/bins/*' >> "$meta/files"
sort -u -o "$meta/files" "$meta/files"
tar -cf - -T "$meta/files" | tar -xf - -C "$APP"
# ggml's CPU backend comes in one build per x86 generation and loads the best the host supports:
# keep the baseline and the server generations (halves the archive; the bundle must stay < 64 MiB)
bins=node_modules/@node-llama-cpp/linux-x64-vulkan/bins
find "$bins" -type f | grep -vE 'libggml-cpu-(alderlake|cannonlake|cascadelake|cooperlake|ivybridge|piledriver|sandybridge)\.so$' > "$meta/bins"
# (minutes under xz -9e: kept from an earlier run unless the package changed)
if [ ! -s .gpu/llama-vulkan.tar.xz ] || [ "$bins" -nt .gpu/llama-vulkan.tar.xz ]; then
  nice -n 19 tar -cf - -T "$meta/bins" | nice -n 19 xz -T2 -9e > .gpu/llama-vulkan.tar.xz.tmp && mv .gpu/llama-vulkan.tar.xz.tmp .gpu/llama-vulkan.tar.xz
fi
rm -rf "$meta"
du -sh .gpu .gpu/llama-vulkan.tar.xz .gl
