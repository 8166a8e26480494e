// The fused token log-probs, entropy and Σπ² (src/engine/webgpu_fused_logprob.ts) against the log-softmax
// composite on the same backend: values and gradients (temperature, labels outside the vocabulary,
// a vocabulary that is no multiple of the workgroup), the same bits twice, fewer dispatches, and a
// model's response log-probs (rollout/log_probs.ts) either way. Runs where a WebGPU adapter exists
// (llvmpipe on this CPU machine); skips with the reason elsewhere.
import { test } from "node:test";
import assert from "node:assert/strict";
import * as tf from "@tensorflow/tfjs";
import { dispatches, relErr, webgpuOrReason } from "./webgpu_adapter.js";
import { fusedLogProbsFor, fusedTokenLogProbs } from "../../src/engine/webgpu_fused_logprob.js";
import { responseLogProbs } from "../../src/rollout/log_probs.js";
import { makeConfig } from "../../src/models/config.js";
import { initModel } from "../../src/models/init.js";
import { DataProto } from "../../src/protocol/data_proto.js";
import { tensor } from "../../src/protocol/tensor.js";
import { Rng } from "../../src/utils/rng.js";

const skip = await webgpuOrReason();
const gpu = { skip: skip || false };

/** The composite: log softmax(z / T) at the labels (0 outside [0, V)), the entropy and Σπ². */
function composite(logits: tf.Tensor2D, labels: tf.Tensor1D, T: number): { logProbs: tf.Tensor; entropy: tf.Tensor; sumPiSquared: tf.Tensor } {
  const logSm = tf.logSoftmax(tf.div(logits, T));
  return {
    logProbs: tf.sum(tf.mul(logSm, tf.oneHot(labels, logits.shape[1])), -1),
    entropy: tf.neg(tf.sum(tf.mul(tf.exp(logSm), logSm), -1)),
    sumPiSquared: tf.sum(tf.exp(tf.mul(logSm, 2)), -1),
  };
}

test("fused token log-probs: values and gradients match the composite (temperature, labels out of range, V = 1000); same bits twice; fewer dispatches", gpu, async (t) => {
  const N = 37, V = 1000, T = 0.7;
  const logits = tf.tidy(() => tf.mul(tf.randomNormal([N, V], 0, 1, "float32", 3), 4)) as tf.Tensor2D;
  const labels = tf.tensor1d(Int32Array.from({ length: N }, (_, i) => (i === 5 ? -1 : i === 9 ? V : (i * 131) % V)), "int32");
  const a = tf.randomNormal([N], 0, 1, "float32", 4), b = tf.randomNormal([N], 0, 1, "float32", 5), c = tf.randomNormal([N], 0, 1, "float32", 6);
  assert.ok(fusedLogProbsFor(logits));
  const loss = (f: (z: tf.Tensor2D) => { logProbs: tf.Tensor; entropy: tf.Tensor; sumPiSquared: tf.Tensor }) => (z: tf.Tensor) => {
    const o = f(z as tf.Tensor2D);
    return tf.addN([tf.sum(tf.mul(o.logProbs, a)), tf.sum(tf.mul(o.entropy, b)), tf.sum(tf.mul(o.sumPiSquared, c))]) as tf.Scalar;
  };
  const fused = (z: tf.Tensor2D) => fusedTokenLogProbs(z, labels, T);
  const ref = (z: tf.Tensor2D) => composite(z, labels, T);
  const fv = fused(logits), rv = ref(logits);
  assert.deepEqual(fv.logProbs.shape, [N]);
  const lp = await fv.logProbs.data();
  assert.equal(lp[5], 0, "a label below 0 reads 0");
  assert.equal(lp[9], 0, "a label past V reads 0");
  for (const [k, x, y] of [["log-probs", fv.logProbs, rv.logProbs], ["entropy", fv.entropy, rv.entropy], ["sum of p^2", fv.sumPiSquared, rv.sumPiSquared]] as const) {
    const e = await relErr(x, y);
    t.diagnostic(`${k}: relative error ${e.toExponential(2)}`);
    assert.ok(e <= 1e-5, `${k}: ${e}`);
  }
  const gf = dispatches(() => tf.grad(loss(fused))(logits)), gr = dispatches(() => tf.grad(loss(ref))(logits));
  const e = await relErr(gf.out, gr.out);
  t.diagnostic(`gradient: relative error ${e.toExponential(2)}; forward + backward ${gf.n} dispatches fused, ${gr.n} composite`);
  assert.ok(e <= 1e-5, `gradient: ${e}`);
  assert.ok(gf.n < gr.n / 2, `${gf.n} dispatches against ${gr.n}`);
  const again = tf.grad(loss(fused))(logits);
  assert.deepEqual(await again.data(), await gf.out.data(), "the same bits twice");
  const fwd = dispatches(() => fusedTokenLogProbs(logits, labels, 1));
  assert.equal(fwd.n, 1, "the forward is one dispatch (the rows are cut apart by copies)");
  assert.throws(() => fusedTokenLogProbs(logits, tf.tensor1d([1, 2], "int32"), 1), /labels must be int32 \[37\]/);
  assert.throws(() => fusedTokenLogProbs(logits, labels, 0), /temperature must be > 0/);
  tf.dispose([logits, labels, a, b, c, ...Object.values(fv), ...Object.values(rv), gf.out, gr.out, again, ...Object.values(fwd.out)]);
});

test("a model's response log-probs, entropy and Σπ² with the fused kernels: the composite's values and parameter gradients, padded and packed", gpu, async (t) => {
  const config = makeConfig({ vocabSize: 300, dim: 32, hiddenDim: 64, nLayers: 1, nHeads: 4, nKvHeads: 2, tieWordEmbeddings: true, maxSeqLen: 32 });
  const model = initModel(config, new Rng(7));
  const B = 3, P = 4, R = 5, L = P + R;
  const ids = Int32Array.from({ length: B * L }, (_, i) => (i * 37 + 11) % 300);
  const mask = Int32Array.from({ length: B * L }, (_, i) => (i % L === L - 1 && i < L ? 0 : 1)); // row 0's last response slot is padding
  const micro = DataProto.fromDict({
    input_ids: tensor(ids, [B, L], "int32"), attention_mask: tensor(mask, [B, L], "int32"),
    position_ids: tensor(Int32Array.from({ length: B * L }, (_, i) => i % L), [B, L], "int32"),
    responses: tensor(Int32Array.from({ length: B * R }, (_, i) => ids[Math.floor(i / R) * L + P + (i % R)]!), [B, R], "int32"),
  });
  const params = [...model.trainableParams().values()];
  const run = (fusedOn: boolean, removePadding: boolean) => {
    const before = process.env.VERL_WEBGPU_FUSED_LOGPROB;
    process.env.VERL_WEBGPU_FUSED_LOGPROB = fusedOn ? "1" : "0";
    try {
      let out: { logProbs: tf.Tensor; entropy?: tf.Tensor; sumPiSquared?: tf.Tensor } | undefined;
      const g = tf.variableGrads(() => {
        const o = responseLogProbs(model, micro, { temperature: 0.8, calculateEntropy: true, calculateSumPiSquared: true, removePadding });
        out = { logProbs: tf.keep(o.logProbs.clone()), entropy: tf.keep(o.entropy!.clone()), sumPiSquared: tf.keep(o.sumPiSquared!.clone()) };
        return tf.addN([tf.sum(o.logProbs), tf.mul(tf.sum(o.entropy!), 0.3), tf.mul(tf.sum(o.sumPiSquared!), 2)]) as tf.Scalar;
      }, params);
      return { ...out!, grads: g.grads, value: g.value };
    } finally {
      if (before === undefined) delete process.env.VERL_WEBGPU_FUSED_LOGPROB; else process.env.VERL_WEBGPU_FUSED_LOGPROB = before;
    }
  };
  for (const removePadding of [false, true]) {
    const f = run(true, removePadding), c = run(false, removePadding);
    const what = removePadding ? "packed" : "padded";
    assert.ok(await relErr(f.logProbs, c.logProbs) <= 1e-5, `${what}: log-probs`);
    assert.ok(await relErr(f.entropy!, c.entropy!) <= 1e-5, `${what}: entropy`);
    assert.ok(await relErr(f.sumPiSquared!, c.sumPiSquared!) <= 1e-5, `${what}: sum of p^2`);
    let worst = 0;
    for (const k of Object.keys(c.grads)) worst = Math.max(worst, await relErr(f.grads[k]!, c.grads[k]!));
    t.diagnostic(`${what}: worst parameter gradient relative error ${worst.toExponential(2)}`);
    assert.ok(worst <= 1e-4, `${what}: gradients ${worst}`);
    tf.dispose([f.logProbs, f.entropy!, f.sumPiSquared!, f.value, ...Object.values(f.grads), c.logProbs, c.entropy!, c.sumPiSquared!, c.value, ...Object.values(c.grads)]);
  }
});
