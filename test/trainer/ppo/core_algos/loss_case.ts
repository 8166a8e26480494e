// The shared policy-loss test case and the check of a loss against its float64
// reference: value, metrics, gradient by finite differences, no gradient on masked tokens.
import assert from "node:assert/strict";
import * as tf from "@tensorflow/tfjs";
import { getPolicyLoss, keepMetrics, readMetrics } from "../../../../src/trainer/ppo/core_algos/index.js";
import type { ActorLossConfig, LossMetrics, PolicyLossArgs } from "../../../../src/trainer/ppo/core_algos/index.js";
import { close, closeAll, finiteDiff, randMat, t2, type Mat } from "../helpers.js";
import {
  cispoRef, geoMeanRef, gpgRef, gspoRef, klCovRef, sapoRef, vanillaRef, type LossCase, type RefOut,
} from "./reference_losses.js";

// Four rows: positive, negative and mixed advantages, a masked middle token, and an
// empty response (row 3). Row 1 token 2 has ratio e^1.5 > clip_ratio_c with A < 0.
const old = randMat(4, 5, 11, -2.5, -0.2);
const delta = randMat(4, 5, 12, -0.45, 0.45);
delta[1]![2] = 1.5;
delta[0]![1] = 0.4; // A > 0, ratio above 1 + ε_high: clipped
delta[2]![3] = -0.4; // A < 0, ratio below 1 − ε_low: clipped
export const CASE: LossCase = {
  old,
  logp: old.map((r, i) => r.map((x, t) => x + delta[i]![t]!)),
  adv: [[1.2, 0.7, 1.5, 0.3, 0.9], [-0.8, -0.8, -0.8, -0.8, -0.8], [0.5, -1.0, 2.0, -0.3, 0.4], [0.6, 0.6, 0.6, 0.6, 0.6]],
  mask: [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 1, 1, 0], [0, 0, 0, 0, 0]],
};
export const CONFIG: ActorLossConfig = { clip_ratio: 0.2, clip_ratio_low: 0.2, clip_ratio_high: 0.28, clip_ratio_c: 3.0, tau_pos: 1.0, tau_neg: 1.05 };

export function args(c: LossCase, extra: Partial<PolicyLossArgs> = {}): PolicyLossArgs {
  return {
    oldLogProb: t2(c.old), logProb: t2(c.logp), advantages: t2(c.adv), responseMask: t2(c.mask),
    rolloutIsWeights: c.w ? t2(c.w) : null, config: CONFIG, ...extra,
  };
}

export async function evaluate(name: string, a: PolicyLossArgs): Promise<{ loss: number; grad: number[]; metrics: Record<string, number> }> {
  const lp = tf.variable(a.logProb as tf.Tensor2D);
  let kept: LossMetrics = {};
  const { value, grads } = tf.variableGrads(() => {
    const out = getPolicyLoss(name)({ ...a, logProb: lp });
    kept = keepMetrics(out.metrics);
    return out.pgLoss;
  }, [lp]);
  const res = { loss: value.dataSync()[0]!, grad: Array.from(Object.values(grads)[0]!.dataSync()), metrics: await readMetrics(kept) };
  tf.dispose([value, ...Object.values(grads)]);
  lp.dispose();
  return res;
}

export async function checkAgainst(name: string, ref: (logp: Mat) => RefOut, a: PolicyLossArgs = args(CASE), c: LossCase = CASE) {
  const got = await evaluate(name, a);
  const expected = ref(c.logp);
  close(got.loss, expected.loss, 2e-5, `${name} loss`);
  for (const [k, v] of Object.entries(expected.metrics)) close(got.metrics[k]!, v, 2e-5, `${name} ${k}`);
  assert.ok(got.grad.every(Number.isFinite), `${name}: gradient must be finite`);
  const fd = finiteDiff((x) => ref(x).loss, c.logp, 1e-6).flat();
  closeAll(got.grad, fd, 1e-4, `${name} gradient vs finite difference`);
  // Masked positions never receive gradient.
  c.mask.flat().forEach((m, k) => { if (m === 0) assert.equal(got.grad[k]! + 0, 0, `${name}: gradient at masked position ${k}`); });
  return got;
}


/** Each built-in loss with its reference, on CASE with default options. */
export const LOSS_REFERENCES: [string, (x: Mat) => RefOut, Partial<PolicyLossArgs>][] = [
  ["vanilla", (x) => vanillaRef({ ...CASE, logp: x }, 0.2, 0.28, 3, "seq-mean-token-mean"), { lossAggMode: "seq-mean-token-mean" }],
  ["gspo", (x) => gspoRef({ ...CASE, logp: x }, 0.2, 0.28, CASE.logp), {}],
  ["sapo", (x) => sapoRef({ ...CASE, logp: x }, 1.0, 1.05), {}],
  ["gpg", (x) => gpgRef({ ...CASE, logp: x }, "token-mean"), {}],
  ["cispo", (x) => cispoRef({ ...CASE, logp: x }, 0.2, 0.28, "token-mean", CASE.logp), {}],
  ["geo_mean", (x) => geoMeanRef({ ...CASE, logp: x }, 0.2, 0.28), {}],
  ["kl_cov", (x) => klCovRef({ ...CASE, logp: x }, 0.25, 0.7, "token-mean", CASE.logp), { config: { ...CONFIG, policy_loss: { kl_cov_ratio: 0.25, ppo_kl_coef: 0.7 } } }],
];
