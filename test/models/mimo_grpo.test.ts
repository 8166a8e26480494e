// Two GRPO steps on the tiny MiMo folder through `verl train` in process, with the MTP layer
// loaded, trained and drafting (model.mtp.enable, enable_train, enable_rollout): verl's MTP loss
// metric and the draft acceptance rate are logged, and the checkpoint's Hugging Face export
// carries the trained MTP layer and num_nextn_predict_layers.
import { test } from "node:test";
import assert from "node:assert/strict";
import { existsSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { loadConfig } from "../../src/config/index.js";
import { writeParquet } from "../../src/data/index.js";
import { readHfWeights } from "../../src/models/hf.js";
import { runPpo } from "../../src/trainer/main_ppo.js";
import { makeWorkspace } from "../trainer/ppo/trainer/fixtures.js";
import { maxDiff } from "./families_fixtures.js";
import { writeTinyMimo } from "./mimo_fixture.js";

const MTP = "actor_rollout_ref.model.mtp";

test("mimo: 2 GRPO steps with the MTP loss and MTP-drafted rollouts; the export keeps the trained MTP layer", async () => {
  const ws = await makeWorkspace();
  try {
    const model = writeTinyMimo(join(ws.dir, "mimo"), { chatTemplate: true });
    const out = join(ws.dir, "ckpt");
    const overrides = [...ws.overrides, `actor_rollout_ref.model.path=${model}`, "algorithm.adv_estimator=grpo",
      "actor_rollout_ref.actor.use_kl_loss=true", "data.max_prompt_length=24", "trainer.total_training_steps=2", "trainer.logger=[]",
      "trainer.save_freq=2", `trainer.default_local_dir=${out}`, `${MTP}.enable=true`, `${MTP}.enable_train=true`, `${MTP}.mtp_loss_scaling_factor=0.5`, `${MTP}.enable_rollout=true`];
    const res = await runPpo(loadConfig({ configName: "ppo_trainer", overrides }));
    const steps = res.history.map((h) => h.metrics);
    assert.equal(steps.length, 2);
    for (const [i, m] of steps.entries()) {
      for (const k of ["actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "actor/mtp_losses/mtp_1_loss", "rollout/mtp_acceptance_rate"]) {
        assert.ok(Number.isFinite(m[k]), `step ${i + 1}: ${k} = ${m[k]}`);
      }
      assert.ok(m["rollout/mtp_acceptance_rate"]! >= 0 && m["rollout/mtp_acceptance_rate"]! <= 1);
      // cross entropy over 320 ids from random weights: positive, and not far from ln(320) = 5.8
      assert.ok(m["actor/mtp_losses/mtp_1_loss"]! > 1 && m["actor/mtp_losses/mtp_1_loss"]! < 20, `step ${i + 1}: mtp loss ${m["actor/mtp_losses/mtp_1_loss"]}`);
    }
    const hf = join(out, "global_step_2", "actor", "huggingface");
    assert.ok(existsSync(join(hf, "config.json")), `${hf} exported`);
    const cfg = JSON.parse(readFileSync(join(hf, "config.json"), "utf8")) as Record<string, unknown>;
    assert.equal(cfg["model_type"], "mimo");
    assert.equal(cfg["num_nextn_predict_layers"], 1);
    const before = readHfWeights(model), after = readHfWeights(hf);
    const name = "model.mtp_layers.0.input_proj.weight";
    assert.ok(after.has(name), "the MTP layer is exported");
    assert.ok(maxDiff(after.get(name)!.data, before.get(name)!.data) > 0, "the MTP layer trained");
  } finally {
    rmSync(ws.dir, { recursive: true, force: true });
  }
});

test("mimo: 2 multi-turn GRPO steps (agent loops with a simulated user) decode with 2 chained MTP drafts a step and log the acceptance rate", async () => {
  const ws = await makeWorkspace();
  try {
    const model = writeTinyMimo(join(ws.dir, "mimo"), { chatTemplate: true });
    // a quarter of the ids end a turn, so random weights give short turns and the user gets to answer
    writeFileSync(join(model, "generation_config.json"), JSON.stringify({ eos_token_id: Array.from({ length: 80 }, (_, i) => i) }));
    // GSM8K-style rows with a simulated user that asks again until the answer is right (never, from random weights)
    const rows = ["2+3?", "4+4?", "7-1?", "9-2?"].map((q, i) => ({
      data_source: "openai/gsm8k", prompt: [{ role: "user", content: q }], ability: "math", agent_name: "tool_agent",
      reward_model: { style: "rule", ground_truth: "5" }, extra_info: { split: "train", index: i, interaction_kwargs: { name: "gsm8k", query: q, ground_truth: "5" } },
    }));
    await writeParquet(join(ws.dir, "train.parquet"), rows);
    await writeParquet(join(ws.dir, "val.parquet"), rows.slice(0, 2));
    const yaml = join(ws.dir, "interaction.yaml");
    writeFileSync(yaml, `interaction:\n  - name: "gsm8k"\n    class_name: "verl.interactions.gsm8k_interaction.Gsm8kInteraction"\n    config: {}\n`);
    const RO = "actor_rollout_ref.rollout";
    const overrides = [...ws.overrides, `actor_rollout_ref.model.path=${model}`, "algorithm.adv_estimator=grpo", "data.max_prompt_length=24",
      "data.max_response_length=160", "trainer.total_training_steps=2", "trainer.logger=[]", "trainer.save_freq=-1",
      `${RO}.multi_turn.enable=true`, `${RO}.multi_turn.interaction_config_path=${yaml}`, `${RO}.multi_turn.max_user_turns=2`, `${RO}.multi_turn.max_assistant_turns=3`,
      `${RO}.calculate_log_probs=true`, `${MTP}.enable=true`, `${MTP}.enable_rollout=true`, `${MTP}.num_speculative_tokens=2`];
    const res = await runPpo(loadConfig({ configName: "ppo_trainer", overrides }));
    const steps = res.history.map((h) => h.metrics);
    assert.equal(steps.length, 2);
    for (const [i, m] of steps.entries()) {
      for (const k of ["actor/pg_loss", "actor/grad_norm", "rollout/mtp_acceptance_rate", "num_turns/max"]) assert.ok(Number.isFinite(m[k]), `step ${i + 1}: ${k} = ${m[k]}`);
      assert.ok(m["rollout/mtp_acceptance_rate"]! >= 0 && m["rollout/mtp_acceptance_rate"]! <= 1);
      // user, assistant, user, assistant at least: the MTP cache carried a conversation across turns
      assert.ok(m["num_turns/max"]! >= 4, `step ${i + 1}: conversations of ${m["num_turns/max"]} turns`);
    }
  } finally {
    rmSync(ws.dir, { recursive: true, force: true });
  }
});

test("mimo: mtp.enable_train without mtp.enable, mtp.enable on a model without MTP layers, and drafting on an engine that cannot, are refused by name", async () => {
  const ws = await makeWorkspace();
  try {
    const mimo = writeTinyMimo(join(ws.dir, "mimo"), { chatTemplate: true });
    const qwen = writeTinyMimo(join(ws.dir, "qwen2"), { chatTemplate: true, trunkOnly: true });
    const base = [...ws.overrides, "algorithm.adv_estimator=grpo", "data.max_prompt_length=24", "trainer.total_training_steps=1", "trainer.logger=[]", "trainer.save_freq=-1"];
    await assert.rejects(runPpo(loadConfig({ configName: "ppo_trainer", overrides: [...base, `actor_rollout_ref.model.path=${mimo}`, `${MTP}.enable_train=true`] })),
      /actor_rollout_ref\.model\.mtp\.enable_train=true needs actor_rollout_ref\.model\.mtp\.enable=true/);
    await assert.rejects(runPpo(loadConfig({ configName: "ppo_trainer", overrides: [...base, `actor_rollout_ref.model.path=${qwen}`, `${MTP}.enable=true`] })),
      /actor_rollout_ref\.model\.mtp\.enable=true: the model has no multi-token-prediction layers/);
    await assert.rejects(runPpo(loadConfig({ configName: "ppo_trainer", overrides: [...base, `actor_rollout_ref.model.path=${mimo}`, `${MTP}.enable=true`, `${MTP}.enable_rollout=true`, "actor_rollout_ref.rollout.name=webgpu"] })),
      /actor_rollout_ref\.model\.mtp\.enable_rollout=true: rollout engine 'webgpu' .* cannot draft with the MTP layer/);
  } finally {
    rmSync(ws.dir, { recursive: true, force: true });
  }
});
