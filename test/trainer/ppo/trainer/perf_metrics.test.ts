// verl's perf/ metrics of the actor and critic updates in a real run: PPO with GAE and a critic on
// a from-scratch model, both updates with use_dynamic_bsz (token-budget micro-batches), on wasm.
import { test } from "node:test";
import assert from "node:assert/strict";
import { rmSync } from "node:fs";
import { loadConfig } from "../../../../src/config/index.js";
import { runPpo } from "../../../../src/trainer/main_ppo.js";
import { assertMemory, assertMfu, makeWorkspace, scratchModel } from "./fixtures.js";

const CPU_FLOPS = 448e9; // verl's "CPU" entry

test("use_dynamic_bsz PPO with a critic logs perf/mfu/actor, perf/mfu/critic, perf/mfu/actor_infer and the memory metrics, consistent with the token counts", async () => {
  const ws = await makeWorkspace();
  try {
    const overrides = [...ws.overrides, ...scratchModel(32, 2), "critic.model.path=scratch", "algorithm.adv_estimator=gae",
      "actor_rollout_ref.actor.use_dynamic_bsz=true", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=64",
      "critic.use_dynamic_bsz=true", "critic.ppo_max_token_len_per_gpu=64",
      "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=true", "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=64",
      "actor_rollout_ref.actor.ppo_epochs=2", "trainer.total_training_steps=2",
      "trainer.n_gpus_per_node=1", "trainer.logger=[]", `trainer.default_local_dir=${ws.dir}/c`];
    const res = await runPpo(loadConfig({ configName: "ppo_trainer", overrides }));
    assert.equal(res.history.length, 2);
    for (const { step, metrics: m } of res.history) {
      const what = `step ${step}`;
      assertMfu(m, "perf/mfu/actor", what);
      assertMfu(m, "perf/mfu/critic", what);
      assertMfu(m, "perf/mfu/actor_infer", what);
      assertMemory(m, what);
      // A lower bound from the formula: the scratch model (hidden 32, 2 layers, 2 heads, intermediate 128) has
      // per layer 32 x (32 + 32 + 32 + 32) = 4096 attention and 32 x 128 x 3 = 12288 MLP weights: 32768 without
      // the embeddings, so at least 6 x 32768 FLOPs per token. The worker times only its update, which is
      // shorter than the driver's timing_s/update_actor, so the MFU is at least this (x 2 ppo_epochs).
      const tokens = m["perf/total_num_tokens"]!;
      const floor = (6 * 32768 * tokens * 2) / m["timing_s/update_actor"]! / CPU_FLOPS;
      assert.ok(m["perf/mfu/actor"]! >= floor, `${what}: perf/mfu/actor ${m["perf/mfu/actor"]} below ${floor}`);
      const criticFloor = (6 * 32768 * tokens) / m["timing_s/update_critic"]! / CPU_FLOPS;
      assert.ok(m["perf/mfu/critic"]! >= criticFloor, `${what}: perf/mfu/critic ${m["perf/mfu/critic"]} below ${criticFloor}`);
      // forward only: a third of 6 x weights per token, over at most timing_s/old_log_prob
      const inferFloor = (2 * 32768 * tokens) / m["timing_s/old_log_prob"]! / CPU_FLOPS;
      assert.ok(m["perf/mfu/actor_infer"]! >= inferFloor, `${what}: perf/mfu/actor_infer ${m["perf/mfu/actor_infer"]} below ${inferFloor}`);
    }
  } finally {
    rmSync(ws.dir, { recursive: true, force: true });
  }
});
