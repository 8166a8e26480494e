#!/usr/bin/env node
// Writes test/config/fixtures/verl_schema.json: every leaf key of verl's composed configs with
// verl's default, read from a checkout of verl's verl/trainer/config folder. The test
// test/config/schema.test.ts holds conf/'s composed key set against it, so CI needs no verl copy.
// Usage (after `npx tsc`):
//   git -C /work/.mirror/volcengine+verl/repo archive HEAD verl/trainer/config | tar -x -C /tmp/verl
//   node scripts/verl-schema.mjs /tmp/verl/verl/trainer/config [--commit SHA]
// `_target_` leaves (Python class paths for verl's dataclasses) are left out: they name nothing here.
import { readFileSync, renameSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { parse } from "yaml";

const root = fileURLToPath(new URL("..", import.meta.url));
const args = process.argv.slice(2);
const commitAt = args.indexOf("--commit");
const commit = commitAt >= 0 ? args.splice(commitAt, 2)[1] : null;
const dir = args[0];
if (!dir) {
  console.error("usage: node scripts/verl-schema.mjs VERL_CONFIG_DIR [--commit SHA]");
  process.exit(2);
}
const { composeConfig } = await import(join(root, "dist/src/config/compose.js"));

/** Leaves of a mapping as dotted key -> value; an empty mapping is a leaf of its own. */
function leaves(node, prefix = "", out = {}) {
  for (const [k, v] of Object.entries(node)) {
    if (k === "_target_") continue;
    const p = prefix ? `${prefix}.${k}` : k;
    if (v !== null && typeof v === "object" && !Array.isArray(v) && Object.keys(v).length > 0) leaves(v, p, out);
    else out[p] = v;
  }
  return out;
}

const readYaml = (name) => parse(readFileSync(join(dir, name), "utf8"), { merge: true });
// verl ships the PPO configs flattened (print_cfg --cfg job); its SFT configs are composed here.
const configs = {
  ppo_trainer: leaves(readYaml("_generated_ppo_trainer.yaml")),
  ppo_megatron_trainer: leaves(readYaml("_generated_ppo_megatron_trainer.yaml")),
  sft_trainer: leaves(composeConfig({ configName: "sft_trainer", configPath: dir })),
  sft_trainer_engine: leaves(composeConfig({ configName: "sft_trainer_engine", configPath: dir })),
};
const out = join(root, "test/config/fixtures/verl_schema.json");
const text = JSON.stringify({ source: "volcengine/verl verl/trainer/config", commit, configs }, null, 1) + "\n";
writeFileSync(`${out}.tmp`, text);
renameSync(`${out}.tmp`, out);
for (const [name, keys] of Object.entries(configs)) console.log(`${name}: ${Object.keys(keys).length} leaf keys`);
