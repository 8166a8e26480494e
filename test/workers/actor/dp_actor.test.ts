import { test } from "node:test";
import assert from "node:assert/strict";
import * as tf from "@tensorflow/tfjs";
import { initBackend } from "../../../src/engine/backend.js";
import { loadConfig } from "../../../src/config/index.js";
import { initModel } from "../../../src/models/init.js";
import type { LlamaModel } from "../../../src/models/llama.js";
import { Collective } from "../../../src/single_controller/collective.js";
import { Rng } from "../../../src/utils/rng.js";
import { DataParallelPPOActor } from "../../../src/workers/actor/dp_actor.js";
import { ConfigView } from "../../../src/workers/config_view.js";
import { DataParallelOptimizer } from "../../../src/workers/dp_optimizer.js";
import { countingReads, maxAbsDiff, syntheticBatch, tinyConfig } from "../helpers.js";

function actorConfig(extra: string[] = []) {
  return loadConfig({
    configName: "ppo_trainer",
    overrides: [
      "actor_rollout_ref.actor.optim.lr=0.01", "actor_rollout_ref.actor.optim.weight_decay=0.0",
      "actor_rollout_ref.actor.grad_clip=100.0", ...extra,
    ],
  });
}

function build(cfgOverrides: string[], miniPerRank: number, microPerRank: number | null): { actor: DataParallelPPOActor; model: LlamaModel } {
  const cfg = actorConfig(cfgOverrides);
  const view = new ConfigView(cfg, "actor_rollout_ref.actor");
  const model = initModel(tinyConfig(), new Rng(3));
  const opt = new DataParallelOptimizer(model.trainableVariables(), view.at("optim"), 10, Collective.single(), view.num("grad_clip"));
  return { model, actor: new DataParallelPPOActor(model, opt, { config: view, miniBatchPerRank: miniPerRank, microBatchPerRank: microPerRank, seed: 1 }) };
}

function flatWeights(m: LlamaModel): Float32Array {
  return Float32Array.from([...m.params.values()].flatMap((v) => Array.from(v.dataSync())));
}

test("gradient accumulation over micro-batches equals one pass over the mini-batch (token-mean and seq-mean)", async () => {
  await initBackend("cpu");
  for (const mode of ["token-mean", "seq-mean-token-mean"]) {
    const over = [`actor_rollout_ref.actor.loss_agg_mode=${mode}`, "actor_rollout_ref.actor.entropy_coeff=0.01"];
    const big = build(over, 8, 8), small = build(over, 8, 2);
    const data = syntheticBatch(8, 5, 6, 32, 11);
    // Off-policy: two mini-batches of 4 would change the result; here one mini-batch, old = current.
    const old = (await big.actor.computeLogProb(data, { microBatchSize: 3, maxTokenLen: null }, 1.0, false)).logProbs;
    data.batch.old_log_probs = old;
    const m1 = await big.actor.updatePolicy(data);
    const m2 = await small.actor.updatePolicy(data);
    assert.ok(Math.abs(m1["actor/pg_loss"]![0]! - m2["actor/pg_loss"]![0]!) < 1e-6, `${mode}: pg_loss ${m1["actor/pg_loss"]} vs ${m2["actor/pg_loss"]}`);
    assert.ok(Math.abs(m1["actor/entropy"]![0]! - m2["actor/entropy"]![0]!) < 1e-5);
    assert.ok(Math.abs(m1["actor/grad_norm"]![0]! - m2["actor/grad_norm"]![0]!) < 1e-5 * m1["actor/grad_norm"]![0]!);
    const d = maxAbsDiff(flatWeights(big.model), flatWeights(small.model));
    assert.ok(d < 1e-5, `${mode}: weights differ by ${d}`);
    assert.equal(m2["actor/pg_clipfrac"]!.length, 1, "one token-weighted clipfrac per mini-batch");
    assert.ok(Math.abs(m1["actor/ppo_kl"]![0]! - m2["actor/ppo_kl"]![0]!) < 1e-6);
    big.model.dispose(); small.model.dispose();
  }
});

test("dynamic batch size by token budget gives the same update as fixed micro-batches", async () => {
  await initBackend("cpu");
  const fixed = build([], 6, 2);
  const dyn = build(["actor_rollout_ref.actor.use_dynamic_bsz=true", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=24"], 6, null);
  const data = syntheticBatch(6, 4, 5, 32, 5);
  data.batch.old_log_probs = (await fixed.actor.computeLogProb(data, { microBatchSize: null, maxTokenLen: 20 }, 1.0, false)).logProbs;
  const a = await fixed.actor.updatePolicy(data), b = await dyn.actor.updatePolicy(data);
  assert.ok(Math.abs(a["actor/pg_loss"]![0]! - b["actor/pg_loss"]![0]!) < 1e-6);
  assert.ok(maxAbsDiff(flatWeights(fixed.model), flatWeights(dyn.model)) < 1e-5);
});

test("the update moves log-probs the way the advantages ask, with KL loss and metrics named as verl", async () => {
  await initBackend("cpu");
  const { actor, model } = build(["actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.kl_loss_coef=0.1", "actor_rollout_ref.actor.ppo_epochs=2"], 4, 2);
  const data = syntheticBatch(4, 4, 4, 32, 9);
  const spec = { microBatchSize: 2, maxTokenLen: null };
  const before = await actor.computeLogProb(data, spec, 1.0, true);
  const rm = data.batch.response_mask!.data;
  assert.ok(before.entropy && before.entropy.data.every((x, i) => !rm[i] || x > 0), "entropy is positive on response tokens");
  data.batch.old_log_probs = before.logProbs;
  data.batch.ref_log_prob = before.logProbs;
  const metrics = await actor.updatePolicy(data);
  for (const k of ["actor/pg_loss", "actor/kl_loss", "actor/kl_coef", "actor/grad_norm", "actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower"]) {
    assert.ok(metrics[k] && metrics[k]!.every(Number.isFinite), `metric ${k}`);
  }
  assert.equal(metrics["actor/grad_norm"]!.length, 2, "two epochs of one mini-batch: two steps");
  const after = (await actor.computeLogProb(data, spec, 1.0, false)).logProbs;
  const mask = data.batch.response_mask!.data, adv = data.batch.advantages!.data;
  let gain = 0;
  for (let i = 0; i < mask.length; i++) if (mask[i]) gain += adv[i]! * (after.data[i]! - before.logProbs.data[i]!);
  assert.ok(gain > 0, `the policy should raise log-probs of positive-advantage tokens (gain ${gain})`);
  model.dispose();
});

test("policy updates keep the live tensor count flat", async () => {
  await initBackend("cpu");
  const { actor, model } = build(["actor_rollout_ref.actor.entropy_coeff=0.001"], 4, 2);
  const data = syntheticBatch(4, 3, 4, 32, 2);
  data.batch.old_log_probs = (await actor.computeLogProb(data, { microBatchSize: 2, maxTokenLen: null }, 1.0, false)).logProbs;
  await actor.updatePolicy(data);
  const before = tf.memory().numTensors;
  for (let i = 0; i < 3; i++) {
    await actor.computeLogProb(data, { microBatchSize: 2, maxTokenLen: null }, 1.0, true);
    await actor.updatePolicy(data);
  }
  assert.equal(tf.memory().numTensors, before);
  model.dispose();
});

test("micro-batch reads deferred to the end of the mini-batch: the same metrics and weights, one read instead of one per micro-batch", async () => {
  await initBackend("cpu");
  const run = (each: boolean) => countingReads(each, async (startCounting) => {
    const over = ["actor_rollout_ref.actor.entropy_coeff=0.01", "actor_rollout_ref.actor.use_kl_loss=true"];
    const { actor, model } = build(over, 8, 2);
    const data = syntheticBatch(8, 5, 6, 32, 13);
    data.batch.old_log_probs = (await actor.computeLogProb(data, { microBatchSize: 3, maxTokenLen: null }, 1.0, false)).logProbs;
    data.batch.ref_log_prob = data.batch.old_log_probs;
    const before = tf.memory().numTensors;
    startCounting();
    const metrics = await actor.updatePolicy(data);
    assert.equal(tf.memory().numTensors, before, `${each ? "each" : "deferred"}: no tensor left behind`);
    const weights = flatWeights(model);
    model.dispose();
    return { metrics, weights };
  });
  const each = await run(true), deferred = await run(false);
  assert.deepEqual(deferred.out.metrics, each.out.metrics, "metrics equal to the bit");
  assert.equal(maxAbsDiff(deferred.out.weights, each.out.weights), 0, "weights equal to the bit");
  // four micro-batches: four scalar reads before, one now (the optimizer's own reads are the same in both)
  assert.equal(each.reads - deferred.reads, 3, `reads: ${each.reads} per micro-batch against ${deferred.reads} deferred`);
});
