// DataParallelOptimizer.step's gradScale (src/workers/dp_optimizer.ts): the actor's 16-bit loss
// scale is divided out of the summed gradient once at the step, no longer out of every
// micro-batch's gradients (which cost ~1-2 s of host recording per 0.5B update on the H200).
// A power-of-two scale gives the same bits either way: checked against the unscaled step, on the
// host path (ranks > 1) and the one-rank path.
import { test } from "node:test";
import assert from "node:assert/strict";
import * as tf from "@tensorflow/tfjs";
import { DataParallelOptimizer } from "../../../src/workers/dp_optimizer.js";
import { ConfigView } from "../../../src/workers/config_view.js";

const optim = new ConfigView({ actor: { optim: { lr: 0.1, weight_decay: 0.01 } } }, "actor.optim");

async function stepOnce(scale: number, worldSize: number): Promise<{ params: number[]; norm: number }> {
  const v = tf.variable(tf.tensor1d([0.5, -1, 2, 3]), true, `w_scale_${scale}_${worldSize}`);
  const collective = { worldSize, allReduce: () => undefined };
  const opt = new DataParallelOptimizer([v], optim, 10, collective, 1.0);
  for (const g of [[0.1, -0.2, 0.3, 1e-7], [0.05, 0.4, -0.3, 2e-7]]) {
    const grads = { [v.name]: tf.tensor1d(g.map((x) => x * scale)) };
    opt.accumulate(grads);
    tf.dispose(Object.values(grads));
  }
  const res = await opt.step([], 1 / scale);
  const params = Array.from(await v.data());
  opt.dispose();
  v.dispose();
  return { params, norm: res.gradNorm };
}

for (const worldSize of [1, 2]) {
  test(`a loss scale of 2^16 divided at the step gives the unscaled step's bits (world size ${worldSize})`, async () => {
    const plain = await stepOnce(1, worldSize);
    const scaled = await stepOnce(2 ** 16, worldSize);
    assert.deepEqual(scaled.params, plain.params);
    assert.equal(scaled.norm, plain.norm);
    // and the scale does reach the step: without dividing, the clip (1.0) would change the update
    const v = tf.variable(tf.tensor1d([0.5, -1, 2, 3]), true, `w_undivided_${worldSize}`);
    const opt = new DataParallelOptimizer([v], optim, 10, { worldSize, allReduce: () => undefined }, 1.0);
    const g = { [v.name]: tf.tensor1d([0.15 * 2 ** 16, 0.2 * 2 ** 16, 0, 0]) };
    opt.accumulate(g);
    tf.dispose(Object.values(g));
    const res = await opt.step([]);
    assert.ok(res.gradNorm > 1000, `undivided norm ${res.gradNorm}`);
    opt.dispose();
    v.dispose();
  });
}
