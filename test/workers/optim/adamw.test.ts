import { test } from "node:test";
import assert from "node:assert/strict";
import * as tf from "@tensorflow/tfjs";
import { initBackend } from "../../../src/engine/backend.js";
import { AdamW } from "../../../src/engine/optim/adamw.js";
import { clipByGlobalNorm, FlatGradAccumulator, globalNorm } from "../../../src/engine/optim/grad_utils.js";
import { LrScheduler } from "../../../src/engine/optim/lr_scheduler.js";
import { loadConfig } from "../../../src/config/index.js";
import { Collective } from "../../../src/single_controller/collective.js";
import { ConfigView } from "../../../src/workers/config_view.js";
import { DataParallelOptimizer } from "../../../src/workers/dp_optimizer.js";

// torch.optim.AdamW, written out per element in float64.
function referenceAdamW(p: number[], grads: number[][], lr: number, b1: number, b2: number, eps: number, wd: number): number[] {
  const m = p.map(() => 0), v = p.map(() => 0), x = [...p];
  grads.forEach((g, k) => {
    const t = k + 1;
    for (let i = 0; i < x.length; i++) {
      x[i] = x[i]! * (1 - lr * wd);
      m[i] = b1 * m[i]! + (1 - b1) * g[i]!;
      v[i] = b2 * v[i]! + (1 - b2) * g[i]! * g[i]!;
      const denom = Math.sqrt(v[i]!) / Math.sqrt(1 - b2 ** t) + eps;
      x[i] = x[i]! - (lr / (1 - b1 ** t)) * (m[i]! / denom);
    }
  });
  return x;
}

test("AdamW matches torch's update rule over several steps, across two variables", async () => {
  await initBackend("cpu");
  const a = tf.variable(tf.tensor2d([[0.5, -1.0], [2.0, 0.25]]), true, "opt_test_a");
  const b = tf.variable(tf.tensor1d([0.1, -0.3, 0.7]), true, "opt_test_b");
  const opt = new AdamW([a, b], { lr: 0.01, betas: [0.9, 0.95], eps: 1e-8, weightDecay: 0.1 });
  const grads = [
    [0.3, -0.2, 0.05, 1.5, -0.4, 0.0, 2.0],
    [0.1, 0.1, -0.3, 0.2, 0.4, -0.01, -1.0],
    [-0.5, 0.25, 0.0, 0.3, 0.0, 0.02, 0.5],
  ];
  for (const g of grads) opt.stepFlat(Float32Array.from(g));
  const want = referenceAdamW([0.5, -1.0, 2.0, 0.25, 0.1, -0.3, 0.7], grads, 0.01, 0.9, 0.95, 1e-8, 0.1);
  const got = [...a.dataSync(), ...b.dataSync()];
  got.forEach((x, i) => assert.ok(Math.abs(x - want[i]!) < 1e-6, `param ${i}: ${x} vs ${want[i]}`));
  assert.equal(opt.step, 3);
  opt.dispose(); a.dispose(); b.dispose();
});

test("AdamW state round-trips: a restored optimizer continues identically", async () => {
  await initBackend("cpu");
  const mk = () => tf.variable(tf.tensor1d([1, 2, 3, 4]), true);
  const x1 = mk(), x2 = mk();
  const o1 = new AdamW([x1], { lr: 0.1, weightDecay: 0.01 });
  o1.stepFlat(Float32Array.from([1, -1, 0.5, 0]));
  o1.stepFlat(Float32Array.from([0.2, 0.1, -0.5, 3]));
  const saved = await o1.stateDict();
  x2.assign(x1);
  const o2 = new AdamW([x2], { lr: 0.1, weightDecay: 0.01 });
  o2.loadStateDict(saved);
  const g = Float32Array.from([0.3, 0.3, -0.1, 0.2]);
  o1.stepFlat(g); o2.stepFlat(g);
  assert.deepEqual([...x1.dataSync()], [...x2.dataSync()]);
  const wrong = new AdamW([tf.variable(tf.zeros([3]))], { lr: 0.1 });
  assert.throws(() => wrong.loadStateDict(saved), /saved state is for 1 variables \(4 values\)/);
  assert.throws(() => o1.stepFlat(new Float32Array(3)), /gradient has 3 elements, parameters have 4/);
});

test("optimizer steps keep the live tensor count flat", async () => {
  await initBackend("cpu");
  const w = tf.variable(tf.randomNormal([8, 8], 0, 1, "float32", 1));
  const opt = new AdamW([w], { lr: 1e-3, weightDecay: 0.01 });
  const acc = new FlatGradAccumulator([w]);
  const step = async () => {
    for (let k = 0; k < 2; k++) {
      const { grads, value } = tf.variableGrads(() => w.square().sum() as tf.Scalar, [w]);
      value.dispose();
      acc.add(grads);
      tf.dispose(grads);
    }
    const flat = await acc.take();
    clipByGlobalNorm(flat, 1.0);
    opt.stepFlat(flat);
  };
  await step();
  const before = tf.memory().numTensors;
  for (let i = 0; i < 5; i++) await step();
  assert.equal(tf.memory().numTensors, before);
});

test("global-norm clipping follows torch (coef = max/(norm+1e-6)) and leaves non-finite gradients alone", () => {
  const g = Float32Array.from([3, 4]);
  assert.equal(clipByGlobalNorm(g, 1), 5);
  assert.ok(Math.abs(g[0]! - 3 / (5 + 1e-6)) < 1e-7 && Math.abs(g[1]! - 4 / (5 + 1e-6)) < 1e-7);
  const small = Float32Array.from([0.3, 0.4]);
  clipByGlobalNorm(small, 1);
  assert.deepEqual([...small], [Math.fround(0.3), Math.fround(0.4)]);
  const bad = Float32Array.from([NaN, 1]);
  assert.ok(Number.isNaN(clipByGlobalNorm(bad, 1)));
  assert.equal(bad[1], 1);
  assert.equal(globalNorm(Float32Array.from([Infinity, 0])), Infinity);
});

test("LrScheduler counts steps and restores", () => {
  const s = new LrScheduler(0.1, (k) => Math.min(1, (k + 1) / 4));
  assert.equal(s.lr, 0.025);
  s.step(); s.step();
  assert.ok(Math.abs(s.lr - 0.075) < 1e-12);
  const r = new LrScheduler(0.1, (k) => Math.min(1, (k + 1) / 4));
  r.loadStateDict(s.stateDict());
  assert.equal(r.lr, s.lr);
});

test("the data-parallel step skips a non-finite gradient and follows the warmup schedule", async () => {
  await initBackend("cpu");
  const cfg = loadConfig({ configName: "ppo_trainer", overrides: ["actor_rollout_ref.actor.optim.lr=0.1", "actor_rollout_ref.actor.optim.lr_warmup_steps=2"] });
  const w = tf.variable(tf.tensor1d([1, 2, 3]), true);
  const opt = new DataParallelOptimizer([w], new ConfigView(cfg, "actor_rollout_ref.actor.optim"), 10, Collective.single(), 1.0);
  const lrs: number[] = [];
  for (let i = 0; i < 3; i++) { lrs.push(opt.lr); opt.scheduler.step(); }
  assert.deepEqual(lrs, [0, 0.05, 0.1]);
  const bad = tf.variableGrads(() => w.mul(tf.scalar(NaN)).sum() as tf.Scalar, [w]);
  opt.accumulate(bad.grads);
  tf.dispose([bad.value, ...Object.values(bad.grads)]);
  const res = await opt.step([2.5]);
  assert.ok(res.skipped && Number.isNaN(res.gradNorm));
  assert.deepEqual([...w.dataSync()], [1, 2, 3], "a skipped step leaves the weights alone");
  assert.equal(res.scalars[0], 2.5, "ride-along scalars come back summed (one rank: as they were)");
  assert.equal(opt.optimizer.step, 0);
  opt.dispose(); w.dispose();
});

test("the on-device step (one rank) gives the host step's norm, clip, skip and weights", async () => {
  await initBackend("cpu");
  const cfg = loadConfig({ configName: "ppo_trainer", overrides: ["actor_rollout_ref.actor.optim.lr=0.1"] });
  const run = async (onDevice: boolean) => {
    const before = tf.memory().numTensors;
    const w = tf.variable(tf.tensor1d([1, -2, 3, 0.5]), true), u = tf.variable(tf.tensor2d([[0.3, -0.1], [2, 1]]), true);
    const opt = new DataParallelOptimizer([w, u], new ConfigView(cfg, "actor_rollout_ref.actor.optim"), 10, Collective.single(), 1.0, { onDevice });
    const norms: number[] = [], skipped: boolean[] = [];
    for (const scale of [3, 0.01, NaN, 2]) {
      for (let micro = 0; micro < 2; micro++) {
        const g = tf.variableGrads(() => w.square().sum().add(u.mul(w.slice(0, 2).reshape([1, 2])).sum()).mul(tf.scalar(scale * (micro + 1))) as tf.Scalar, [w, u]);
        opt.accumulate(g.grads);
        tf.dispose([g.value, ...Object.values(g.grads)]);
      }
      const res = await opt.step([1.5]);
      norms.push(res.gradNorm); skipped.push(res.skipped);
      assert.equal(res.scalars[0], 1.5);
    }
    const out = [...w.dataSync(), ...u.dataSync()];
    opt.dispose(); w.dispose(); u.dispose();
    return { norms, skipped, out, tensors: tf.memory().numTensors - before };
  };
  const host = await run(false), device = await run(true);
  assert.deepEqual(device.skipped, [false, false, true, false]);
  assert.deepEqual(device.skipped, host.skipped);
  host.norms.forEach((n, i) => assert.ok(Number.isNaN(n) ? Number.isNaN(device.norms[i]!) : Math.abs(n - device.norms[i]!) < 1e-5 * n, `norm ${i}: ${n} vs ${device.norms[i]}`));
  host.out.forEach((x, i) => assert.ok(Math.abs(x - device.out[i]!) < 1e-6, `weight ${i}: ${x} vs ${device.out[i]}`));
  assert.equal(device.tensors, host.tensors, "no tensor left behind");
});
