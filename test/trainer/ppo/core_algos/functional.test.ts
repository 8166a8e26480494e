import { before, test } from "node:test";
import assert from "node:assert/strict";
import * as tf from "@tensorflow/tfjs";
import {
  entropyFromLogits, getResponseMask, maskedMean, maskedSum, maskedVar, maskedWhiten, stopGradient,
} from "../../../../src/trainer/ppo/core_algos/index.js";
import { close, closeAll, cpu, read, scalar, t2, testVectors, type Mat } from "../helpers.js";

before(cpu);

test("maskedMean: +1e-8 denominator, NaN outside the mask ignored, NaN inside propagates; per-axis", () => {
  const x = t2([[1, 2, NaN], [4, NaN, 6]]);
  const m = t2([[1, 1, 0], [1, 0, 1]]);
  close(scalar(maskedMean(x, m)), 13 / (4 + 1e-8), 1e-6);
  closeAll(read(maskedMean(x, m, 1)), [1.5, 5], 1e-6);
  closeAll(read(maskedSum(x, m, 1)), [3, 10], 0);
  assert.ok(Number.isNaN(scalar(maskedMean(x, t2([[1, 1, 1], [0, 0, 0]])))));
  assert.equal(scalar(maskedMean(x, t2([[0, 0, 0], [0, 0, 0]]))), 0);
});

test("maskedVar is unbiased and refuses fewer than two elements; maskedWhiten uses rsqrt(var + 1e-8) everywhere", () => {
  const vals: Mat = [[1, 2, 3, 100], [4, 5, 6, -100]];
  const mask: Mat = [[1, 1, 1, 0], [1, 1, 1, 0]];
  const sel = [1, 2, 3, 4, 5, 6], mu = 3.5;
  const variance = sel.reduce((a, b) => a + (b - mu) ** 2, 0) / 5;
  close(scalar(maskedVar(t2(vals), t2(mask))), variance, 1e-5);
  close(scalar(maskedVar(t2(vals), t2(mask), false)), (variance * 5) / 6, 1e-5);
  closeAll(read(maskedWhiten(t2(vals), t2(mask))), vals.flat().map((v) => (v - mu) / Math.sqrt(variance + 1e-8)), 1e-5);
  closeAll(read(maskedWhiten(t2(vals), t2(mask), false)), vals.flat().map((v) => (v - mu) / Math.sqrt(variance + 1e-8) + mu), 1e-5);
  assert.throws(() => maskedVar(t2(vals), t2([[0, 0, 0, 0], [0, 0, 0, 0]])), /selects no element/);
  assert.throws(() => maskedVar(t2(vals), t2([[0, 1, 0, 0], [0, 0, 0, 0]])), /selects one element/);
});

test("entropyFromLogits equals −Σ p log p computed in float64", () => {
  const logits = [[[2, 0.5, -1, 0], [10, -10, 0, 0]], [[0, 0, 0, 0], [-3, 1, 1, 2]]];
  const expected = logits.flat().map((z) => {
    const mx = Math.max(...z), e = z.map((v) => Math.exp(v - mx)), s = e.reduce((a, b) => a + b, 0);
    return -e.reduce((acc, v) => acc + (v / s) * Math.log(v / s), 0);
  });
  const h = entropyFromLogits(tf.tensor3d(logits));
  assert.deepEqual(h.shape, [2, 2]);
  closeAll(read(h), expected, 1e-5);
});

test("getResponseMask: 1 through the first EOS, for one id or a list (reference vectors)", (t) => {
  const tv = testVectors();
  if (!tv) return t.skip("../shared/reference/test-vectors.json absent");
  const ids = tf.tensor2d([[20, 10, 34, 1, 0, 0, 0], [78, 0, 76, 2, 1, 0, 0], [23, 98, 1, 0, 0, 0, 0], [33, 3, 98, 45, 1, 0, 0]], undefined, "int32");
  assert.deepEqual(getResponseMask(ids, 1).arraySync(), tv.get_response_mask_eos1);
  assert.deepEqual(getResponseMask(ids, [1, 2]).arraySync(), tv.get_response_mask_eos12);
  assert.equal(getResponseMask(ids, 1, "float32").dtype, "float32");
  assert.throws(() => getResponseMask(ids, []), /empty list/);
});

test("stopGradient passes values and blocks gradients", () => {
  const x = tf.tensor1d([1, 2, 3]);
  const g = tf.grad((v: tf.Tensor) => tf.sum(tf.add(tf.mul(v, v), tf.mul(stopGradient(v), 10))))(x);
  closeAll(read(g), [2, 4, 6], 0);
  closeAll(read(stopGradient(x)), [1, 2, 3], 0);
});
