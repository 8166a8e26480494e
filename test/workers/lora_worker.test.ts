// LoRA through the actor worker: the adapter trains, the reference policy is the
// base model with the adapter off, and a checkpoint resumes adapter + optimizer.
import { test } from "node:test";
import assert from "node:assert/strict";
import { existsSync, mkdtempSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { loadConfig, type Config } from "../../src/config/index.js";
import { readSafetensors } from "../../src/models/safetensors.js";
import { DataProto } from "../../src/protocol/index.js";
import { ClassWithInitArgs, ResourcePool, WorkerGroup } from "../../src/single_controller/index.js";
import { maxAbsDiff, syntheticBatch } from "./helpers.js";

const WORKERS = new URL("../../src/workers/index.js", import.meta.url);

function config(extra: string[]): Config {
  return loadConfig({
    configName: "ppo_trainer",
    overrides: [
      "trainer.device=cpu", "trainer.n_gpus_per_node=1", "trainer.seed=5",
      "actor_rollout_ref.model.path=scratch", "actor_rollout_ref.model.tokenizer_path=char:abcdefghijklmnop",
      "+actor_rollout_ref.model.override_config.hidden_size=16", "+actor_rollout_ref.model.override_config.num_hidden_layers=2",
      "+actor_rollout_ref.model.override_config.num_attention_heads=2",
      "data.train_batch_size=4", "data.max_prompt_length=4", "data.max_response_length=5",
      "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
      "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4", "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
      "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
      "actor_rollout_ref.actor.optim.lr=0.05", "actor_rollout_ref.actor.optim.total_training_steps=4",
      "actor_rollout_ref.actor.use_kl_loss=true", "algorithm.adv_estimator=grpo",
      "actor_rollout_ref.model.lora_rank=4", "actor_rollout_ref.model.lora_alpha=8", ...extra,
    ],
  });
}

function rolloutBatch(): DataProto {
  const d = syntheticBatch(8, 4, 5, 17, 3);
  const adv = new Float32Array(8 * 5);
  for (let i = 0; i < adv.length; i++) adv[i] = d.batch.response_mask!.data[i]! * ((i % 3) - 1);
  d.batch.advantages = { data: adv, shape: [8, 5], dtype: "float32" };
  d.metaInfo.temperature = 1.0;
  return d;
}

async function withActor<T>(extra: string[], fn: (wg: WorkerGroup) => Promise<T>): Promise<T> {
  const pool = new ResourcePool({ worldSize: 1, name: `lora_${Math.random()}` });
  try {
    const wg = await WorkerGroup.create(pool, new ClassWithInitArgs(WORKERS, "ActorRolloutRefWorker", config(extra), "actor_rollout_ref"));
    await wg.call("initModel");
    return await fn(wg);
  } finally {
    await pool.destroy();
  }
}

const lp = async (wg: WorkerGroup, d: DataProto) => ((await wg.call("computeLogProb", d)) as DataProto).batch.old_log_probs!.data as Float32Array;
const refLp = async (wg: WorkerGroup, d: DataProto) => ((await wg.call("computeRefLogProb", d)) as DataProto).batch.ref_log_prob!.data as Float32Array;

async function update(wg: WorkerGroup, d: DataProto): Promise<void> {
  const old = await lp(wg, d), ref = await refLp(wg, d);
  const b = new DataProto({ ...d.batch, old_log_probs: { data: old, shape: [8, 5], dtype: "float32" }, ref_log_prob: { data: ref, shape: [8, 5], dtype: "float32" } }, d.nonTensorBatch, d.metaInfo);
  await wg.call("updateActor", b);
}

test("LoRA actor worker: adapter-only parameters, ref = base (adapter off), checkpoint = peft folder + merged export, resume continues identically", async () => {
  const data = rolloutBatch();
  const dir = mkdtempSync(join(tmpdir(), "lora-ckpt-"));
  const first = await withActor([], async (wg) => {
    const init = (await wg.call("initModel")) as { numParams: number }[];
    // 2 layers x 7 modules; dim 16, ffn 64, kv 16: sum over modules of r * (in + out)
    const perLayer = 4 * ((16 + 16) * 4 + (16 + 64) * 2 + (64 + 16));
    assert.equal(init[0]!.numParams, 2 * perLayer, "only the adapters are trainable");
    const ref0 = await refLp(wg, data), pol0 = await lp(wg, data);
    assert.ok(maxAbsDiff(ref0, pol0) < 1e-6, "a fresh adapter (B = 0) is the base model");
    await update(wg, data);
    const pol1 = await lp(wg, data), ref1 = await refLp(wg, data);
    assert.ok(maxAbsDiff(pol1, pol0) > 1e-4, "the adapter trained");
    assert.deepEqual(Array.from(ref1), Array.from(ref0), "the reference (adapter off) did not move");
    await wg.call("saveCheckpoint", dir);
    await update(wg, data);
    return { afterSave: pol1, next: await lp(wg, data) };
  });
  const cfg = JSON.parse(readFileSync(join(dir, "lora_adapter", "adapter_config.json"), "utf8"));
  assert.equal(cfg.r, 4);
  assert.ok(existsSync(join(dir, "lora_adapter", "adapter_model.safetensors")));
  assert.ok(existsSync(join(dir, "huggingface", "model.safetensors")), "a merged HF export");
  const names = [...readSafetensors(join(dir, "model.safetensors")).tensors.keys()];
  assert.ok(names.length === 28 && names.every((n) => n.includes(".lora_")), "the checkpoint holds the adapter only");

  await withActor([], async (wg) => {
    await wg.call("loadCheckpoint", dir);
    assert.ok(maxAbsDiff(await lp(wg, data), first.afterSave) < 1e-6, "resumed adapter");
    await update(wg, data);
    assert.ok(maxAbsDiff(await lp(wg, data), first.next) < 1e-5, "the next update matches (optimizer state restored)");
  });
  // the saved adapter, as lora_adapter_path, starts a new run from the trained policy
  await withActor([`actor_rollout_ref.model.lora_adapter_path=${join(dir, "lora_adapter")}`], async (wg) => {
    assert.ok(maxAbsDiff(await lp(wg, data), first.afterSave) < 1e-6, "lora_adapter_path loads the trained adapter");
  });
});
