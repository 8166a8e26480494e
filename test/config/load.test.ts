import { test } from "node:test";
import assert from "node:assert/strict";
import { parse } from "yaml";
import { ConfigError, getPath, loadConfig, toYaml } from "../../src/config/index.js";
import { configDir } from "./helpers.js";

test("overrides land before interpolation, so dependants follow them", () => {
  const cfg = loadConfig({
    configName: "ppo_trainer",
    overrides: ["data.max_prompt_length=100", "actor_rollout_ref.actor.ppo_mini_batch_size=16", "trainer.project_name=p", "actor_rollout_ref.actor.use_dynamic_bsz=true"],
  });
  assert.equal(getPath(cfg, "actor_rollout_ref.rollout.prompt_length"), 100);
  assert.equal(getPath(cfg, "critic.ppo_mini_batch_size"), 16);
  assert.equal(getPath(cfg, "trainer.default_local_dir"), "checkpoints/p/gsm8k");
  assert.equal(getPath(cfg, "actor_rollout_ref.ref.log_prob_use_dynamic_bsz"), true);
  assert.deepEqual(getPath(cfg, "actor_rollout_ref.actor.checkpoint.load_contents"), ["model", "optimizer", "extra"]);
  assert.equal(getPath(cfg, "data.gen_batch_size"), 1024);
});

test("the issue's example: grpo with small batches", () => {
  const cfg = loadConfig({ configName: "ppo_trainer", overrides: ["algorithm.adv_estimator=grpo", "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=4"] });
  assert.equal(getPath(cfg, "algorithm.adv_estimator"), "grpo");
  assert.equal(getPath(cfg, "data.train_batch_size"), 8);
  assert.equal(getPath(cfg, "actor_rollout_ref.actor.ppo_mini_batch_size"), 4);
  assert.equal(JSON.stringify(cfg).includes("${"), false, "nothing left unresolved");
});

test("group choices and value overrides mix on one command line", () => {
  const cfg = loadConfig({ configName: "ppo_trainer", overrides: ["actor_rollout_ref/actor=dp_actor", "data=legacy_data", "data.train_batch_size=4"] });
  assert.equal(getPath(cfg, "data.train_batch_size"), 4);
  assert.throws(() => loadConfig({ configName: "ppo_trainer", overrides: ["nope/group=x"] }), (e: unknown) => e instanceof ConfigError && /config group 'nope\/group'/.test(e.message));
  assert.throws(() => loadConfig({ configName: "ppo_trainer", overrides: ["no_such_top=1"] }), /could not override 'no_such_top'/);
});

test("an interpolated override is type-checked once resolved", () => {
  const ok = loadConfig({ configName: "ppo_trainer", overrides: ["critic.ppo_epochs=${data.train_batch_size}"] });
  assert.equal(getPath(ok, "critic.ppo_epochs"), 1024);
  assert.throws(
    () => loadConfig({ configName: "ppo_trainer", overrides: ["critic.ppo_epochs=${trainer.project_name}"] }),
    (e: unknown) => e instanceof ConfigError && /could not override 'critic\.ppo_epochs'.*expected a number.*got a string "verl_examples"/.test(e.message),
  );
  // a default that is itself an interpolation is checked against what it resolves to
  assert.throws(() => loadConfig({ configName: "ppo_trainer", overrides: ["actor_rollout_ref.rollout.prompt_length=long"] }), /expected a number like the default 512/);
});

test("added keys can be used by interpolation; deleted keys break their dependants clearly", () => {
  const cfg = loadConfig({ configName: "ppo_trainer", overrides: ["+trainer.tag=run1", "trainer.experiment_name=${trainer.tag}"] });
  assert.equal(getPath(cfg, "trainer.default_local_dir"), "checkpoints/verl_examples/run1");
  assert.throws(
    () => loadConfig({ configName: "ppo_trainer", overrides: ["~trainer.project_name"] }),
    /trainer\.default_local_dir: interpolation \$\{trainer\.project_name\} points at 'trainer\.project_name', which does not exist/,
  );
});

test("toYaml sorts keys, writes no anchors, and round-trips", () => {
  const cfg = loadConfig({ configName: "ppo_trainer" });
  const text = toYaml(cfg);
  assert.deepEqual(parse(text), cfg);
  assert.equal(/[&*]\w/.test(text.replace(/#.*$/gm, "")), false, "no anchors or aliases");
  const top = text.split("\n").filter((l) => /^\w/.test(l)).map((l) => l.split(":")[0]);
  assert.deepEqual(top, [...top].sort());
  const shared = { a: [1], b: {} as Record<string, unknown> };
  shared.b = { x: shared.a, y: shared.a };
  assert.equal(toYaml(shared as never).includes("*"), false);
});

test("a recipe file on --config-path with its own keys and overrides", () => {
  const dir = configDir({ "recipe.yaml": "defaults: [ppo_trainer, _self_]\ntrainer:\n  project_name: recipe\n  extra_key: 1\n" });
  const cfg = loadConfig({ configName: "recipe", configPath: dir, overrides: ["trainer.extra_key=2"] });
  assert.equal(getPath(cfg, "trainer.extra_key"), 2);
  assert.equal(getPath(cfg, "trainer.default_local_dir"), "checkpoints/recipe/gsm8k");
});
