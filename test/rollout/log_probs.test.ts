import { test } from "node:test";
import assert from "node:assert/strict";
import * as tf from "@tensorflow/tfjs";
import { initBackend } from "../../src/engine/backend.js";
import { initModel } from "../../src/models/init.js";
import { makeConfig } from "../../src/models/config.js";
import { generate, defaultSamplingParams, computeLogProb, leftPadPrompts, responseLogProbs, logProbsFromLogits, entropyFromLogits } from "../../src/rollout/index.js";
import { Rng } from "../../src/utils/rng.js";

test("logProbsFromLogits and entropyFromLogits match direct formulas", async () => {
  await initBackend("cpu");
  const logits = [[1, 2, 3], [0, 0, Math.log(2)]];
  const [lp, ent] = tf.tidy(() => [logProbsFromLogits(tf.tensor2d(logits), tf.tensor1d([2, 0], "int32")).arraySync() as number[], entropyFromLogits(tf.tensor2d(logits)).arraySync() as number[]]);
  const ref = (row: number[], i: number) => row[i]! - Math.log(row.reduce((a, v) => a + Math.exp(v), 0));
  assert.ok(Math.abs(lp![0]! - ref(logits[0]!, 2)) < 1e-6);
  assert.ok(Math.abs(lp![1]! - Math.log(0.25)) < 1e-6);
  const H = (row: number[]) => { const z = row.reduce((a, v) => a + Math.exp(v), 0); return -row.reduce((a, v) => a + (Math.exp(v) / z) * (v - Math.log(z)), 0); };
  assert.ok(Math.abs(ent![0]! - H(logits[0]!)) < 1e-6);
  assert.ok(Math.abs(ent![1]! - H(logits[1]!)) < 1e-6);
});

test("responseLogProbs: trimmed forward equals the full forward, temperature applies, gradients flow; computeLogProb micro-batches agree", async () => {
  await initBackend("wasm");
  const cfg = makeConfig({ vocabSize: 30, dim: 16, hiddenDim: 24, nLayers: 2, nHeads: 2, nKvHeads: 1 });
  const m = initModel(cfg, new Rng(3));
  try {
    const batch = leftPadPrompts([[1, 2, 3, 4], [5, 6], [7]], 0, 6); // two all-pad columns on the left
    const out = generate(m, batch, defaultSamplingParams({ temperature: 1, responseLength: 7, eosTokenIds: [3, 4, 5], padTokenId: 0 }), new Rng(2));
    const [B, L] = out.batch["input_ids"]!.shape as [number, number], R = 7, P = L - R;
    // reference: full logits without trimming, temperature 0.7
    const ref = tf.tidy(() => {
      const ids = tf.tensor2d(out.batch["input_ids"]!.data as Int32Array, [B, L], "int32");
      const logits = m.forward(ids, { attentionMask: tf.tensor2d(out.batch["attention_mask"]!.data as Int32Array, [B, L], "int32"), positionIds: tf.tensor2d(out.batch["position_ids"]!.data as Int32Array, [B, L], "int32") });
      const lg = logits.slice([0, P - 1, 0], [B, R, -1]).div(0.7);
      return logProbsFromLogits(lg, tf.tensor2d(out.batch["responses"]!.data as Int32Array, [B, R], "int32")).dataSync();
    });
    const got = await computeLogProb(m, out, { microBatchSize: 2, temperature: 0.7, calculateEntropy: true });
    const mask = out.batch["response_mask"]!.data;
    for (let i = 0; i < B * R; i++) {
      if (mask[i]) assert.ok(Math.abs(got.logProbs.data[i]! - ref[i]!) < 1e-5, `slot ${i}`);
      else if (got.logProbs.data[i] !== 0) assert.ok(Math.abs(got.logProbs.data[i]! - ref[i]!) < 1e-5, `slot ${i}`);
    }
    assert.ok(got.entropy && got.entropy.data.every((h, i) => !mask[i] || h > 0));
    // differentiable: gradients reach every parameter
    const micro = out.select(["input_ids", "attention_mask", "position_ids", "responses"]);
    const { value, grads } = tf.variableGrads(() => {
      const r = responseLogProbs(m, micro, { temperature: 0.7 });
      return tf.mul(r.logProbs, tf.tensor2d(Float32Array.from(mask), [B, R])).sum().neg() as tf.Scalar;
    }, m.trainableVariables());
    const gsum = Object.values(grads).reduce((a, g) => a + (g.abs().sum().dataSync()[0] ?? 0), 0);
    assert.ok(Number.isFinite(value.dataSync()[0]!) && gsum > 0);
    tf.dispose([value, ...Object.values(grads)]);
    await assert.rejects(computeLogProb(m, out, { microBatchSize: 0 }), /microBatchSize must be a positive integer/);
  } finally {
    m.dispose();
  }
});
