#!/usr/bin/env node
// Turns the launcher calls captured by scripts/capture-verl-examples.sh into
// test/config/fixtures/verl_examples.json: one entry per trainer call of verl's example scripts
// (verl.trainer.main_ppo, fsdp_sft_trainer, sft_trainer) with its --config-path/--config-name and overrides.
// Usage: node scripts/verl-examples-fixture.mjs /tmp/verl-examples.jsonl [--commit SHA]
import { readFileSync, renameSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

const root = fileURLToPath(new URL("..", import.meta.url));
const args = process.argv.slice(2);
const commitAt = args.indexOf("--commit");
const commit = commitAt >= 0 ? args.splice(commitAt, 2)[1] : null;
const input = args[0];
if (!input) {
  console.error("usage: node scripts/verl-examples-fixture.mjs CAPTURED.jsonl [--commit SHA]");
  process.exit(2);
}
const TRAINERS = { "verl.trainer.main_ppo": "ppo", "verl.trainer.fsdp_sft_trainer": "sft", "verl.trainer.sft_trainer": "sft_engine" };
const entries = [];
for (const line of readFileSync(input, "utf8").split("\n")) {
  if (!line.trim()) continue;
  const call = JSON.parse(line);
  const at = call.argv.findIndex((a, i) => a === "-m" && TRAINERS[call.argv[i + 1]]);
  if (at < 0) continue;
  const rest = call.argv.slice(at + 2);
  const entry = { script: call.script, trainer: TRAINERS[call.argv[at + 1]], configPath: null, configName: null, overrides: [] };
  for (let i = 0; i < rest.length; i++) {
    const a = rest[i];
    const m = /^--(config-path|config-name|config_path|config_name)(?:=(.*))?$/.exec(a);
    if (m) {
      const value = m[2] ?? rest[++i];
      if (m[1].startsWith("config-path") || m[1] === "config_path") entry.configPath = value;
      else entry.configName = value;
    } else if (a.trim() !== "") entry.overrides.push(a);
  }
  entries.push(entry);
}
const out = join(root, "test/config/fixtures/verl_examples.json");
writeFileSync(`${out}.tmp`, JSON.stringify({ source: "volcengine/verl examples/**/run_*.sh", commit, entries }, null, 1) + "\n");
renameSync(`${out}.tmp`, out);
const count = (t) => entries.filter((e) => e.trainer === t).length;
console.log(`${entries.length} trainer calls: ${count("ppo")} ppo, ${count("sft")} sft, ${count("sft_engine")} sft_engine`);
