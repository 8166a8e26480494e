import { before, test } from "node:test";
import assert from "node:assert/strict";
import * as tf from "@tensorflow/tfjs";
import { computeValueLoss } from "../../../../src/trainer/ppo/core_algos/index.js";
import { close, closeAll, cpu, finiteDiff, read, scalar, t2, type Mat } from "../helpers.js";
import { aggRef } from "./reference_losses.js";

before(cpu);

const values: Mat = [[0.5, 1.0, -0.2], [2.0, 0.0, 0.3]];
const returns: Mat = [[1.5, 0.9, 0.0], [0.0, 0.1, 5.0]];
const vpreds: Mat = [[1.2, 1.05, 0.4], [1.0, 0.02, 0.3]];
const mask: Mat = [[1, 1, 1], [1, 1, 0]];
const c = 0.5;

function reference(v: Mat, mode: string): { loss: number; clipfrac: number } {
  const L = v.map((r, i) => r.map((p, t) => {
    const clipped = Math.min(Math.max(p, values[i]![t]! - c), values[i]![t]! + c);
    return Math.max((p - returns[i]![t]!) ** 2, (clipped - returns[i]![t]!) ** 2);
  }));
  const clipFlags = v.flatMap((r, i) => r.map((p, t) => {
    const clipped = Math.min(Math.max(p, values[i]![t]! - c), values[i]![t]! + c);
    return (clipped - returns[i]![t]!) ** 2 > (p - returns[i]![t]!) ** 2 ? mask[i]![t]! : 0;
  }));
  return { loss: 0.5 * aggRef(L, mask, mode), clipfrac: clipFlags.reduce((a, b) => a + b, 0) / (5 + 1e-8) };
}

test("clipped value loss and vf_clipfrac match the float64 reference, with the right gradient", () => {
  for (const mode of ["token-mean", "seq-mean-token-mean"]) {
    const out = computeValueLoss({ vpreds: t2(vpreds), returns: t2(returns), values: t2(values), responseMask: t2(mask), cliprangeValue: c, lossAggMode: mode });
    const ref = reference(vpreds, mode);
    close(scalar(out.vfLoss), ref.loss, 1e-5, `${mode} loss`);
    close(scalar(out.vfClipfrac), ref.clipfrac, 1e-6, `${mode} clipfrac`);
    const g = tf.grad((v: tf.Tensor) => computeValueLoss({ vpreds: v, returns: t2(returns), values: t2(values), responseMask: t2(mask), cliprangeValue: c, lossAggMode: mode }).vfLoss)(t2(vpreds));
    closeAll(read(g), finiteDiff((v) => reference(v, mode).loss, vpreds, 1e-6).flat(), 1e-4, `${mode} gradient`);
  }
  assert.throws(() => computeValueLoss({ vpreds: t2(vpreds), returns: t2(returns), values: t2(values), responseMask: t2(mask), cliprangeValue: -1 }), /cliprange_value/);
});
