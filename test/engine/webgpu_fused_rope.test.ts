// The fused WebGPU rotary embedding (engine/webgpu_fused_rope.ts) against the composite of
// models/rope.ts applyRope on the same backend: values and gradients, dispatch counts, determinism
// and tensor counts, and a 2-layer Llama's update gradients with it. Runs only where a WebGPU adapter
// exists (the H200, or this CPU machine through Dawn's OpenGL backend on llvmpipe: docs/gpu.md,
// "Testing WebGPU code without a GPU"); skips with the reason elsewhere.
import { test } from "node:test";
import assert from "node:assert/strict";
import * as tf from "@tensorflow/tfjs";
import { dispatches, relErr, webgpuOrReason } from "./webgpu_adapter.js";
import { setFusedLayers } from "../../src/engine/webgpu_fused.js";
import { fusedRopeFor } from "../../src/engine/webgpu_fused_rope.js";
import { applyRope } from "../../src/models/rope.js";
import { ropeTables, rotateHalfMatrix } from "../../src/models/llama.js";
import { initModel } from "../../src/models/init.js";
import { makeConfig } from "../../src/models/config.js";
import { Rng } from "../../src/utils/rng.js";

const skip = await webgpuOrReason();
const gpu = { skip: skip || false };

/** Runs fn with the fused kernels on or off (the composite on the same backend); off afterwards (the default). */
function withFused<T>(on: boolean, fn: () => T): T {
  setFusedLayers(on);
  try { return fn(); } finally { setFusedLayers(false); }
}

/** Inputs of one rope call: x [N, H, hd] and the tables of positions with gaps and repeats. */
function inputs(N: number, H: number, hd: number) {
  const pos = Int32Array.from({ length: N }, (_, n) => (n * 7) % 13 + (n > 3 ? 100 : 0));
  const t = ropeTables(pos, hd, 1e6);
  return {
    x: tf.randomNormal([N, H, hd], 0, 2, "float32", N * H + hd),
    cos: tf.tensor3d(t.cos, [N, 1, hd]), sin: tf.tensor3d(t.sin, [N, 1, hd]), rot: rotateHalfMatrix(hd),
    c: tf.randomNormal([N, H, hd], 0, 1, "float32", 7),
  };
}

/** y and dy/dx of sum(rope(x) * c), fused or composite. */
function valueAndGrad(i: ReturnType<typeof inputs>, fused: boolean): tf.Tensor[] {
  return withFused(fused, () => {
    const f = (x: tf.Tensor) => applyRope(x, i.cos, i.sin, i.rot);
    return [f(i.x), tf.grad((x: tf.Tensor) => tf.sum(tf.mul(f(x), i.c)))(i.x)];
  });
}

test("off the webgpu backend, or with the fused switch off, the composite runs", { skip: !skip ? "webgpu is the backend here" : false }, () => {
  const x = tf.zeros([2, 3, 4]), t = tf.zeros([2, 1, 4]);
  assert.equal(withFused(true, () => fusedRopeFor(x, t, t)), false);
  tf.dispose([x, t]);
});

test("fused RoPE: values and gradients match the composite (hd 2 to 128, one row to many)", gpu, async () => {
  let worst = 0;
  for (const [N, H, hd] of [[1, 1, 2], [7, 3, 8], [30, 6, 64], [5, 16, 128], [300, 5, 32]] as const) {
    const i = inputs(N, H, hd);
    assert.equal(withFused(true, () => fusedRopeFor(i.x, i.cos, i.sin)), true);
    assert.equal(withFused(false, () => fusedRopeFor(i.x, i.cos, i.sin)), false, "the switch off: the composite");
    const f = valueAndGrad(i, true), r = valueAndGrad(i, false);
    for (const [j, what] of ["value", "gradient"].entries()) {
      const e = await relErr(f[j]!, r[j]!);
      worst = Math.max(worst, e);
      assert.ok(e <= 1e-6, `[${N}, ${H}, ${hd}] ${what}: relative error ${e.toExponential(2)}`);
    }
    tf.dispose([...Object.values(i), ...f, ...r]);
  }
  console.error(`fused RoPE against the composite: largest relative error ${worst.toExponential(2)}`);
});

test("fused RoPE: one dispatch forward, one backward; same bits twice; no leaked tensors", gpu, async () => {
  const i = inputs(40, 6, 64);
  const fwd = withFused(true, () => dispatches(() => applyRope(i.x, i.cos, i.sin, i.rot)));
  assert.equal(fwd.n, 1);
  const bwd = withFused(true, () => dispatches(() => tf.grad((x: tf.Tensor) => applyRope(x, i.cos, i.sin, i.rot))(i.x, i.c)));
  assert.equal(bwd.n, 2, "forward inside tf.grad, then the gradient");
  const comp = withFused(false, () => dispatches(() => tf.grad((x: tf.Tensor) => applyRope(x, i.cos, i.sin, i.rot))(i.x, i.c)));
  console.error(`RoPE forward + backward: ${comp.n} dispatches composite, ${bwd.n} fused`);
  assert.ok(comp.n >= 6, `composite ${comp.n}`);
  const again = withFused(true, () => [applyRope(i.x, i.cos, i.sin, i.rot), tf.grad((x: tf.Tensor) => applyRope(x, i.cos, i.sin, i.rot))(i.x, i.c)]);
  assert.deepEqual(await again[0]!.data(), await fwd.out.data());
  assert.deepEqual(await again[1]!.data(), await bwd.out.data());
  tf.dispose([fwd.out, bwd.out, comp.out, ...again]);
  const step = () => withFused(true, () => tf.dispose(tf.grad((x: tf.Tensor) => tf.sum(applyRope(x, i.cos, i.sin, i.rot)))(i.x)));
  step();
  const before = tf.memory().numTensors;
  for (let k = 0; k < 3; k++) step();
  assert.equal(tf.memory().numTensors, before);
  tf.dispose(Object.values(i));
});

test("a 2-layer Llama's loss gradients with the fused kernels, RoPE's included, agree with the composites' (plain and checkpointed)", gpu, async () => {
  const cfg = makeConfig({ vocabSize: 64, dim: 48, nLayers: 2, nHeads: 4, nKvHeads: 2, hiddenDim: 80, maxSeqLen: 16 });
  const m = initModel(cfg, new Rng(3));
  const ids = tf.tensor2d([[1, 5, 9, 13, 2, 7], [3, 4, 8, 60, 11, 0]], undefined, "int32");
  const attentionMask = [0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0];
  const vars = m.trainableVariables();
  // the loss over real tokens only, as the trainer's: padding queries see other keys under the fused
  // attention's keyStart contract (engine/webgpu_fused_attention.ts) than under the composite's bias
  const real = tf.tensor(attentionMask, [2, 6, 1]);
  const run = (fused: boolean) => withFused(fused, () => dispatches(() => tf.tidy(() => {
    const { value, grads } = tf.variableGrads(() => tf.mean(tf.logSoftmax(m.forward(ids, { attentionMask })).mul(real).mul(-1)) as tf.Scalar, vars);
    return [value, ...vars.map((v) => grads[v.name]!)];
  })));
  for (const ckpt of [false, true]) {
    m.gradientCheckpointing = ckpt;
    const f = run(true), r = run(false);
    for (let i = 0; i < f.out.length; i++) {
      const e = await relErr(f.out[i]!, r.out[i]!);
      assert.ok(e <= 1e-4, `${ckpt ? "checkpointed " : ""}${i ? vars[i - 1]!.name : "loss"}: relative error ${e.toExponential(2)}`);
    }
    assert.ok(f.n < r.n, `fused ${f.n} dispatches, composite ${r.n}`);
    console.error(`2-layer Llama forward+backward${ckpt ? " (checkpointed)" : ""}: ${r.n} dispatches composite, ${f.n} fused`);
    tf.dispose([...f.out, ...r.out]);
  }
  tf.dispose([ids, real]);
  m.dispose();
});
