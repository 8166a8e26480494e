// Two GRPO steps (full fine-tuning and LoRA) on every model family's fixture, through
// `verl train` in process: rollout on the host KV-cache decoder, old/ref log-probs and the
// actor update on the tfjs forward. The fixtures' tokenizer has no chat template, so the
// copy used here gets a plain one (the message contents back to back).
import { test } from "node:test";
import assert from "node:assert/strict";
import { cpSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { loadConfig } from "../../src/config/index.js";
import { runPpo } from "../../src/trainer/main_ppo.js";
import { makeWorkspace } from "../trainer/ppo/trainer/fixtures.js";
import { FAMILY_FIXTURES, fixtureDir } from "./families_fixtures.js";

for (const name of FAMILY_FIXTURES) {
  test(`${name}: 2 GRPO steps, full and LoRA`, async () => {
    const ws = await makeWorkspace();
    try {
      const model = join(ws.dir, name);
      cpSync(fixtureDir(name), model, { recursive: true });
      writeFileSync(join(model, "chat_template.jinja"), "{% for m in messages %}{{ m['content'] }}{% endfor %}");
      for (const lora of [false, true]) {
        const overrides = [...ws.overrides, `actor_rollout_ref.model.path=${model}`, "algorithm.adv_estimator=grpo",
          "actor_rollout_ref.actor.use_kl_loss=true", "data.max_prompt_length=24", "trainer.total_training_steps=2", "trainer.logger=[]", "trainer.save_freq=-1",
          `trainer.default_local_dir=${join(ws.dir, lora ? "lora" : "full")}`,
          ...(lora ? ["actor_rollout_ref.model.lora_rank=4", "actor_rollout_ref.model.lora_alpha=8"] : [])];
        const res = await runPpo(loadConfig({ configName: "ppo_trainer", overrides }));
        const steps = res.history.map((h) => h.metrics);
        assert.equal(steps.length, 2, `${name} ${lora ? "LoRA" : "full"}: steps logged`);
        for (const [i, m] of steps.entries()) {
          for (const k of ["actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "response_length/mean"]) {
            assert.ok(Number.isFinite(m[k]), `${name} ${lora ? "LoRA" : "full"} step ${i + 1}: ${k} = ${m[k]}`);
          }
          assert.ok(m["actor/grad_norm"]! > 0, `${name} ${lora ? "LoRA" : "full"} step ${i + 1}: a gradient flows`);
        }
        if (name === "qwen3_moe") {
          for (const m of steps) assert.ok(Number.isFinite(m["actor/router_aux_loss"]) && m["actor/router_load_max"]! >= 1, `${name}: router metrics ${m["actor/router_aux_loss"]} ${m["actor/router_load_max"]}`);
        }
        // the second step's policy moved: its KL to the reference is no longer exactly 0
        assert.ok(steps[1]!["actor/kl_loss"]! !== 0, `${name} ${lora ? "LoRA" : "full"}: the policy changed after step 1`);
      }
    } finally {
      rmSync(ws.dir, { recursive: true, force: true });
    }
  });
}
