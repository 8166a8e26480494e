// The SFT step on the cpu backend (exact float32): the loss is the response tokens'
// cross-entropy and nothing else, micro-batch accumulation gives the one-big-batch
// step, and the step leaves no tensors behind.
import { test } from "node:test";
import assert from "node:assert/strict";
import * as tf from "@tensorflow/tfjs";
import { sftLossSum, countLossTokens } from "../../../src/trainer/sft/index.js";
import { SFTWorker } from "../../../src/workers/sft/sft_worker.js";
import { maxAbsDiff, tinySftConfig, toyBatch } from "./helpers.js";

const PAIRS: [number, number][] = [[3, 4], [12, 30], [99, 99], [7, 58], [0, 0], [41, 9], [5, 123], [64, 36]];

async function worker(micro: number): Promise<SFTWorker> {
  const w = new SFTWorker(tinySftConfig(["trainer.device=cpu", `data.micro_batch_size_per_gpu=${micro}`]));
  await w.initModel(10);
  return w;
}

function weights(w: SFTWorker): Map<string, Float32Array> {
  return new Map([...w.model!.params].map(([k, v]) => [k, v.dataSync() as Float32Array]));
}

test("the loss sums -log p over exactly the response tokens (EOS included), from a full forward", async () => {
  const w = await worker(8);
  const batch = toyBatch(PAIRS);
  const ids = batch.batch.input_ids!, attn = batch.batch.attention_mask!, lm = batch.batch.loss_mask!;
  const [B, L] = ids.shape as [number, number];
  const got = tf.tidy(() => sftLossSum(w.model!, batch).dataSync()[0]!);
  // Reference: logits over all L columns, log-softmax by hand, the token after each weighted position.
  const logits = tf.tidy(() => w.model!.forward(tf.tensor2d(ids.data as Int32Array, [B, L], "int32"), {
    attentionMask: tf.tensor2d(attn.data as Int32Array, [B, L], "int32"),
  }));
  const V = logits.shape[2]!;
  const host = logits.dataSync();
  logits.dispose();
  let ref = 0, count = 0;
  for (let b = 0; b < B; b++) {
    let promptEnd = -1;
    for (let t = 0; t < L - 1; t++) {
      if (!lm.data[b * L + t]) continue;
      if (promptEnd < 0) promptEnd = t;
      const row = host.subarray((b * L + t) * V, (b * L + t + 1) * V);
      let max = -Infinity, z = 0;
      for (const x of row) max = Math.max(max, x);
      for (const x of row) z += Math.exp(x - max);
      const lse = max + Math.log(z);
      ref -= row[ids.data[b * L + t + 1]!]! - lse;
      count++;
    }
    assert.ok(promptEnd > 0, `row ${b} has loss tokens after its prompt`);
  }
  assert.equal(countLossTokens(batch), count);
  assert.ok(Math.abs(got - ref) < 1e-3 * Math.max(1, Math.abs(ref)), `loss sum ${got} vs reference ${ref}`);
});

test("micro-batches of 2 accumulate to the same step as one batch of 8 (loss, grad norm, weights)", async () => {
  const batch = toyBatch(PAIRS);
  const one = await worker(8), four = await worker(2);
  const w0 = weights(one);
  assert.ok(maxAbsDiff(w0.get("model.embed_tokens.weight")!, weights(four).get("model.embed_tokens.weight")!) === 0, "same seed, same init");
  const a = await one.trainStep(batch), b = await four.trainStep(batch);
  assert.ok(Math.abs(a.loss - b.loss) < 1e-6, `loss ${a.loss} vs ${b.loss}`);
  assert.ok(Math.abs(a.gradNorm - b.gradNorm) < 1e-5, `grad norm ${a.gradNorm} vs ${b.gradNorm}`);
  assert.equal(a.tokens, countLossTokens(batch));
  assert.equal(a.lr, 0.01);
  const wa = weights(one), wb = weights(four);
  let moved = 0;
  for (const [k, v] of wa) {
    assert.ok(maxAbsDiff(v, wb.get(k)!) < 1e-6, `${k} differs after the step`);
    moved = Math.max(moved, maxAbsDiff(v, w0.get(k)!));
  }
  assert.ok(moved > 1e-4, "the step changed the weights");
});

test("steps leave the live tensor count flat; an empty share still joins the all-reduce", async () => {
  const w = await worker(3);
  const batch = toyBatch(PAIRS);
  await w.trainStep(batch);
  const before = tf.memory().numTensors;
  for (let i = 0; i < 3; i++) await w.trainStep(batch);
  await w.evalLoss(batch);
  assert.equal(tf.memory().numTensors, before);
  const empty = await w.trainStep(batch.slice(0, 0));
  assert.equal(empty.tokens, 0);
  assert.equal(empty.loss, 0);
});
