#!/usr/bin/env node
// The package files a bundle needs, from an esbuild metafile: every node_modules input, the
// package.json files from it up to its package root (Node reads "exports", "main", "type"),
// and with --wasm the .wasm files beside each input (tfjs-backend-wasm and parquet-wasm load
// theirs by path). Used by scripts/gpu-bundle.sh and scripts/gpu-llama-bundle.sh.
// Usage: node scripts/esbuild-inputs.mjs META.json OUT.txt [--wasm]
import fs from "node:fs";
import path from "node:path";

const [metaPath, outPath, flag] = process.argv.slice(2);
if (!metaPath || !outPath) {
  console.error("usage: node scripts/esbuild-inputs.mjs META.json OUT.txt [--wasm]");
  process.exit(2);
}
const meta = JSON.parse(fs.readFileSync(metaPath, "utf8"));
const files = new Set();
for (const f of Object.keys(meta.inputs)) {
  if (!f.startsWith("node_modules/")) continue;
  files.add(f);
  const at = f.lastIndexOf("node_modules/") + "node_modules/".length, parts = f.slice(at).split("/");
  const root = f.slice(0, at) + parts.slice(0, parts[0].startsWith("@") ? 2 : 1).join("/");
  for (let d = path.dirname(f); d.length >= root.length; d = path.dirname(d)) {
    if (fs.existsSync(path.join(d, "package.json"))) files.add(path.join(d, "package.json"));
  }
  if (flag === "--wasm") for (const w of fs.readdirSync(path.dirname(f))) if (w.endsWith(".wasm")) files.add(path.join(path.dirname(f), w));
}
fs.writeFileSync(outPath, [...files].sort().join("\n") + "\n");
