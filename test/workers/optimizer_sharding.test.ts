// Which verl keys shard a role's optimizer state, with verl's meaning: FSDP's fsdp_size
// (-1 or >= ranks: all ranks; k: groups of k; 1: replicated), Megatron's use_distributed_optimizer.
import { test } from "node:test";
import assert from "node:assert/strict";
import { loadConfig } from "../../src/config/index.js";
import { ConfigView } from "../../src/workers/config_view.js";
import { optimizerShards, roleOptimizerShards } from "../../src/workers/optimizer_sharding.js";

const actor = (overrides: string[], configName = "ppo_trainer") => new ConfigView(loadConfig({ configName, overrides }), "actor_rollout_ref.actor");

test("fsdp_size: -1 by default shards over every rank; k over groups of k; 1 replicates; a non-divisor is refused naming the key", () => {
  assert.equal(roleOptimizerShards(actor([]), "fsdp_config", 4), 4);
  assert.equal(roleOptimizerShards(actor([]), "fsdp_config", 1), 1);
  assert.equal(roleOptimizerShards(actor(["actor_rollout_ref.actor.fsdp_config.fsdp_size=8"]), "fsdp_config", 4), 4);
  assert.equal(roleOptimizerShards(actor(["actor_rollout_ref.actor.fsdp_config.fsdp_size=2"]), "fsdp_config", 4), 2);
  assert.equal(roleOptimizerShards(actor(["actor_rollout_ref.actor.fsdp_config.fsdp_size=1"]), "fsdp_config", 4), 1);
  assert.throws(() => roleOptimizerShards(actor(["actor_rollout_ref.actor.fsdp_config.fsdp_size=3"]), "fsdp_config", 4),
    /actor_rollout_ref\.actor\.fsdp_config\.fsdp_size=3 must divide the world size 4/);
  assert.throws(() => roleOptimizerShards(actor(["actor_rollout_ref.actor.fsdp_config.fsdp_size=0"]), "fsdp_config", 4), /fsdp_size=0 must divide/);
  const critic = new ConfigView(loadConfig({ configName: "ppo_trainer", overrides: ["critic.model.fsdp_config.fsdp_size=1"] }), "critic");
  assert.equal(roleOptimizerShards(critic, "model.fsdp_config", 2), 1);
});

test("strategy megatron: use_distributed_optimizer (true by default) shards over every rank, false replicates", () => {
  assert.equal(roleOptimizerShards(actor([], "ppo_megatron_trainer"), "fsdp_config", 2), 2);
  assert.equal(roleOptimizerShards(actor(["actor_rollout_ref.actor.megatron.use_distributed_optimizer=false"], "ppo_megatron_trainer"), "fsdp_config", 2), 1);
  const sft = new ConfigView(loadConfig({ configName: "sft_trainer_engine", overrides: ["engine.fsdp_size=1"] }), "engine");
  assert.equal(optimizerShards(sft, sft.str("strategy"), 2), 1);
});
