import { test } from "node:test";
import assert from "node:assert/strict";
import { composeConfig, type GroupChoice } from "../../src/config/compose.js";
import { ConfigError } from "../../src/config/errors.js";
import { getPath, type ConfigNode } from "../../src/config/tree.js";
import { configDir } from "./helpers.js";

const choice = (key: string, option: string): GroupChoice => ({ key, option, raw: `${key}=${option}`, used: false });

test("ppo_trainer places each group file at its package", () => {
  const cfg = composeConfig({ configName: "ppo_trainer" });
  assert.equal(getPath(cfg, "actor_rollout_ref.actor.ppo_mini_batch_size"), 256);
  assert.equal(getPath(cfg, "actor_rollout_ref.actor.optim.lr"), 1e-6, "the optim group lands inside the actor");
  assert.equal(getPath(cfg, "critic.optim.lr"), 1e-5, "the critic's own keys win over its optim group");
  assert.equal(getPath(cfg, "critic.optim.weight_decay"), 0.01);
  assert.equal(getPath(cfg, "actor_rollout_ref.rollout.name"), "tfjs");
  assert.equal(getPath(cfg, "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu"), null);
  assert.equal(getPath(cfg, "actor_rollout_ref.model.path"), "~/models/deepseek-llm-7b-chat");
  assert.equal(getPath(cfg, "data.train_batch_size"), 1024);
  assert.equal(getPath(cfg, "reward_model.reward_manager"), "naive");
  assert.equal(getPath(cfg, "algorithm.kl_ctrl.kl_coef"), 0.001);
  assert.equal(getPath(cfg, "trainer.n_gpus_per_node"), 1);
  assert.equal(getPath(cfg, "actor_rollout_ref.rollout.prompt_length"), "${oc.select:data.max_prompt_length,512}", "interpolation is left for later");
  assert.equal(getPath(cfg, "defaults"), undefined);
  assert.equal(getPath(cfg, "actor_rollout_ref.actor.defaults"), undefined);
});

test("every shipped root config composes", () => {
  for (const name of ["ppo_trainer", "sft_trainer", "generation", "evaluation"]) {
    const cfg = composeConfig({ configName: name });
    assert.ok(Object.keys(cfg).length > 0, name);
  }
  assert.equal(getPath(composeConfig({ configName: "sft_trainer" }), "optim.lr_scheduler"), "cosine");
  assert.equal(getPath(composeConfig({ configName: "generation" }), "rollout.top_k"), 50);
  assert.equal(getPath(composeConfig({ configName: "evaluation" }), "data.response_key"), "responses");
});

test("group=option picks another file, named by group, package path or group@package", () => {
  const dir = configDir({ "actor/tiny_actor.yaml": "defaults: [dp_actor, _self_]\nppo_mini_batch_size: 2\n" });
  for (const key of ["actor", "actor_rollout_ref/actor", "actor@actor_rollout_ref.actor"]) {
    const c = choice(key, "tiny_actor");
    const cfg = composeConfig({ configName: "ppo_trainer", configPath: dir, groupChoices: [c] });
    assert.equal(c.used, true, key);
    assert.equal(getPath(cfg, "actor_rollout_ref.actor.ppo_mini_batch_size"), 2, key);
    assert.equal(getPath(cfg, "actor_rollout_ref.actor.clip_ratio"), 0.2, `${key}: the base actor still composes under it`);
  }
  const unrelated = choice("foo", "bar");
  composeConfig({ configName: "ppo_trainer", groupChoices: [unrelated] });
  assert.equal(unrelated.used, false);
});

test("an unknown group option is an error listing the options", () => {
  assert.throws(
    () => composeConfig({ configName: "ppo_trainer", groupChoices: [choice("actor", "tpu_actor")] }),
    (e: unknown) => e instanceof ConfigError && /option 'tpu_actor' of config group 'actor'/.test(e.message) && /available: actor, dp_actor, megatron_actor/.test(e.message),
  );
});

test("a recipe extends ppo_trainer through its defaults list and hydra.searchpath", () => {
  const extra = configDir({ "actor/recipe_actor.yaml": "defaults: [dp_actor, _self_]\nclip_ratio_high: 0.28\n" });
  const dir = configDir({
    "my_recipe.yaml": [
      "hydra:",
      `  searchpath: [file://${extra}, pkg://verl.trainer.config]`,
      "defaults:",
      "  - ppo_trainer",
      "  - override actor@actor_rollout_ref.actor: recipe_actor",
      "  - _self_",
      "data:",
      "  gen_batch_size: 3",
      "algorithm:",
      "  filter_groups: {enable: true}",
    ].join("\n"),
  });
  const cfg = composeConfig({ configName: "my_recipe", configPath: dir });
  assert.equal(getPath(cfg, "actor_rollout_ref.actor.clip_ratio_high"), 0.28);
  assert.equal(getPath(cfg, "data.gen_batch_size"), 3);
  assert.equal(getPath(cfg, "data.train_batch_size"), 1024);
  assert.equal(getPath(cfg, "algorithm.filter_groups.enable"), true);
  assert.equal(getPath(cfg, "hydra"), undefined);
  // A command-line choice beats the recipe's override entry.
  const cli = composeConfig({ configName: "my_recipe", configPath: dir, groupChoices: [choice("actor", "dp_actor")] });
  assert.equal(getPath(cli, "actor_rollout_ref.actor.clip_ratio_high"), 0.2);
  // --config-name may be the recipe's path.
  const byPath = composeConfig({ configName: "my_recipe.yaml", cwd: dir });
  assert.equal(getPath(byPath, "data.gen_batch_size"), 3);
});

test("_self_ decides whether a file's own keys or its defaults win", () => {
  const dir = configDir({
    "base.yaml": "x: base\ny: base\n",
    "self_last.yaml": "defaults: [base]\nx: self\n",
    "self_first.yaml": "defaults: [_self_, base]\nx: self\n",
  });
  assert.deepEqual(composeConfig({ configName: "self_last", configPath: dir }), { x: "self", y: "base" });
  assert.deepEqual(composeConfig({ configName: "self_first", configPath: dir }), { x: "base", y: "base" });
});

test("packages: default group package, relative @pkg, _global_ and the # @package header", () => {
  const dir = configDir({
    "root.yaml": "defaults:\n  - db: small\n  - db@backup.db: small\n  - extras: glob\n  - optional missing: nothing\n  - _self_\n",
    "db/small.yaml": "defaults:\n  - /opt@tuning: fast\n  - _self_\nsize: 1\n",
    "opt/fast.yaml": "speed: 9\n",
    "extras/glob.yaml": "# @package _global_\ntop_level: true\n",
  });
  const cfg: ConfigNode = composeConfig({ configName: "root", configPath: dir });
  assert.deepEqual(cfg, {
    db: { size: 1, tuning: { speed: 9 } },
    backup: { db: { size: 1, tuning: { speed: 9 } } },
    top_level: true,
  });
});

test("lists are replaced, not concatenated; aliases are copies", () => {
  const dir = configDir({
    "base.yaml": "l: [1, 2, 3]\n",
    "top.yaml": "defaults: [base, _self_]\nl: [9]\nanchor: &a {k: 1}\nuse: *a\nmerged:\n  <<: *a\n  j: 2\n",
  });
  const cfg = composeConfig({ configName: "top", configPath: dir });
  assert.deepEqual(cfg.l, [9]);
  assert.deepEqual(cfg.merged, { k: 1, j: 2 });
  assert.notEqual(cfg.anchor, cfg.use);
});

test("missing configs, cycles and bad defaults are errors naming the file", () => {
  assert.throws(() => composeConfig({ configName: "no_such_config" }), (e: unknown) => e instanceof ConfigError && /cannot find config 'no_such_config'.*available: .*ppo_trainer/.test(e.message));
  const dir = configDir({
    "a.yaml": "defaults: [b]\n",
    "b.yaml": "defaults: [a]\n",
    "bad.yaml": "defaults: [{x: 1, y: 2}]\n",
    "list.yaml": "- 1\n",
    "broken.yaml": "a: [\n",
    "nested_override.yaml": "defaults: [inner]\n",
    "inner.yaml": "defaults: [{override actor: dp_actor}]\n",
  });
  assert.throws(() => composeConfig({ configName: "a", configPath: dir }), /defaults cycle: .*a\.yaml -> .*b\.yaml -> .*a\.yaml/);
  assert.throws(() => composeConfig({ configName: "bad", configPath: dir }), /bad\.yaml: defaults entry .* single 'group: option' pair/);
  assert.throws(() => composeConfig({ configName: "list", configPath: dir }), /list\.yaml must hold a mapping/);
  assert.throws(() => composeConfig({ configName: "broken", configPath: dir }), /cannot parse config file .*broken\.yaml/);
  assert.throws(() => composeConfig({ configName: "nested_override", configPath: dir }), /only allowed in the primary config/);
  assert.throws(() => composeConfig({ configName: "ppo_trainer", configPath: "/no/such/dir" }), /--config-path \/no\/such\/dir: no such folder/);
});
