// The fused PPO, KL and value-loss kernels (engine/webgpu_fused_ppo.ts, webgpu_fused_value.ts) and masked reductions
// (engine/webgpu_fused_masked.ts) on the webgpu backend: the vanilla loss against its float64
// reference and finite differences in every aggregation mode, the fused paths against the
// composites on the same backend (ties, the dual clip, |Δ| > 20, IS weights, NaN outside the mask),
// dispatch counts, determinism and tensor counts. Runs only where a WebGPU adapter exists (the
// H200, or this CPU machine through Dawn's OpenGL backend on llvmpipe: docs/gpu.md); skips elsewhere.
import { test } from "node:test";
import assert from "node:assert/strict";
import * as tf from "@tensorflow/tfjs";
import { dispatches, relErr, webgpuOrReason, withFused } from "./webgpu_adapter.js";
import { fusedLossFor } from "../../src/engine/webgpu_fused_ppo.js";
import { fusedMaskedFor } from "../../src/engine/webgpu_fused_masked.js";
import { getPolicyLoss, keepMetrics, readMetrics } from "../../src/trainer/ppo/core_algos/index.js";
import type { LossMetrics, PolicyLossArgs } from "../../src/trainer/ppo/core_algos/index.js";
import { maskedMean, maskedSum } from "../../src/trainer/ppo/core_algos/functional.js";
import { klPenalty } from "../../src/trainer/ppo/core_algos/kl.js";
import { computeValueLoss } from "../../src/trainer/ppo/core_algos/value_loss.js";
import { vanillaRef } from "../trainer/ppo/core_algos/reference_losses.js";
import { CASE, CONFIG, args } from "../trainer/ppo/core_algos/loss_case.js";
import { close, closeAll, finiteDiff, t2 } from "../trainer/ppo/helpers.js";
import { Rng } from "../../src/utils/rng.js";

const skip = await webgpuOrReason();
const gpu = { skip: skip || false };
const MODES = ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"];

test("vanilla PPO with the fused kernels: loss, metrics and gradient against the float64 reference in every mode, IS weights too", gpu, async () => {
  const w = CASE.adv.map((r, i) => r.map((_, t) => 0.5 + ((i * 5 + t) % 7) / 7));
  for (const [mode, weights] of [...MODES.map((m) => [m, undefined] as const), ["token-mean", w] as const]) {
    const c = { ...CASE, w: weights }, a = args(c);
    const tensors = { oldLogProb: a.oldLogProb, logProb: a.logProb, advantages: a.advantages, responseMask: a.responseMask, w: a.rolloutIsWeights ?? t2(CASE.mask) };
    withFused(true, () => assert.equal(fusedLossFor(a.logProb, a.oldLogProb, a.advantages, a.responseMask), true));
    const got = await vanilla(tensors, true, mode, !!weights);
    const ref = vanillaRef({ ...c, logp: CASE.logp }, 0.2, 0.28, 3, mode);
    const what = `${mode}${weights ? " weighted" : ""}`;
    close((await got.loss.data())[0]!, ref.loss, 2e-5, `${what} loss`);
    for (const [k, v] of Object.entries(ref.metrics)) close(got.metrics[k]!, v, 2e-5, `${what} ${k}`);
    const grad = Array.from(await got.grad.data());
    closeAll(grad, finiteDiff((x) => vanillaRef({ ...c, logp: x }, 0.2, 0.28, 3, mode).loss, CASE.logp, 1e-6).flat(), 1e-4, `${what} gradient vs finite difference`);
    assert.equal(grad[1 * 5 + 2], 0, `${what}: the dual-clipped token has no gradient`);
    CASE.mask.flat().forEach((m, k) => { if (m === 0) assert.equal(grad[k]! + 0, 0, `${what}: gradient at masked position ${k}`); });
    tf.dispose([got.loss, got.grad, ...Object.values(tensors)]);
  }
});

/** A [B, T] case with every branch: ties (Δ = 0, A = 0), both clips, the dual clip, |Δ| > 20, an empty row, IS weights. */
function bigCase(B: number, T: number, seed: number) {
  const rng = new Rng(seed);
  const n = B * T, old = new Float32Array(n), lp = new Float32Array(n), adv = new Float32Array(n), mask = new Float32Array(n), w = new Float32Array(n);
  for (let i = 0; i < n; i++) {
    old[i] = -0.1 - 3 * rng.random();
    const kind = i % 11;
    const delta = kind === 0 ? 0 : kind === 1 ? 25 : kind === 2 ? -30 : kind === 3 ? 1.5 : (rng.random() - 0.5) * 0.8;
    lp[i] = old[i]! + delta;
    adv[i] = kind === 4 ? 0 : Math.floor(i / T) % 3 === 1 ? -(0.2 + rng.random()) : rng.random() * 2 - 0.7;
    mask[i] = Math.floor(i / T) === B - 1 ? 0 : (i % T) < T - (i % 5) ? 1 : 0;
    w[i] = 0.5 + rng.random();
  }
  const t = (a: Float32Array) => tf.tensor2d(a, [B, T]);
  return { oldLogProb: t(old), logProb: t(lp), advantages: t(adv), responseMask: t(mask), w: t(w) };
}

/** Loss, metrics and gradient of the vanilla loss, fused or composite, with the dispatches they took. */
async function vanilla(c: Record<"oldLogProb" | "logProb" | "advantages" | "responseMask" | "w", tf.Tensor>, fused: boolean, mode: string, weighted: boolean) {
  const lp = tf.variable(c.logProb);
  let kept: LossMetrics = {};
  const a: PolicyLossArgs = { oldLogProb: c.oldLogProb, logProb: lp, advantages: c.advantages, responseMask: c.responseMask, rolloutIsWeights: weighted ? c.w : null, config: CONFIG, lossAggMode: mode };
  const { out, n } = withFused(fused, () => dispatches(() => tf.variableGrads(() => {
    const o = getPolicyLoss("vanilla")({ ...a, logProb: lp });
    kept = keepMetrics(o.metrics);
    return o.pgLoss;
  }, [lp])));
  const grad = Object.values(out.grads)[0]!;
  const res = { loss: out.value, grad, metrics: await readMetrics(kept), n };
  lp.dispose();
  return res;
}

test("fused vanilla PPO against the composite on the same backend: every branch, every mode, weighted or not; fewer dispatches", gpu, async () => {
  const c = bigCase(24, 97, 5);
  let worst = 0;
  for (const mode of MODES) {
    for (const weighted of [false, true]) {
      const f = await vanilla(c, true, mode, weighted), r = await vanilla(c, false, mode, weighted);
      const what = `${mode}${weighted ? " weighted" : ""}`;
      const eLoss = await relErr(f.loss, r.loss), eGrad = await relErr(f.grad, r.grad);
      worst = Math.max(worst, eLoss, eGrad);
      assert.ok(eLoss <= 1e-5, `${what} loss: relative error ${eLoss.toExponential(2)}`);
      assert.ok(eGrad <= 1e-5, `${what} gradient: relative error ${eGrad.toExponential(2)}`);
      // where the composite's gradient is exactly zero (masked tokens, the clips, |Δ| > 20) the fused one is too
      const fg = await f.grad.data(), rg = await r.grad.data();
      rg.forEach((v, i) => { if (v === 0) assert.equal(fg[i]! + 0, 0, `${what}: gradient at ${i}`); });
      for (const [k, v] of Object.entries(r.metrics)) assert.ok(Math.abs(f.metrics[k]! - v) <= 1e-5 * Math.max(1, Math.abs(v)), `${what} ${k}: ${f.metrics[k]} vs ${v}`);
      assert.ok(f.metrics["actor/pg_clipfrac"]! > 0 && f.metrics["actor/pg_clipfrac_lower"]! > 0, "the case reaches both clips");
      assert.ok(f.n < r.n, `${what}: fused ${f.n} dispatches, composite ${r.n}`);
      if (mode === "token-mean") console.error(`vanilla PPO loss forward+backward (${what}): ${r.n} dispatches composite, ${f.n} fused`);
      tf.dispose([f.loss, f.grad, r.loss, r.grad]);
    }
  }
  console.error(`fused PPO against the composite: largest relative error ${worst.toExponential(2)}`);
  tf.dispose(Object.values(c));
});

test("fused vanilla PPO: same bits twice; no leaked tensors", gpu, async () => {
  const c = bigCase(8, 33, 9);
  const a = await vanilla(c, true, "token-mean", true), b = await vanilla(c, true, "token-mean", true);
  assert.deepEqual(await a.grad.data(), await b.grad.data());
  assert.deepEqual(await a.loss.data(), await b.loss.data());
  assert.deepEqual(a.metrics, b.metrics);
  tf.dispose([a.loss, a.grad, b.loss, b.grad]);
  const before = tf.memory().numTensors;
  for (let k = 0; k < 3; k++) {
    const s = await vanilla(c, true, "seq-mean-token-mean", false);
    tf.dispose([s.loss, s.grad]);
  }
  assert.equal(tf.memory().numTensors, before);
  tf.dispose(Object.values(c));
});

test("fused masked sum and mean: values and gradients equal the composite's; NaN outside the mask counts for nothing; one dispatch each way", gpu, async () => {
  for (const [B, T] of [[1, 1], [3, 7], [16, 300], [70, 1000]] as const) {
    const n = B * T, v = new Float32Array(n), m = new Int32Array(n);
    for (let i = 0; i < n; i++) {
      m[i] = (i * 7) % 5 === 0 ? 0 : 1;
      v[i] = m[i] ? Math.sin(i) * 3 : i % 2 ? NaN : Infinity;
    }
    if (n === 1) m[0] = 1, v[0] = 2.5;
    const values = tf.tensor2d(v, [B, T]), mask = tf.tensor2d(m, [B, T], "int32"), fm = tf.cast(mask, "float32");
    const c = tf.randomNormal([], 0, 1, "float32", 3);
    for (const [name, fn] of [["sum", maskedSum], ["mean", maskedMean]] as const) {
      const go = (fused: boolean) => withFused(fused, () => dispatches(() => tf.valueAndGrad((x: tf.Tensor) => tf.mul(fn(x, mask), c) as tf.Scalar)(values)));
      assert.equal(withFused(true, () => fusedMaskedFor(values, fm)), true);
      const f = go(true), r = go(false);
      // the value against float64 on the host, relative to Σ|v m| (the sums cancel: the two float32 orders differ by more than 1e-5 of the result)
      let exact = 0, scale = 0, count = 0;
      for (let i = 0; i < n; i++) if (m[i]) exact += v[i]!, scale += Math.abs(v[i]!), count++;
      const c0 = (await c.data())[0]!, den = name === "mean" ? count + 1e-8 : 1;
      const got = (await f.out.value.data())[0]!, e = Math.abs(got - (c0 * exact) / den) / (Math.abs(c0) * scale / den), g = await relErr(f.out.grad, r.out.grad);
      assert.ok(Number.isFinite(got), `${name} [${B}, ${T}]: finite`);
      assert.ok(e <= 1e-6 && g <= 1e-6, `${name} [${B}, ${T}]: value ${e.toExponential(2)}, gradient ${g.toExponential(2)}`);
      // the reduction and its gradient one dispatch each, the product with c and its gradient one each
      assert.equal(f.n, 4, `${name}: fused ${f.n} dispatches`);
      assert.ok(r.n > f.n, `${name}: composite ${r.n}`);
      if (n === 16 * 300) console.error(`masked ${name} forward+backward: ${r.n} dispatches composite, ${f.n} fused`);
      tf.dispose([f.out.value, f.out.grad, r.out.value, r.out.grad]);
    }
    // a partial reduction (along an axis) keeps the composite
    const row = withFused(true, () => dispatches(() => maskedSum(values, mask, -1)));
    assert.deepEqual(row.out.shape, [B]);
    tf.dispose([values, mask, fm, c, row.out]);
  }
});

test("fused KL penalties (k1, abs, k2, k3 and their aliases): values and gradients equal the composite's, clamps and ties included", gpu, async () => {
  const n = 40 * 53, lp = new Float32Array(n), ref = new Float32Array(n);
  for (let i = 0; i < n; i++) {
    ref[i] = -0.2 - ((i * 37) % 100) / 25;
    const kind = i % 9;
    // Δ = 0 (abs's tie), beyond k3's ±20 clamp, beyond its ±10 value clamp (Δ = -5: e^5 - 6), small
    const d = kind === 0 ? 0 : kind === 1 ? 30 : kind === 2 ? -25 : kind === 3 ? -5 : kind === 4 ? 3 : (((i * 13) % 17) - 8) / 20;
    lp[i] = ref[i]! + d;
  }
  const x = tf.tensor2d(lp, [40, 53]), r = tf.tensor2d(ref, [40, 53]), c = tf.randomNormal([40, 53], 0, 1, "float32", 4);
  for (const kind of ["kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3"]) {
    const go = (fused: boolean) => withFused(fused, () => dispatches(() => tf.valueAndGrad((v: tf.Tensor) => tf.sum(tf.mul(klPenalty(v, r, kind), c)) as tf.Scalar)(x)));
    const f = go(true), o = go(false);
    const fv = withFused(true, () => klPenalty(x, r, kind)), ov = withFused(false, () => klPenalty(x, r, kind));
    const e = await relErr(fv, ov), g = await relErr(f.out.grad, o.out.grad);
    assert.ok(e <= 1e-6 && g <= 1e-6, `${kind}: value ${e.toExponential(2)}, gradient ${g.toExponential(2)}`);
    const fg = await f.out.grad.data(), og = await o.out.grad.data();
    og.forEach((v, i) => { if (v === 0) assert.equal(fg[i]! + 0, 0, `${kind}: gradient at ${i} (Δ ${lp[i]! - ref[i]!})`); });
    assert.ok(kind === "kl" || kind === "k1" ? f.n === o.n : f.n < o.n, `${kind}: fused ${f.n} dispatches, composite ${o.n}`);
    if (kind === "low_var_kl") console.error(`low_var_kl forward+backward (times a constant, summed): ${o.n} dispatches composite, ${f.n} fused`);
    tf.dispose([f.out.value, f.out.grad, o.out.value, o.out.grad, fv, ov]);
  }
  // k1 is one subtraction either way; the straight-through kinds keep the composite
  const st = withFused(true, () => dispatches(() => klPenalty(x, r, "k3+")));
  assert.ok(st.n > 2, `k3+ ${st.n}`);
  tf.dispose([x, r, c, st.out]);
});

test("the critic's fused value loss: loss, gradient and vf_clipfrac equal the composite's in every mode (clip ties, v = V, v = R); fewer dispatches", gpu, async () => {
  const B = 19, T = 61, n = B * T, rng = new Rng(13);
  const v = new Float32Array(n), r = new Float32Array(n), vv = new Float32Array(n), m = new Float32Array(n);
  for (let i = 0; i < n; i++) {
    vv[i] = rng.random() * 4 - 2;
    const kind = i % 7;
    // inside the clip, outside on both sides, at V (no change), at R (zero error), far outside
    v[i] = kind === 0 ? vv[i]! : kind === 1 ? vv[i]! + 0.9 : kind === 2 ? vv[i]! - 0.9 : kind === 3 ? vv[i]! + 0.1 : kind === 5 ? vv[i]! - 5 : vv[i]! + (rng.random() - 0.5) * 0.6;
    r[i] = kind === 4 ? v[i]! : vv[i]! + (rng.random() - 0.5) * 2;
    m[i] = Math.floor(i / T) === B - 1 || (i % T) > T - 1 - (i % 6) ? 0 : 1;
  }
  const t = (a: Float32Array) => tf.tensor2d(a, [B, T]);
  const [vpreds, returns, values, responseMask] = [v, r, vv, m].map(t) as tf.Tensor2D[];
  for (const mode of MODES) {
    const go = (fused: boolean) => withFused(fused, () => dispatches(() => {
      let clip: tf.Scalar | undefined;
      const out = tf.valueAndGrad((x: tf.Tensor) => {
        const o = computeValueLoss({ vpreds: x, returns: returns!, values: values!, responseMask: responseMask!, cliprangeValue: 0.5, lossAggMode: mode });
        clip = tf.keep(o.vfClipfrac);
        return o.vfLoss;
      })(vpreds!);
      return { ...out, clip: clip! };
    }));
    const f = go(true), o = go(false);
    const e = await relErr(f.out.value, o.out.value), g = await relErr(f.out.grad, o.out.grad);
    assert.ok(e <= 1e-5 && g <= 1e-6, `${mode}: loss ${e.toExponential(2)}, gradient ${g.toExponential(2)}`);
    const fg = await f.out.grad.data(), og = await o.out.grad.data();
    og.forEach((x, i) => { if (x === 0) assert.equal(fg[i]! + 0, 0, `${mode}: gradient at ${i}`); });
    const fc = (await f.out.clip.data())[0]!, oc = (await o.out.clip.data())[0]!;
    assert.ok(Math.abs(fc - oc) <= 1e-6 && fc > 0, `${mode}: vf_clipfrac ${fc} against ${oc}`);
    assert.ok(f.n < o.n, `${mode}: fused ${f.n} dispatches, composite ${o.n}`);
    if (mode === "token-mean") console.error(`value loss forward+backward with vf_clipfrac (token-mean): ${o.n} dispatches composite, ${f.n} fused`);
    tf.dispose([f.out.value, f.out.grad, f.out.clip, o.out.value, o.out.grad, o.out.clip]);
  }
  tf.dispose([vpreds!, returns!, values!, responseMask!]);
});

test("off the webgpu backend, the fused PPO and masked paths are not taken", { skip: !skip ? "webgpu is the backend here" : false }, () => {
  const x = tf.zeros([2, 3]);
  assert.equal(fusedLossFor(x, x, x, x), false);
  assert.equal(fusedMaskedFor(x, x), false);
  x.dispose();
});
