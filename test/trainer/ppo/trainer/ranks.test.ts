// `verl train` end to end, in process: GRPO on the real stories260K policy and PPO
// (GAE + critic) on a from-scratch model, each with 1 and with 2 ranks. With
// per-sample seeds the samples do not depend on the split, so the two runs must
// give the same curves within float tolerance (gradients are averaged right).
import { test } from "node:test";
import assert from "node:assert/strict";
import { rmSync } from "node:fs";
import { assertMemory, assertMfu, makeWorkspace, scratchModel, stories, trainCurves as curves } from "./fixtures.js";

const VOLATILE = /^(timing_s\/|timing_per_token_ms\/|perf\/throughput$|perf\/time_per_step$|perf\/mfu\/|perf\/max_memory_|perf\/cpu_memory_used_gb$|global_seqlen\/)/;

function assertSameCurves(a: Record<string, number>[], b: Record<string, number>[], what: string): void {
  assert.equal(a.length, b.length, `${what}: number of logged steps`);
  a.forEach((m, i) => {
    for (const [k, v] of Object.entries(m)) {
      if (VOLATILE.test(k)) continue;
      const w = b[i]![k];
      assert.ok(w !== undefined, `${what}: step ${i + 1} lacks ${k} with 2 ranks`);
      assert.ok(Math.abs(v - w!) <= 1e-6 + 1e-4 * Math.abs(v), `${what}: step ${i + 1} ${k}: 1 rank ${v}, 2 ranks ${w}`);
    }
  });
}

test("GRPO on stories260K: 1 rank and 2 ranks give the same curves", async (t) => {
  const model = stories();
  if (!model) return t.skip("../shared/models/stories260K absent");
  const ws = await makeWorkspace();
  try {
    const common = [...ws.overrides, `actor_rollout_ref.model.path=${model}`, "algorithm.adv_estimator=grpo",
      "actor_rollout_ref.actor.use_kl_loss=true", "trainer.total_training_steps=2", "trainer.test_freq=2"];
    const one = await curves([...common, `trainer.default_local_dir=${ws.dir}/c1`], 1);
    const two = await curves([...common, `trainer.default_local_dir=${ws.dir}/c2`], 2);
    assertSameCurves(one, two, "grpo");
    for (const k of ["actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "actor/entropy", "critic/score/mean", "critic/advantages/max",
      "response_length/mean", "timing_s/gen", "timing_s/update_actor", "timing_s/step", "perf/throughput", "training/global_step"]) {
      assert.ok(Number.isFinite(one[1]![k]), `metric ${k}`);
    }
    assert.ok("val-core/stories/reward/mean@1" in one[1]!, "validation at the last step");
    assert.ok("global_seqlen/mean" in two[0]!, "2 ranks balance the batch");
    // verl's perf/ metrics with either world size (the MFU divides by it)
    for (const [m, what] of [[one[1]!, "1 rank"], [two[1]!, "2 ranks"]] as const) {
      assertMfu(m, "perf/mfu/actor", what);
      assertMfu(m, "perf/mfu/actor_infer", what);
      assertMemory(m, what);
    }
    assert.ok(!("critic/vf_loss" in one[0]!), "GRPO trains no critic");
  } finally {
    rmSync(ws.dir, { recursive: true, force: true });
  }
});

test("PPO with GAE and a critic on a from-scratch model: 1 rank and 2 ranks give the same curves", async () => {
  const ws = await makeWorkspace();
  try {
    const common = [...ws.overrides, ...scratchModel(32, 2), "critic.model.path=scratch", "algorithm.adv_estimator=gae",
      "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", "critic.ppo_micro_batch_size_per_gpu=2", "trainer.total_training_steps=2"];
    const one = await curves([...common, `trainer.default_local_dir=${ws.dir}/c1`], 1);
    const two = await curves([...common, `trainer.default_local_dir=${ws.dir}/c2`], 2);
    assertSameCurves(one, two, "ppo");
    for (const k of ["critic/vf_loss", "critic/grad_norm", "critic/vpred_mean", "critic/vf_explained_var", "critic/values/mean", "critic/lr", "timing_s/update_critic", "timing_s/values"]) {
      assert.ok(Number.isFinite(one[1]![k]), `metric ${k}`);
    }
    assert.notEqual(one[0]!["critic/vf_loss"], one[1]!["critic/vf_loss"], "the critic trains");
  } finally {
    rmSync(ws.dir, { recursive: true, force: true });
  }
});
