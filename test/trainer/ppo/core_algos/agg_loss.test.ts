import { before, test } from "node:test";
import assert from "node:assert/strict";
import * as tf from "@tensorflow/tfjs";
import { aggLoss, LOSS_AGG_MODES } from "../../../../src/trainer/ppo/core_algos/index.js";
import { close, cpu, randMat, scalar, t2, testVectors, type Mat } from "../helpers.js";
import { aggRef } from "./reference_losses.js";

before(cpu);

test("each mode matches the reference vectors", (t) => {
  const tv = testVectors();
  if (!tv) return t.skip("../shared/reference/test-vectors.json absent");
  const v = tv.agg_loss as Record<string, unknown> & { loss_mat: Mat; mask: Mat };
  for (const mode of LOSS_AGG_MODES) close(scalar(aggLoss(t2(v.loss_mat), t2(v.mask), mode)), v[mode] as number, 1e-5, mode);
});

test("fully masked rows never count; an all-empty micro-batch gives 0, not NaN; NaN outside the mask is ignored", () => {
  const L = [[1, 2, 3], [NaN, 100, 7]];
  const m = [[1, 1, 0], [0, 0, 0]];
  close(scalar(aggLoss(t2(L), t2(m), "token-mean")), 1.5, 1e-6);
  close(scalar(aggLoss(t2(L), t2(m), "seq-mean-token-sum")), 3, 1e-6);
  close(scalar(aggLoss(t2(L), t2(m), "seq-mean-token-mean")), 1.5, 1e-6);
  close(scalar(aggLoss(t2(L), t2(m), "seq-mean-token-sum-norm")), 1, 1e-6);
  for (const mode of LOSS_AGG_MODES) assert.equal(scalar(aggLoss(t2(L), t2([[0, 0, 0], [0, 0, 0]]), mode)), 0, mode);
});

test("global normalisation: summing micro-batch losses and averaging over ranks equals one big batch", () => {
  // 8 rows on 2 ranks, each rank accumulating 2 micro-batches of 2 rows.
  const L = randMat(8, 6, 31, -1, 3);
  const m: Mat = randMat(8, 6, 32).map((r, i) => r.map((x, t) => (i === 5 ? 0 : t === 0 || x > -0.2 ? 1 : 0)));
  const nonEmpty = m.filter((r) => r.some((x) => x > 0)).length;
  const tokens = m.flat().reduce((a, b) => a + b, 0);
  for (const mode of LOSS_AGG_MODES) {
    const whole = scalar(aggLoss(t2(L), t2(m), mode, { lossScaleFactor: 6 }));
    const opts = { dpSize: 2, batchNumTokens: tokens, globalBatchSize: nonEmpty, lossScaleFactor: 6 };
    const perRank = [0, 1].map((rank) => {
      let acc = 0;
      for (const micro of [0, 1]) {
        const rows = [rank * 4 + micro * 2, rank * 4 + micro * 2 + 1];
        acc += scalar(aggLoss(t2(rows.map((r) => L[r]!)), t2(rows.map((r) => m[r]!)), mode, opts));
      }
      return acc;
    });
    close((perRank[0]! + perRank[1]!) / 2, whole, 1e-5, `${mode}: accumulated vs whole batch`);
    close(whole, aggRef(L, m, mode, { lossScaleFactor: 6 }), 1e-5, `${mode}: float64 reference`);
  }
});

test("gradient of token-mean is mask/N; unknown modes and bad options are errors", () => {
  const x = tf.variable(t2([[1, 2], [3, 4]]));
  const g = tf.grad((v: tf.Tensor) => aggLoss(v, t2([[1, 0], [1, 1]]), "token-mean"))(x);
  assert.deepEqual(Array.from(g.dataSync()), [1 / 3, 0, 1 / 3, 1 / 3].map((v) => Math.fround(v)));
  assert.throws(() => aggLoss(x, t2([[1, 0], [1, 1]]), "sum"), /invalid loss_agg_mode 'sum'; choose one of token-mean/);
  assert.throws(() => aggLoss(x, t2([[1, 0]]), "token-mean"), /differs from mask shape/);
  assert.throws(() => aggLoss(x, t2([[1, 0], [1, 1]]), "token-mean", { batchNumTokens: -1 }), /batchNumTokens must be a non-negative number/);
});
