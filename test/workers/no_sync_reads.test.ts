// The worker paths read tensors only asynchronously, as the WebGPU backend under
// Node requires (its synchronous read needs an OffscreenCanvas). CPU machines
// cannot run WebGPU, so VERL_FORBID_SYNC_READS=1 makes every synchronous read of
// the wasm backend throw, in this thread and in the rank threads (which inherit
// the environment), and the roles then do a whole PPO step through WorkerGroup.
import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import * as tf from "@tensorflow/tfjs";
import { loadConfig, type Config } from "../../src/config/index.js";
import { initBackend } from "../../src/engine/backend.js";
import { DataProto } from "../../src/protocol/index.js";
import { ClassWithInitArgs, ResourcePool, WorkerGroup } from "../../src/single_controller/index.js";

const WORKERS = new URL("../../src/workers/index.js", import.meta.url);
const B = 4, P = 4, R = 5;

function config(): Config {
  return loadConfig({
    configName: "ppo_trainer",
    overrides: [
      "trainer.device=wasm", "trainer.n_gpus_per_node=1", "trainer.seed=3",
      "actor_rollout_ref.model.path=scratch", "actor_rollout_ref.model.tokenizer_path=char:abcdefghijklmnop",
      "+actor_rollout_ref.model.override_config.hidden_size=16", "+actor_rollout_ref.model.override_config.num_hidden_layers=1",
      "+actor_rollout_ref.model.override_config.num_attention_heads=2",
      "critic.model.path=scratch", "algorithm.adv_estimator=gae",
      "data.train_batch_size=4", `data.max_prompt_length=${P}`, `data.max_response_length=${R}`,
      "actor_rollout_ref.rollout.n=1", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
      "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
      "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2",
      "critic.ppo_micro_batch_size_per_gpu=2", "critic.ppo_mini_batch_size=4",
      "actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.actor.entropy_coeff=0.01",
      "actor_rollout_ref.actor.optim.total_training_steps=2", "critic.optim.total_training_steps=2",
    ],
  });
}

function prompts(): DataProto {
  const ids = new Int32Array(B * P), mask = new Int32Array(B * P), pos = new Int32Array(B * P);
  for (let b = 0; b < B; b++) {
    const len = 1 + (b % P);
    for (let j = P - len, k = 0; j < P; j++, k++) { ids[b * P + j] = 2 + ((b * 5 + k) % 14); mask[b * P + j] = 1; pos[b * P + j] = k; }
  }
  const t = (d: Int32Array) => ({ data: d, shape: [B, P], dtype: "int32" as const });
  return new DataProto({ input_ids: t(ids), attention_mask: t(mask), position_ids: t(pos) }, {}, {});
}

test("VERL_FORBID_SYNC_READS=1 makes synchronous reads throw and leaves asynchronous ones working", async () => {
  process.env.VERL_FORBID_SYNC_READS = "1";
  await initBackend("wasm");
  const x = tf.tensor1d([1, 2, 3]);
  assert.throws(() => x.dataSync(), /synchronous tensor read .* VERL_FORBID_SYNC_READS=1/);
  assert.throws(() => x.arraySync(), /synchronous tensor read/);
  assert.deepEqual([...(await x.data())], [1, 2, 3]);
  assert.deepEqual(await x.array(), [1, 2, 3]);
  x.dispose();
});

test("actor, rollout, reference and critic workers do a PPO step and a checkpoint with no synchronous read", async () => {
  process.env.VERL_FORBID_SYNC_READS = "1";
  const dir = mkdtempSync(join(tmpdir(), "verl-nosync-"));
  const pool = new ResourcePool({ worldSize: 1, name: "no_sync_reads" });
  try {
    const cfg = config();
    const actor = await WorkerGroup.create(pool, new ClassWithInitArgs(WORKERS, "ActorRolloutRefWorker", cfg, "actor_rollout_ref"));
    const critic = await WorkerGroup.create(pool, new ClassWithInitArgs(WORKERS, "CriticWorker", cfg));
    await actor.call("initModel");
    await critic.call("initModel");
    const out = (await actor.call("generateSequences", prompts())) as DataProto;
    out.metaInfo.temperature = 1.0;
    const old = (await actor.call("computeLogProb", out)) as DataProto;
    const ref = (await actor.call("computeRefLogProb", out)) as DataProto;
    const values = (await critic.call("computeValues", out)) as DataProto;
    const batch = out.union(old.select(["old_log_probs"])).union(ref).union(values);
    const adv = new Float32Array(B * R);
    for (let i = 0; i < adv.length; i++) adv[i] = batch.batch.response_mask!.data[i]! * ((i % 3) - 1);
    batch.batch.advantages = { data: adv, shape: [B, R], dtype: "float32" };
    batch.batch.returns = { data: adv.slice(), shape: [B, R], dtype: "float32" };
    const upd = (await actor.call("updateActor", batch)) as DataProto;
    const cupd = (await critic.call("updateCritic", batch)) as DataProto;
    const finite = (m: unknown, k: string) => {
      const v = (m as Record<string, unknown>)[k];
      assert.ok((Array.isArray(v) ? v.flat(3) : [v]).every((x) => Number.isFinite(x)), `${k}: ${JSON.stringify(v)}`);
    };
    for (const k of ["actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/grad_norm", "actor/pg_clipfrac"]) finite(upd.metaInfo.metrics, k);
    for (const k of ["critic/vf_loss", "critic/grad_norm"]) finite(cupd.metaInfo.metrics, k);
    // the next rollout reads the updated weights (the decoder's copy is rebuilt)
    await actor.call("generateSequences", prompts());
    await actor.call("saveCheckpoint", join(dir, "actor"));
    await critic.call("saveCheckpoint", join(dir, "critic"));
  } finally {
    await pool.destroy();
    rmSync(dir, { recursive: true, force: true });
    delete process.env.VERL_FORBID_SYNC_READS;
  }
});
