import { test } from "node:test";
import assert from "node:assert/strict";
import { editDistance, suggestKeys } from "../../src/config/suggest.js";
import { loadConfig } from "../../src/config/index.js";

test("edit distance", () => {
  assert.equal(editDistance("", "abc"), 3);
  assert.equal(editDistance("kitten", "sitting"), 3);
  assert.equal(editDistance("lr", "lr"), 0);
});

test("suggestions cover typos, missing prefixes and misplaced keys in the real tree", () => {
  const cfg = loadConfig({ configName: "ppo_trainer" });
  assert.deepEqual(suggestKeys(cfg, "actor.optim.lr"), ["actor_rollout_ref.actor.optim.lr"]);
  assert.deepEqual(suggestKeys(cfg, "actor_rollout_ref.actor.optim.lrr"), ["actor_rollout_ref.actor.optim.lr"]);
  assert.deepEqual(suggestKeys(cfg, "trainer.total_epoch"), ["trainer.total_epochs"]);
  assert.deepEqual(suggestKeys(cfg, "data.train_batch"), ["data.train_batch_size"]);
  assert.ok(suggestKeys(cfg, "actor_rollout_ref.rollout.ppo_mini_batch_size").includes("actor_rollout_ref.actor.ppo_mini_batch_size"));
  assert.deepEqual(suggestKeys(cfg, "trainer.no_such_key"), []);
});
