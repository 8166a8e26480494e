#!/usr/bin/env node
// Runs the compiled tests under dist/test with node's built-in runner and the
// project's reporter, which ends with the line "N passed, N failed, N skipped".
// Usage: node scripts/run-tests.mjs [--dist DIR] [substring ...]   (filters test files by path)
// --dist DIR (default dist) runs a build made with `tsc --outDir DIR`, e.g. a second checkout's
// build beside a benchmark that is running from dist/.
import { readdirSync, statSync } from "node:fs";
import { join, relative } from "node:path";
import { spawnSync } from "node:child_process";
import { fileURLToPath } from "node:url";

const root = fileURLToPath(new URL("..", import.meta.url));
const args = process.argv.slice(2);
const distAt = args.indexOf("--dist");
const distDir = distAt >= 0 ? args.splice(distAt, 2)[1] : "dist";
if (!distDir) {
  console.error("--dist needs a directory (the tsc --outDir of the build to test)");
  process.exit(2);
}
const testDir = join(root, distDir, "test");

function collect(dir) {
  const out = [];
  for (const name of readdirSync(dir).sort()) {
    const p = join(dir, name);
    if (statSync(p).isDirectory()) out.push(...collect(p));
    else if (name.endsWith(".test.js")) out.push(p);
  }
  return out;
}

const filters = args;
let files;
try {
  files = collect(testDir);
} catch {
  console.error(`no compiled tests at ${relative(root, testDir)}: build first (npm run build, or tsc --outDir ${distDir})`);
  process.exit(1);
}
if (filters.length) files = files.filter((f) => filters.some((s) => relative(root, f).includes(s)));
if (files.length === 0) {
  console.error(`no test files matched under ${relative(root, testDir)}`);
  process.exit(1);
}
const res = spawnSync(
  process.execPath,
  ["--test", "--test-reporter", join(root, "scripts", "test-reporter.mjs"), ...files],
  { stdio: "inherit", env: { ...process.env, VERL_TEST: "1" } },
);
process.exit(res.status ?? 1);
