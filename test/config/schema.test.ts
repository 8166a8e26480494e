// conf/ holds every leaf key of verl's composed configs (test/config/fixtures/verl_schema.json,
// written by scripts/verl-schema.mjs from verl's own YAML), so a verl script's overrides find their keys.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { composeConfig } from "../../src/config/compose.js";
import { loadConfig } from "../../src/config/index.js";
import { getPath, isNode } from "../../src/config/tree.js";
import { packageRoot } from "../../src/utils/paths.js";

interface VerlSchema { commit: string | null; configs: Record<string, Record<string, unknown>> }

export function verlSchema(): VerlSchema {
  return JSON.parse(readFileSync(join(packageRoot, "test/config/fixtures/verl_schema.json"), "utf8")) as VerlSchema;
}

const schema = verlSchema();

for (const [name, keys] of Object.entries(schema.configs)) {
  test(`conf/${name} composes to a superset of verl's ${name} leaf keys`, () => {
    const cfg = composeConfig({ configName: name });
    const missing = Object.keys(keys).filter((k) => getPath(cfg, k) === undefined);
    assert.deepEqual(missing, [], `${missing.length} of verl's ${Object.keys(keys).length} keys are missing`);
    // A verl leaf must stay a leaf (or an empty mapping), never turn into a section here.
    const reshaped = Object.entries(keys).filter(([k, v]) => {
      const mine = getPath(cfg, k);
      return isNode(mine) && Object.keys(mine).length > 0 && !(isNode(v) || v === null);
    });
    assert.deepEqual(reshaped.map(([k]) => k), []);
  });
}

test("the fixture holds verl's four composed configs", () => {
  assert.deepEqual(Object.keys(schema.configs).sort(), ["ppo_megatron_trainer", "ppo_trainer", "sft_trainer", "sft_trainer_engine"]);
  assert.ok(Object.keys(schema.configs.ppo_trainer!).length > 500);
});

test("--config-name ppo_megatron_trainer resolves, with megatron sections and verl-ts's trainer keys", () => {
  const cfg = loadConfig({ configName: "ppo_megatron_trainer", overrides: ["actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2"] });
  assert.equal(getPath(cfg, "actor_rollout_ref.actor.megatron.tensor_model_parallel_size"), 2);
  assert.equal(getPath(cfg, "actor_rollout_ref.actor.strategy"), "megatron");
  assert.equal(getPath(cfg, "trainer.device"), "auto");
  assert.equal(getPath(cfg, "actor_rollout_ref.model.lora.rank"), 0);
});
