// The fused WebGPU kernels of RMSNorm, SwiGLU and GeGLU (engine/webgpu_fused.ts) against the
// tfjs composites of models/layers.ts on the same backend: values and gradients (tf.grads),
// dispatch counts, determinism and tensor counts. Runs only where a WebGPU adapter exists (the
// H200, or this CPU machine through Dawn's OpenGL backend on llvmpipe: docs/gpu.md, "Testing
// WebGPU code without a GPU"); skips with the reason elsewhere.
import { test } from "node:test";
import assert from "node:assert/strict";
import * as tf from "@tensorflow/tfjs";
import { dispatches, relErr, webgpuOrReason, withFused } from "./webgpu_adapter.js";
import { geGlu, rmsNorm, swiGlu } from "../../src/models/layers.js";
import { fusedLayersFor, setFusedLayers } from "../../src/engine/webgpu_fused.js";
import { initModel } from "../../src/models/init.js";
import { makeConfig } from "../../src/models/config.js";
import { Rng } from "../../src/utils/rng.js";

const skip = await webgpuOrReason();
// VERL_WEBGPU_FUSED=0 may have turned the kernels off; this file tests them, so on
setFusedLayers(true);
const gpu = { skip: skip || false };

/** Value and gradients of sum(op(inputs) * c) (c random, so dy is not uniform), fused or composite. */
function valueAndGrads(op: (...xs: tf.Tensor[]) => tf.Tensor, inputs: tf.Tensor[], c: tf.Tensor, fused: boolean): tf.Tensor[] {
  return withFused(fused, () => {
    const y = op(...inputs);
    const g = tf.grads((...xs: tf.Tensor[]) => tf.sum(tf.mul(op(...xs), c)))(inputs);
    return [y, ...g];
  });
}

async function compare(name: string, op: (...xs: tf.Tensor[]) => tf.Tensor, inputs: tf.Tensor[], outShape: number[]): Promise<void> {
  const c = tf.randomNormal(outShape, 0, 1, "float32", 7);
  const f = valueAndGrads(op, inputs, c, true), r = valueAndGrads(op, inputs, c, false);
  const labels = ["value", ...inputs.map((_, i) => `grad ${i}`)];
  for (let i = 0; i < f.length; i++) {
    const e = await relErr(f[i]!, r[i]!);
    assert.ok(e <= 1e-5, `${name} ${labels[i]}: relative error ${e.toExponential(2)}`);
  }
  tf.dispose([c, ...f, ...r]);
}

test("off the webgpu backend the composites run (no fused kernel is asked for)", { skip: !skip ? "webgpu is the backend here" : false }, () => {
  assert.equal(fusedLayersFor(tf.zeros([2, 3])), false);
});

test("RMSNorm: fused values and gradients match the composite (odd D, N = 1, D = 4864, many dw chunks)", gpu, async () => {
  for (const [N, D] of [[1, 7], [5, 300], [2, 4864], [700, 33], [3, 64]] as const) {
    const x = tf.randomNormal([N, D], 0, 2, "float32", N + D), w = tf.randomNormal([D], 1, 0.3, "float32", D);
    await compare(`rmsNorm [${N}, ${D}]`, (a, b) => rmsNorm(a!, b!, 1e-6), [x, w], [N, D]);
    tf.dispose([x, w]);
  }
});

test("SwiGLU and GeGLU: fused values and gradients match the composite", gpu, async () => {
  for (const [N, F] of [[1, 5], [37, 300], [3, 4864]] as const) {
    const gu = tf.randomNormal([N, 2 * F], 0, 3, "float32", N * F);
    await compare(`swiGlu [${N}, ${2 * F}]`, (a) => swiGlu(a as tf.Tensor2D), [gu], [N, F]);
    await compare(`geGlu [${N}, ${2 * F}]`, (a) => geGlu(a as tf.Tensor2D), [gu], [N, F]);
    gu.dispose();
  }
});

test("dispatches: RMSNorm forward 1, backward 3; SwiGLU forward 1, backward 1; same bits twice; no leaked tensors", gpu, async () => {
  const x = tf.randomNormal([300, 96], 0, 1, "float32", 1), w = tf.randomNormal([96], 1, 0.1, "float32", 2), dy = tf.randomNormal([300, 96], 0, 1, "float32", 3);
  const gu = tf.randomNormal([300, 192], 0, 1, "float32", 4), dh = tf.randomNormal([300, 96], 0, 1, "float32", 5);
  const fwd = dispatches(() => rmsNorm(x, w, 1e-5));
  assert.equal(fwd.n, 1);
  const bwd = dispatches(() => tf.grads((a: tf.Tensor, b: tf.Tensor) => rmsNorm(a, b, 1e-5))([x, w], dy));
  assert.equal(bwd.n, 1 + 3, "forward recomputed inside tf.grads, then dx 1 and dw 2");
  const glu = dispatches(() => swiGlu(gu as tf.Tensor2D));
  assert.equal(glu.n, 1);
  const gluBwd = dispatches(() => tf.grads((a: tf.Tensor) => swiGlu(a as tf.Tensor2D))([gu], dh));
  assert.equal(gluBwd.n, 2);
  // the dw column sum runs in a fixed order: a second run gives the same bits
  const again = tf.grads((a: tf.Tensor, b: tf.Tensor) => rmsNorm(a, b, 1e-5))([x, w], dy);
  assert.deepEqual(await again[1]!.data(), await bwd.out[1]!.data());
  tf.dispose([fwd.out, ...bwd.out, glu.out, ...gluBwd.out, ...again]);
  const step = () => tf.dispose([...tf.grads((a: tf.Tensor, b: tf.Tensor) => rmsNorm(a, b, 1e-5))([x, w], dy), ...tf.grads((a: tf.Tensor) => geGlu(a as tf.Tensor2D))([gu], dh)]);
  step();
  const before = tf.memory().numTensors;
  for (let i = 0; i < 3; i++) step();
  assert.equal(tf.memory().numTensors, before);
  tf.dispose([x, w, dy, gu, dh]);
});

test("a 2-layer Llama's loss gradients: fused and composite agree, with fewer dispatches", gpu, async () => {
  const cfg = makeConfig({ vocabSize: 64, dim: 48, nLayers: 2, nHeads: 4, nKvHeads: 2, hiddenDim: 80, maxSeqLen: 16 });
  const m = initModel(cfg, new Rng(3));
  const ids = tf.tensor2d([[1, 5, 9, 13, 2, 7], [3, 4, 8, 60, 11, 0]], undefined, "int32");
  const vars = m.trainableVariables();
  const run = (fused: boolean) => withFused(fused, () => dispatches(() => tf.tidy(() => {
    const { value, grads } = tf.variableGrads(() => tf.mean(tf.logSoftmax(m.forward(ids)).mul(-1)) as tf.Scalar, vars);
    return [value, ...vars.map((v) => grads[v.name]!)];
  })));
  const f = run(true), r = run(false);
  for (let i = 0; i < f.out.length; i++) {
    const e = await relErr(f.out[i]!, r.out[i]!);
    assert.ok(e <= 1e-4, `${i ? vars[i - 1]!.name : "loss"}: relative error ${e.toExponential(2)}`);
  }
  assert.ok(f.n < r.n, `fused ${f.n} dispatches, composite ${r.n}`);
  console.error(`2-layer Llama forward+backward: ${r.n} dispatches composite, ${f.n} fused`);
  tf.dispose([...f.out, ...r.out, ids]);
  m.dispose();
});
