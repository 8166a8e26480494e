import { test } from "node:test";
import assert from "node:assert/strict";
import * as tf from "@tensorflow/tfjs";
import { initBackend } from "../../../src/engine/backend.js";
import { loadConfig } from "../../../src/config/index.js";
import { ValueHeadModel } from "../../../src/models/index.js";
import { tensor } from "../../../src/protocol/tensor.js";
import { Collective } from "../../../src/single_controller/collective.js";
import { Rng } from "../../../src/utils/rng.js";
import { DataParallelPPOCritic } from "../../../src/workers/critic/dp_critic.js";
import { ConfigView } from "../../../src/workers/config_view.js";
import { DataParallelOptimizer } from "../../../src/workers/dp_optimizer.js";
import { inferenceSpec } from "../../../src/workers/worker_setup.js";
import { countingReads, syntheticBatch, tinyConfig } from "../helpers.js";

test("the critic fits returns (vf_loss falls), values are zero off the mask, tensors stay flat", async () => {
  await initBackend("cpu");
  const cfg = loadConfig({ configName: "ppo_trainer", overrides: ["critic.optim.lr=0.01", "critic.optim.weight_decay=0.0", "critic.cliprange_value=100.0"] });
  const view = new ConfigView(cfg, "critic");
  const model = ValueHeadModel.init(tinyConfig(), new Rng(4));
  const opt = new DataParallelOptimizer(model.trainableVariables(), view.at("optim"), 10, Collective.single(), 1.0);
  const critic = new DataParallelPPOCritic(model, opt, { config: view, miniBatchPerRank: 4, microBatchPerRank: 2, forwardSpec: { microBatchSize: 2, maxTokenLen: null }, seed: 1 });
  const data = syntheticBatch(4, 4, 5, 32, 8);
  const mask = data.batch.response_mask!.data;
  data.batch.returns = tensor(Float32Array.from(mask, (m, i) => (m ? 0.5 + 0.1 * (i % 3) : 0)), [4, 5], "float32");
  const losses: number[] = [];
  let before = 0;
  for (let i = 0; i < 8; i++) {
    data.batch.values = await critic.computeValues(data);
    if (i === 0) assert.ok(data.batch.values.data.every((v, j) => mask[j] || v === 0), "values are 0 outside the response mask");
    const m = await critic.updateCritic(data);
    losses.push(m["critic/vf_loss"]![0]!);
    for (const k of ["critic/vf_clipfrac", "critic/vpred_mean", "critic/grad_norm"]) assert.ok(Number.isFinite(m[k]![0]), k);
    if (i === 1) before = tf.memory().numTensors;
  }
  assert.equal(tf.memory().numTensors, before, "no tensors leak across updates");
  assert.ok(losses[7]! < 0.5 * losses[0]!, `vf_loss should fall: ${losses.map((l) => l.toFixed(4)).join(" ")}`);
  model.dispose();
  opt.dispose();
});

test("the values pass micro-batches by critic.forward_*: per rank, verl's global size split over ranks, else the update's", () => {
  const spec = (...overrides: string[]) =>
    inferenceSpec(new ConfigView(loadConfig({ configName: "ppo_trainer", overrides }), "critic"), "forward_", "use_dynamic_bsz", "forward_max_token_len_per_gpu", 2);
  assert.deepEqual(spec("critic.ppo_micro_batch_size_per_gpu=4"), { microBatchSize: 4, maxTokenLen: null });
  assert.deepEqual(spec("critic.ppo_micro_batch_size_per_gpu=4", "critic.forward_micro_batch_size_per_gpu=8"), { microBatchSize: 8, maxTokenLen: null });
  assert.deepEqual(spec("critic.forward_micro_batch_size=16", "critic.forward_micro_batch_size_per_gpu=null"), { microBatchSize: 8, maxTokenLen: null });
  assert.deepEqual(spec("critic.use_dynamic_bsz=true", "critic.ppo_max_token_len_per_gpu=512"), { microBatchSize: null, maxTokenLen: 512 });
});

test("the critic's micro-batch reads deferred to the end of the mini-batch: the same metrics and weights, fewer reads", async () => {
  await initBackend("cpu");
  const run = (each: boolean) => countingReads(each, async (startCounting) => {
    const cfg = loadConfig({ configName: "ppo_trainer", overrides: ["critic.optim.lr=0.01", "critic.cliprange_value=0.2"] });
    const view = new ConfigView(cfg, "critic");
    const model = ValueHeadModel.init(tinyConfig(), new Rng(4));
    const opt = new DataParallelOptimizer(model.trainableVariables(), view.at("optim"), 10, Collective.single(), 1.0);
    const critic = new DataParallelPPOCritic(model, opt, { config: view, miniBatchPerRank: 8, microBatchPerRank: 2, forwardSpec: { microBatchSize: 3, maxTokenLen: null }, seed: 1 });
    const data = syntheticBatch(8, 4, 5, 32, 9);
    data.batch.returns = tensor(Float32Array.from(data.batch.response_mask!.data, (m, i) => (m ? 0.3 + 0.2 * (i % 5) : 0)), [8, 5], "float32");
    data.batch.values = await critic.computeValues(data);
    const first = await critic.updateCritic(data); // makes the optimizer's state
    const before = tf.memory().numTensors;
    startCounting();
    const metrics = [first, await critic.updateCritic(data)];
    assert.equal(tf.memory().numTensors, before, "no tensor left behind");
    const weights = Float32Array.from(model.trainableVariables().flatMap((v) => Array.from(v.dataSync())));
    model.dispose();
    opt.dispose();
    return { metrics, weights };
  });
  const each = await run(true), deferred = await run(false);
  assert.deepEqual(deferred.out.metrics, each.out.metrics, "metrics equal to the bit");
  assert.deepEqual(deferred.out.weights, each.out.weights, "weights equal to the bit");
  assert.equal(each.reads - deferred.reads, 3, `four micro-batches: ${each.reads} reads against ${deferred.reads}`);
});
