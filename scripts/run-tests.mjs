#!/usr/bin/env node
// Runs the compiled tests under dist/test with node's built-in runner and the
// project's reporter, which ends with the line "N passed, N failed, N skipped".
// Usage: node scripts/run-tests.mjs [substring ...]   (filters test files by path)
import { readdirSync, statSync } from "node:fs";
import { join, relative } from "node:path";
import { spawnSync } from "node:child_process";
import { fileURLToPath } from "node:url";

const root = fileURLToPath(new URL("..", import.meta.url));
const testDir = join(root, "dist", "test");

function collect(dir) {
  const out = [];
  for (const name of readdirSync(dir).sort()) {
    const p = join(dir, name);
    if (statSync(p).isDirectory()) out.push(...collect(p));
    else if (name.endsWith(".test.js")) out.push(p);
  }
  return out;
}

const filters = process.argv.slice(2);
let files = collect(testDir);
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
