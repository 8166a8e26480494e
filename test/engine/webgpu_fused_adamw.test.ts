// The fused WebGPU AdamW and gradient norm (engine/webgpu_fused_adamw.ts) against the composite
// AdamW (engine/optim/adamw.ts) and norm on the same backend: parameters and moments over several
// steps (weight decay, clip on and off, gradScale 2^-k), determinism, tensor counts, and the
// dispatches and GPU buffers a step creates. Runs only where a WebGPU adapter exists (llvmpipe on
// this CPU machine: docs/gpu.md, "Testing WebGPU code without a GPU"); skips with the reason elsewhere.
import { test } from "node:test";
import assert from "node:assert/strict";
import * as tf from "@tensorflow/tfjs";
import { dispatches, relErr, webgpuOrReason, withFused } from "./webgpu_adapter.js";
import { setFusedLayers } from "../../src/engine/webgpu_fused.js";
import { concatFlat, splitFlat } from "../../src/engine/copies.js";
import { fusedGradNorm } from "../../src/engine/webgpu_fused_adamw.js";
import { AdamW } from "../../src/engine/optim/adamw.js";
import { loadConfig } from "../../src/config/index.js";
import { Collective } from "../../src/single_controller/collective.js";
import { ConfigView } from "../../src/workers/config_view.js";
import { DataParallelOptimizer } from "../../src/workers/dp_optimizer.js";

const skip = await webgpuOrReason();
setFusedLayers(true);
const gpu = { skip: skip || false };

/** `count` variables of varied sizes (seeded), `total` values in all roughly. */
function makeVars(count: number, total: number, seed: number, tag = ""): tf.Variable[] {
  return Array.from({ length: count }, (_, i) => {
    const n = Math.max(1, Math.round((total / count) * (0.25 + 1.5 * ((i * 37) % count) / count)));
    return tf.tidy(() => tf.variable(tf.randomNormal([n], 0, 1, "float32", seed + i), true, `w${seed}${tag}_${i}`));
  });
}
const flat = (vs: tf.Variable[]) => tf.tidy(() => tf.concat(vs.map((v) => v.reshape([-1]))));

/**
 * The GPU buffers inside fn: asked of tfjs's buffer manager (each output takes one, from its
 * free pool when it has one of that size) and created on the device (the pool had none): counts and bytes.
 */
function buffers<T>(fn: () => T): { out: T; acquired: number; acquiredBytes: number; created: number; createdBytes: number } {
  const be = tf.backend() as unknown as { device: { createBuffer: (d: { size: number }) => unknown }; bufferManager: { acquireBuffer: (size: number, ...a: unknown[]) => unknown } };
  const dev = be.device, bm = be.bufferManager, create = dev.createBuffer, acquire = bm.acquireBuffer;
  const r = { acquired: 0, acquiredBytes: 0, created: 0, createdBytes: 0 };
  dev.createBuffer = function (this: unknown, d: { size: number }) { r.created++; r.createdBytes += d.size; return create.call(this, d); };
  bm.acquireBuffer = function (this: unknown, size: number, ...a: unknown[]) { r.acquired++; r.acquiredBytes += size; return acquire.call(this, size, ...a); };
  try { return { out: fn(), ...r }; } finally { dev.createBuffer = create; bm.acquireBuffer = acquire; }
}

test("fused AdamW: parameters and moments match the composite over steps (decay, clip on/off, gradScale 2^-k); same bits twice", gpu, async () => {
  const sets = ["a", "b", "c"].map((tag) => makeVars(7, 20000, 1, tag));
  const opts = sets.map((vs) => new AdamW(vs, { lr: 0.01, weightDecay: 0.1, betas: [0.9, 0.95], eps: 1e-8 }));
  const n = opts[0]!.numel;
  const muls: [number, number][] = [[1, 1], [2 ** -3, 1], [2 ** -7, 0.37], [1, 0.05], [2 ** -1, 1]];
  muls.forEach(([gs, clip], k) => {
    const g = tf.randomNormal([n], 0, 3, "float32", 100 + k) as tf.Tensor1D;
    opts.forEach((o, i) => withFused(i < 2, () => o.stepFlat(g, 0.01 * (1 + k / 10), [gs, clip])));
    g.dispose();
  });
  const [f, f2, r] = await Promise.all(opts.map((o) => o.stateDict()));
  for (const key of ["expAvg", "expAvgSq"] as const) {
    const e = await relErr(tf.tensor1d(f![key]), tf.tensor1d(r![key]));
    console.error(`fused AdamW, 5 steps: ${key} relative error ${e.toExponential(2)}`);
    assert.ok(e <= 1e-6, `${key}: relative error ${e.toExponential(2)}`);
    assert.deepEqual(f2![key], f![key], `${key}: same bits twice`);
  }
  const [pf, pf2, pr] = sets.map(flat);
  const e = await relErr(pf!, pr!);
  console.error(`fused AdamW, 5 steps: params relative error ${e.toExponential(2)}`);
  assert.ok(e <= 1e-6, `params: relative error ${e.toExponential(2)}`);
  assert.deepEqual(await pf2!.data(), await pf!.data());
  tf.dispose([pf!, pf2!, pr!, ...sets.flat()]);
  opts.forEach((o) => o.dispose());
});

test("fused gradient norm: matches the composite, fixed order (same bits twice), odd sizes", gpu, async () => {
  for (const n of [1, 255, 4097, 300001]) {
    const g = tf.randomNormal([n], 0, 2, "float32", n) as tf.Tensor1D;
    for (const gs of [1, 2 ** -5]) {
      const a = fusedGradNorm(g, gs), b = fusedGradNorm(g, gs);
      const ref = tf.tidy(() => g.mul(gs).square().sum().sqrt().reshape([1]));
      const e = await relErr(a, ref);
      assert.ok(e <= 1e-5, `n ${n} gradScale ${gs}: relative error ${e.toExponential(2)}`);
      assert.deepEqual(await b.data(), await a.data());
      tf.dispose([a, b, ref]);
    }
    g.dispose();
  }
});

test("a 50-variable AdamW step: dispatches and buffers created, fused against composite; tensor count flat", gpu, async () => {
  const vars = makeVars(50, 2_000_000, 3);
  const opt = new AdamW(vars, { lr: 1e-3, weightDecay: 0.01 });
  const g = tf.randomNormal([opt.numel], 0, 1, "float32", 9) as tf.Tensor1D;
  const step = (fused: boolean) => withFused(fused, () => buffers(() => dispatches(() => opt.stepFlat(g, 1e-3, [2 ** -4, 0.5]))));
  const cold = { f: step(true), r: step(false) }; // the first of each: pipelines compiled, the free pool primed
  await opt.stateDict();
  const before = tf.memory().numTensors;
  const f = step(true), r = step(false);
  assert.equal(tf.memory().numTensors, before, "no tensor left behind");
  const mb = (b: number) => (b / 2 ** 20).toFixed(1);
  const say = (x: typeof f, c: typeof f) => `${x.out.n} dispatches, ${x.acquired} buffers asked for (${mb(x.acquiredBytes)} MiB), ` +
    `${x.created} created (${mb(x.createdBytes)} MiB; first step ${c.created}, ${mb(c.createdBytes)} MiB)`;
  console.error(`AdamW step, 50 variables, ${opt.numel} values (${mb(4 * opt.numel)} MiB):\n  composite ${say(r, cold.r)}\n  fused     ${say(f, cold.f)}`);
  assert.ok(f.out.n < r.out.n, `dispatches: fused ${f.out.n}, composite ${r.out.n}`);
  assert.ok(f.acquiredBytes < r.acquiredBytes, `bytes of buffers asked for: fused ${f.acquiredBytes}, composite ${r.acquiredBytes}`);
  tf.dispose([g, ...vars]);
  opt.dispose();
});

test("the one-rank on-device step: fused norm and update agree with the composite (clip active, gradScale 2^-3)", gpu, async () => {
  const cfg = loadConfig({ configName: "ppo_trainer", overrides: ["actor_rollout_ref.actor.optim.lr=0.1"] });
  // not withFused: it turns the switch back on when the async function returns its promise
  const run = async (fused: boolean) => { setFusedLayers(fused); try { return await runSteps(); } finally { setFusedLayers(true); } };
  const runSteps = async () => {
    const before = tf.memory().numTensors;
    const w = tf.variable(tf.tensor1d([1, -2, 3, 0.5]), true), u = tf.variable(tf.tensor2d([[0.3, -0.1], [2, 1]]), true);
    const opt = new DataParallelOptimizer([w, u], new ConfigView(cfg, "actor_rollout_ref.actor.optim"), 10, Collective.single(), 1.0, { onDevice: true });
    const norms: number[] = [];
    for (const scale of [3, 0.01, 2]) {
      const g = tf.variableGrads(() => w.square().sum().add(u.mul(w.slice(0, 2).reshape([1, 2])).sum()).mul(tf.scalar(scale)) as tf.Scalar, [w, u]);
      opt.accumulate(g.grads);
      tf.dispose([g.value, ...Object.values(g.grads)]);
      norms.push((await opt.step([], 2 ** -3)).gradNorm);
    }
    const out = [...(await w.data()), ...(await u.data())];
    opt.dispose(); w.dispose(); u.dispose();
    return { norms, out, tensors: tf.memory().numTensors - before };
  };
  await run(true); // first use: whatever tfjs keeps for good
  const r = await run(false), f = await run(true);
  r.norms.forEach((n, i) => assert.ok(Math.abs(n - f.norms[i]!) <= 1e-6 * n, `norm ${i}: ${n} vs ${f.norms[i]}`));
  r.out.forEach((x, i) => assert.ok(Math.abs(x - f.out[i]!) <= 1e-6 * Math.max(1, Math.abs(x)), `weight ${i}: ${x} vs ${f.out[i]}`));
  // (the two tensors w and u were made from stay registered, in both)
  assert.equal(f.tensors, r.tensors, "tensors left behind: fused as many as composite");
});

test("the on-device clip: the step recorded before its norm is read matches the host's clip, and a non-finite norm skips it on the device", gpu, async () => {
  const cfg = loadConfig({ configName: "ppo_trainer", overrides: ["actor_rollout_ref.actor.optim.lr=0.1"] });
  // gradient scales per step: clip active (norm above 1), inactive, a NaN (skipped), active again
  const scales = [3, 0.01, NaN, 2];
  const run = async (deviceClip: boolean) => {
    const prev = process.env.VERL_DEVICE_CLIP;
    process.env.VERL_DEVICE_CLIP = deviceClip ? "1" : "0";
    const before = tf.memory().numTensors;
    const w = tf.variable(tf.tensor1d([1, -2, 3, 0.5]), true), u = tf.variable(tf.tensor2d([[0.3, -0.1], [2, 1]]), true);
    const opt = new DataParallelOptimizer([w, u], new ConfigView(cfg, "actor_rollout_ref.actor.optim"), 10, Collective.single(), 1.0, { onDevice: true });
    const steps: { norm: number; skipped: boolean; scalars: number[]; weights: number[] }[] = [];
    try {
      for (const scale of scales) {
        const g = tf.variableGrads(() => w.square().sum().add(u.mul(w.slice(0, 2).reshape([1, 2])).sum()).mul(tf.scalar(scale)) as tf.Scalar, [w, u]);
        opt.accumulate(g.grads);
        tf.dispose([g.value, ...Object.values(g.grads)]);
        // the scalars come through the reader the actor passes
        const r = await opt.step(async () => [scale, 2 * scale], 2 ** -3);
        steps.push({ norm: r.gradNorm, skipped: r.skipped, scalars: Array.from(r.scalars), weights: [...(await w.data()), ...(await u.data())] });
      }
    } finally {
      opt.dispose(); w.dispose(); u.dispose();
      if (prev === undefined) delete process.env.VERL_DEVICE_CLIP; else process.env.VERL_DEVICE_CLIP = prev;
    }
    return { steps, tensors: tf.memory().numTensors - before };
  };
  await run(true); // first use: pipelines compiled
  const host = await run(false), device = await run(true);
  assert.deepEqual(device.steps.map((s) => s.skipped), [false, false, true, false]);
  assert.deepEqual(host.steps.map((s) => s.skipped), [false, false, true, false]);
  device.steps.forEach((s, i) => {
    assert.deepEqual(s.scalars, host.steps[i]!.scalars, `step ${i}: scalars`);
    if (!s.skipped) assert.equal(s.norm, host.steps[i]!.norm, `step ${i}: the same norm kernel`);
    // the clip factor is formed in f32 on the device, in f64 on the host: an ulp apart at most
    s.weights.forEach((x, j) => assert.ok(Math.abs(x - host.steps[i]!.weights[j]!) <= 1e-6 * Math.max(1, Math.abs(x)), `step ${i} weight ${j}: ${x} vs ${host.steps[i]!.weights[j]}`));
  });
  // the skipped step left every weight as it was, and the step after it used the same bias correction as the host's
  assert.deepEqual(device.steps[2]!.weights, device.steps[1]!.weights, "a skipped step changes no weight");
  assert.equal(device.tensors, host.tensors, "tensors left behind: as many as the host-clip step");
});

test("the optimizer's flat vectors by buffer copies: split and concatenation the same bits as tf.split and tf.concat, no dispatch; AdamW the same bits", gpu, async () => {
  const sizes = [5, 0, 4096, 1, 300001, 7, 64];
  const total = sizes.reduce((a, b) => a + b, 0);
  const flatT = tf.randomNormal([total], 0, 1, "float32", 77) as tf.Tensor1D;
  const before = tf.memory().numTensors;
  const ref = tf.split(flatT, sizes) as tf.Tensor1D[];
  const counted = dispatches(() => splitFlat(flatT, sizes));
  assert.equal(counted.n, 0, "buffer copies, no dispatch");
  const pieces = counted.out;
  // the source freed at once and new work of its size recorded before any submit: the copies are
  // encoded in order with tfjs's own commands, so the pieces still hold the source's values
  const src2 = tf.tidy(() => flatT.mul(2));
  flatT.dispose();
  const reuse = tf.tidy(() => tf.fill([total], 9, "float32").add(src2));
  for (const [i, p] of pieces.entries()) {
    assert.deepEqual(p.shape, [sizes[i]!]);
    assert.deepEqual(await p.data(), await ref[i]!.data(), `piece ${i}`);
  }
  // concatenation: shapes of all kinds, an empty one, a tensor still on the host, and a view (reshape) of another
  const parts = [tf.randomNormal([3, 5], 0, 1, "float32", 3), tf.zeros([0]), tf.tensor1d([1.5, -2, 7]), tf.randomNormal([2, 2, 300], 0, 1, "float32", 4)];
  parts.push(parts[0]!.reshape([15]));
  const cat = dispatches(() => concatFlat(parts));
  assert.equal(cat.n, 0, "concatenation: buffer copies, no dispatch");
  const refCat = tf.tidy(() => tf.concat(parts.map((p) => p.reshape([-1]))));
  assert.deepEqual(await cat.out.data(), await refCat.data(), "concatenation: the same bits");
  tf.dispose([...pieces, ...ref, src2, reuse, ...parts, cat.out, refCat]);
  assert.equal(tf.memory().numTensors, before - 1, "no tensor left behind (the source was disposed)");
  // the AdamW step with and without it: the same bits
  const steps = async (copies: boolean) => {
    const prev = process.env.VERL_FLAT_BY_COPIES;
    process.env.VERL_FLAT_BY_COPIES = copies ? "1" : "0";
    try {
      const vs = makeVars(9, 30000, 5, copies ? "c" : "s"), opt = new AdamW(vs, { lr: 0.01, weightDecay: 0.1 });
      for (let k = 0; k < 3; k++) {
        const g = tf.randomNormal([opt.numel], 0, 1, "float32", 40 + k) as tf.Tensor1D;
        opt.stepFlat(g, 0.01, [1, 0.5]);
        g.dispose();
      }
      const out = await flat(vs).data();
      tf.dispose(vs);
      opt.dispose();
      return out;
    } finally {
      if (prev === undefined) delete process.env.VERL_FLAT_BY_COPIES; else process.env.VERL_FLAT_BY_COPIES = prev;
    }
  };
  assert.deepEqual(await steps(true), await steps(false), "AdamW's parameters: the same bits");
});
