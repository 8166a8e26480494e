// ZeRO-1 through real training: 2 ranks with the optimizer state sharded (the default,
// fsdp_size=-1) and replicated (fsdp_size=1) give the same metrics, not within a tolerance:
// GRPO on the stories260K policy, and PPO whose critic is sharded too. A sharded checkpoint
// resumes into a replicated optimizer and continues with the uninterrupted run's numbers.
import { test } from "node:test";
import assert from "node:assert/strict";
import { existsSync, readFileSync, rmSync } from "node:fs";
import { join } from "node:path";
import { makeWorkspace, scratchModel, stories, trainCurves } from "./fixtures.js";

const VOLATILE = /^(timing_s\/|timing_per_token_ms\/|perf\/throughput$|perf\/time_per_step$|perf\/mfu\/|perf\/max_memory_|perf\/cpu_memory_used_gb$)/;
const REPLICATED = ["actor_rollout_ref.actor.fsdp_config.fsdp_size=1", "critic.model.fsdp_config.fsdp_size=1"];

const curves = (overrides: string[]) => trainCurves(overrides, 2);

function assertSameMetrics(got: Record<string, number>, want: Record<string, number>, what: string): void {
  const keys = Object.keys(want).filter((k) => !VOLATILE.test(k));
  assert.deepEqual(Object.keys(got).filter((k) => !VOLATILE.test(k)).sort(), keys.sort(), `${what}: the same metrics`);
  for (const k of keys) assert.ok(Object.is(got[k], want[k]), `${what}: ${k} sharded ${got[k]}, replicated ${want[k]}`);
}

test("GRPO on stories260K, 2 ranks: the sharded optimizer gives the replicated one's metrics; its checkpoint resumes replicated", { timeout: 300_000 }, async (t) => {
  const model = stories();
  if (!model) return t.skip("../shared/models/stories260K absent");
  const ws = await makeWorkspace();
  try {
    const common = [...ws.overrides, `actor_rollout_ref.model.path=${model}`, "algorithm.adv_estimator=grpo",
      "actor_rollout_ref.actor.use_kl_loss=true", "trainer.total_training_steps=3", "trainer.test_freq=-1"];
    const replicated = await curves([...common, ...REPLICATED, `trainer.default_local_dir=${ws.dir}/r`]);
    const sharded = await curves([...common, `trainer.default_local_dir=${ws.dir}/s`, "trainer.save_freq=2"]);
    assert.equal(sharded.length, 3);
    sharded.forEach((m, i) => assertSameMetrics(m, replicated[i]!, `step ${i + 1}`));
    assert.ok(replicated[2]!["actor/kl_loss"]! > replicated[1]!["actor/kl_loss"]! && replicated[1]!["actor/kl_loss"]! > 0, "the policy moves away from the reference");
    assert.ok(replicated.every((m) => m["actor/grad_norm"]! > 1), "the norm is above grad_clip (1.0), so the clip acts on every step");

    const actorDir = join(ws.dir, "s", "global_step_2", "actor");
    assert.ok(existsSync(join(actorDir, "optim_world_size_2_rank_0.safetensors")) && existsSync(join(actorDir, "optim_world_size_2_rank_1.safetensors")), "each rank saved its shard");
    assert.ok(!existsSync(join(actorDir, "optim.safetensors")));
    assert.equal(JSON.parse(readFileSync(join(actorDir, "checkpoint_meta.json"), "utf8")).optimizer_shards, 2);

    const resumed = await curves([...common, ...REPLICATED, `trainer.default_local_dir=${ws.dir}/s2`,
      "trainer.resume_mode=resume_path", `trainer.resume_from_path=${join(ws.dir, "s", "global_step_2")}`]);
    assert.equal(resumed.length, 1, "only step 3 runs after the checkpoint of step 2");
    assertSameMetrics(resumed[0]!, replicated[2]!, "step 3 after resuming the sharded checkpoint replicated");
  } finally {
    rmSync(ws.dir, { recursive: true, force: true });
  }
});

test("PPO with a critic, 2 ranks: actor and critic sharded give the replicated metrics", { timeout: 300_000 }, async () => {
  const ws = await makeWorkspace();
  try {
    const common = [...ws.overrides, ...scratchModel(32, 2), "critic.model.path=scratch", "algorithm.adv_estimator=gae",
      "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", "critic.ppo_micro_batch_size_per_gpu=2", "trainer.total_training_steps=2"];
    const replicated = await curves([...common, ...REPLICATED, `trainer.default_local_dir=${ws.dir}/r`]);
    const sharded = await curves([...common, `trainer.default_local_dir=${ws.dir}/s`]);
    sharded.forEach((m, i) => assertSameMetrics(m, replicated[i]!, `step ${i + 1}`));
    assert.notEqual(replicated[0]!["critic/vf_loss"], replicated[1]!["critic/vf_loss"], "the critic trains");
  } finally {
    rmSync(ws.dir, { recursive: true, force: true });
  }
});
