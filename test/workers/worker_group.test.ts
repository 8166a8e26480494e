// The worker roles in real rank threads: 1 rank and 2 ranks produce the same
// samples (per-sample seeds), the same log-probs and the same update.
import { test } from "node:test";
import assert from "node:assert/strict";
import { loadConfig, type Config } from "../../src/config/index.js";
import { DataProto } from "../../src/protocol/index.js";
import { ClassWithInitArgs, ResourcePool, WorkerGroup } from "../../src/single_controller/index.js";
import { maxAbsDiff, syntheticBatch } from "./helpers.js";

const WORKERS = new URL("../../src/workers/index.js", import.meta.url);

function config(world: number, extra: string[] = []): Config {
  return loadConfig({
    configName: "ppo_trainer",
    overrides: [...extra,
      "trainer.device=cpu", `trainer.n_gpus_per_node=${world}`, "trainer.seed=5",
      "actor_rollout_ref.model.path=scratch", "actor_rollout_ref.model.tokenizer_path=char:abcdefghijklmnop",
      "+actor_rollout_ref.model.override_config.hidden_size=16", "+actor_rollout_ref.model.override_config.num_hidden_layers=1",
      "+actor_rollout_ref.model.override_config.num_attention_heads=2",
      "data.train_batch_size=4", "data.max_prompt_length=4", "data.max_response_length=5",
      "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
      "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
      "actor_rollout_ref.actor.optim.lr=0.01", "actor_rollout_ref.actor.optim.total_training_steps=4",
      "algorithm.adv_estimator=grpo",
    ],
  });
}

async function runOnce(world: number): Promise<{ responses: Int32Array; oldLogProbs: Float32Array; metrics: Record<string, unknown>; after: Float32Array }> {
  const pool = new ResourcePool({ worldSize: world, name: `test_${world}` });
  try {
    const wg = await WorkerGroup.create(pool, new ClassWithInitArgs(WORKERS, "ActorRolloutRefWorker", config(world), "actor_rollout"));
    await wg.call("initModel");
    const prompts = syntheticBatch(8, 4, 5, 19, 3).select(["input_ids", "attention_mask", "position_ids"]);
    // Keep only the prompt part: the first 4 columns.
    const P = 4, T = 9;
    const cut = (k: string) => {
      const t = prompts.batch[k]!;
      const out = new Int32Array(8 * P);
      for (let b = 0; b < 8; b++) for (let j = 0; j < P; j++) out[b * P + j] = t.data[b * T + j]!;
      return { data: out, shape: [8, P], dtype: "int32" as const };
    };
    const gen = new DataProto({ input_ids: cut("input_ids"), attention_mask: cut("attention_mask"), position_ids: cut("position_ids") },
      { rollout_seed: Array.from({ length: 8 }, (_, i) => 1000 + i) }, {});
    const out = (await wg.call("generateSequences", gen)) as DataProto;
    out.metaInfo.temperature = 1.0;
    const lp = (await wg.call("computeLogProb", out)) as DataProto;
    const batch = out.union(lp.select(["old_log_probs"]));
    const adv = new Float32Array(8 * 5);
    for (let i = 0; i < adv.length; i++) adv[i] = batch.batch.response_mask!.data[i]! * ((i % 3) - 1);
    batch.batch.advantages = { data: adv, shape: [8, 5], dtype: "float32" };
    const upd = (await wg.call("updateActor", batch)) as DataProto;
    const after = (await wg.call("computeLogProb", out)) as DataProto;
    return {
      responses: out.batch.responses!.data as Int32Array,
      oldLogProbs: lp.batch.old_log_probs!.data as Float32Array,
      metrics: upd.metaInfo.metrics as Record<string, unknown>,
      after: after.batch.old_log_probs!.data as Float32Array,
    };
  } finally {
    await pool.destroy();
  }
}

test("one rank and two ranks sample, score and update identically (per-sample seeds, gradient all-reduce)", async () => {
  const one = await runOnce(1);
  const two = await runOnce(2);
  assert.deepEqual([...two.responses], [...one.responses]);
  assert.ok(maxAbsDiff(one.oldLogProbs, two.oldLogProbs) < 1e-5);
  const flat = (v: unknown): number[] => (Array.isArray(v) ? v.flat(3) as number[] : [v as number]);
  const pg1 = flat(one.metrics["actor/pg_loss"]), pg2 = flat(two.metrics["actor/pg_loss"]);
  assert.ok(Math.abs(pg1[0]! - pg2[0]!) < 1e-6, `pg_loss ${pg1} vs ${pg2}`);
  assert.ok(Math.abs(flat(one.metrics["actor/grad_norm"])[0]! - flat(two.metrics["actor/grad_norm"])[0]!) < 1e-5);
  assert.equal(flat(one.metrics["actor/lr"])[0], 0.01);
  const moved = maxAbsDiff(one.after, one.oldLogProbs);
  assert.ok(moved > 1e-4, "the update changed the policy");
  assert.ok(maxAbsDiff(one.after, two.after) < 1e-5, `after the update: ${maxAbsDiff(one.after, two.after)}`);
});

test("a single-turn rollout longer than the model's context is refused at start-up, as the agent loop refuses it", async () => {
  const pool = new ResourcePool({ worldSize: 1, name: "test_context" });
  try {
    const tooLong = config(1, ["+actor_rollout_ref.model.override_config.max_position_embeddings=8"]);
    const wg = await WorkerGroup.create(pool, new ClassWithInitArgs(WORKERS, "ActorRolloutRefWorker", tooLong, "actor_rollout"));
    await assert.rejects(wg.call("initModel"),
      /actor_rollout_ref\.rollout: prompt_length 4 \+ response_length 5 = 9 exceeds the model's max_position_embeddings 8; lower data\.max_prompt_length \/ data\.max_response_length/);
  } finally {
    await pool.destroy();
  }
});
