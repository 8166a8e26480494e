import { test } from "node:test";
import assert from "node:assert/strict";
import * as tf from "@tensorflow/tfjs";
import { initBackend } from "../../src/engine/backend.js";
import { makeConfig } from "../../src/models/config.js";
import { initModel } from "../../src/models/init.js";
import { packResponses, packRows, segmentView } from "../../src/models/packing.js";
import { ValueHeadModel } from "../../src/models/value_head.js";
import { responseLogProbs } from "../../src/rollout/log_probs.js";
import { Rng } from "../../src/utils/rng.js";
import { responseValues } from "../../src/workers/forward.js";
import { maxAbsDiff, syntheticBatch } from "../workers/helpers.js";

const config = makeConfig({ vocabSize: 32, dim: 16, hiddenDim: 32, nLayers: 2, nHeads: 4, nKvHeads: 2, maxSeqLen: 64, attentionBias: true });

test("packRows / packResponses / segmentView: real tokens back to back, positions restart, response sources one token back", () => {
  // row 0: [pad, 5, 6 | 7, pad]; row 1: [8, 9, 10 | 11, 12]
  const ids = [0, 5, 6, 7, 0, 8, 9, 10, 11, 12], mask = [0, 1, 1, 1, 0, 1, 1, 1, 1, 1];
  const p = packRows(ids, mask, 2, 5);
  assert.deepEqual(Array.from(p.ids), [5, 6, 7, 8, 9, 10, 11, 12]);
  assert.deepEqual(Array.from(p.positions), [0, 1, 2, 0, 1, 2, 3, 4]);
  assert.deepEqual(Array.from(p.lengths), [3, 5]);
  const r = packResponses(ids, mask, 2, 5, 2);
  assert.deepEqual(Array.from(r.source), [1, 5, 6]);
  assert.deepEqual(Array.from(r.labels), [7, 11, 12]);
  assert.deepEqual(Array.from(r.slot), [0, 3, 1, 2]);
  const v = segmentView(p.lengths, 1, 8);
  assert.equal(v.maxLen, 5);
  assert.deepEqual(Array.from(v.toPacked), [0, 1, 2, 5, 6, 7, 8, 9]);
  assert.deepEqual(Array.from(v.mask), [1, 1, 1, 0, 0, 1, 1, 1, 1, 1]);
  assert.throws(() => packResponses([0, 7, 0, 1], [0, 1, 0, 1], 2, 2, 1), /row 0 has a response token with no real token before it/);
  assert.throws(() => segmentView([3, 4], 1, 8), /sum to 7/);
});

for (const backend of ["wasm", "cpu"]) {
  test(`remove-padding gives the padded log-probs, entropy, values and gradients on real slots (${backend})`, async () => {
    await initBackend(backend);
    const m = initModel(config, new Rng(4));
    const data = syntheticBatch(5, 6, 5, 32, 17);
    const rm = data.batch.response_mask!.data;
    const masked = (x: ArrayLike<number>) => Array.from(x, (v, i) => (rm[i] ? v : 0));
    try {
      const run = (removePadding: boolean) => {
        const { value, grads } = tf.variableGrads(() => {
          const r = responseLogProbs(m, data, { temperature: 0.7, calculateEntropy: true, removePadding });
          const w = tf.tensor(data.batch.advantages!.data as Float32Array, [5, 5]).mul(tf.tensor(Float32Array.from(rm), [5, 5]));
          return tf.sum(tf.mul(r.logProbs, w)).add(tf.sum(tf.mul(r.entropy!, w))) as tf.Scalar;
        }, m.trainableVariables());
        const r = tf.tidy(() => responseLogProbs(m, data, { temperature: 0.7, calculateEntropy: true, removePadding }));
        const out = { lp: r.logProbs.dataSync(), ent: r.entropy!.dataSync(), loss: value.dataSync()[0]!, g: Object.values(grads).map((t) => t.dataSync()) };
        tf.dispose([value, ...Object.values(grads), r.logProbs, r.entropy!]);
        return out;
      };
      const padded = run(false), packed = run(true);
      assert.ok(maxAbsDiff(masked(padded.lp), masked(packed.lp)) < 1e-5, `log-probs ${maxAbsDiff(masked(padded.lp), masked(packed.lp))}`);
      assert.ok(maxAbsDiff(masked(padded.ent), masked(packed.ent)) < 1e-5);
      assert.deepEqual(Array.from(packed.lp, (v, i) => (rm[i] ? 1 : v)), Array.from(rm, (x) => (x ? 1 : 0)), "padded slots read 0");
      assert.ok(Math.abs(padded.loss - packed.loss) < 1e-5 * Math.max(1, Math.abs(padded.loss)));
      padded.g.forEach((g, i) => assert.ok(maxAbsDiff(g, packed.g[i]!) < 1e-5, `gradient ${i}: ${maxAbsDiff(g, packed.g[i]!)}`));

      const vm = ValueHeadModel.fromPolicy(m, new Rng(8));
      const vals = (rp: boolean) => tf.tidy(() => responseValues(vm, data, rp).dataSync());
      assert.ok(maxAbsDiff(masked(vals(false)), masked(vals(true))) < 1e-5);
      vm.dispose();
    } finally {
      m.dispose();
    }
  });
}
