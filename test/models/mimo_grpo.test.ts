// Two GRPO steps on the tiny MiMo folder through `verl train` in process, with the MTP layer
// loaded, trained and drafting (model.mtp.enable, enable_train, enable_rollout): verl's MTP loss
// metric and the draft acceptance rate are logged, and the checkpoint's Hugging Face export
// carries the trained MTP layer and num_nextn_predict_layers.
import { test } from "node:test";
import assert from "node:assert/strict";
import { existsSync, readFileSync, rmSync } from "node:fs";
import { join } from "node:path";
import { loadConfig } from "../../src/config/index.js";
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
