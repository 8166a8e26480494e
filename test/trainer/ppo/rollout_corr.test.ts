import { test } from "node:test";
import assert from "node:assert/strict";
import { computeRolloutCorrection, parseRsThresholds, rolloutCorrectionConfig, applyRolloutCorrection } from "../../../src/trainer/ppo/rollout_corr.js";
import { DataProto } from "../../../src/protocol/data_proto.js";
import { tensor } from "../../../src/protocol/tensor.js";

// two responses of 3 slots, the last slot of row 1 is padding
const OLD = Float32Array.from([-1, -2, -0.5, -1, -1, 0]);
const ROLL = Float32Array.from([-1.5, -2, -0.2, -0.8, -1.1, 0]);
const MASK = [1, 1, 1, 1, 1, 0];
// log_ratio = old - rollout = [0.5, 0, -0.3, -0.2, 0.1, (pad)]
const off = { rolloutIs: null, rolloutIsThreshold: 2, rolloutIsBatchNormalize: false, rolloutRs: null, rolloutRsThreshold: null } as const;
const close = (a: number | undefined, b: number, what: string, tol = 1e-5) => assert.ok(a !== undefined && Math.abs(a - b) < tol, `${what}: ${a} vs ${b}`);

test("rollout correction: token-level truncated IS weights and their metrics, by hand", () => {
  const r = computeRolloutCorrection(OLD, ROLL, MASK, 2, 3, { ...off, rolloutIs: "token", rolloutIsThreshold: 1.5 });
  const w = [Math.exp(0.5), 1, Math.exp(-0.3), Math.exp(-0.2), Math.exp(0.1)];
  // e^0.5 = 1.6487 is truncated to 1.5; padding weighs 0
  const want = [1.5, 1, Math.exp(-0.3), Math.exp(-0.2), Math.exp(0.1), 0];
  want.forEach((x, i) => close(r.weights![i], x, `weight ${i}`));
  const m = r.metrics;
  close(m["rollout_corr/rollout_is_mean"], w.reduce((a, b) => a + b) / 5, "mean (before truncation)");
  close(m["rollout_corr/rollout_is_ratio_fraction_high"], 0.2, "fraction above 1.5");
  close(m["rollout_corr/rollout_is_ratio_fraction_low"], 0, "fraction below 1/1.5");
  close(m["rollout_corr/rollout_is_max"], Math.exp(0.5), "max");
  close(m["rollout_corr/rollout_is_min"], Math.exp(-0.3), "min");
  const c = [1.5, 1, Math.exp(-0.3), Math.exp(-0.2), Math.exp(0.1)], mu = c.reduce((a, b) => a + b) / 5;
  close(m["rollout_corr/rollout_is_std"], Math.sqrt(c.reduce((a, b) => a + b * b, 0) / 5 - mu * mu), "std of clamped weights");
  close(m["rollout_corr/rollout_is_eff_sample_size"], 1 / (c.reduce((a, b) => a + (b / mu) ** 2, 0) / 5), "ESS", 1e-4);
  close(m["rollout_corr/rollout_is_seq_mean"], ((w[0]! + w[1]! + w[2]!) / 3 + (w[3]! + w[4]!) / 2) / 2, "seq mean");
  assert.deepEqual(Array.from(r.responseMask), MASK, "no rejection configured");
});

test("rollout correction: sequence-level IS is the product of token ratios, batch-normalised on request", () => {
  const r = computeRolloutCorrection(OLD, ROLL, MASK, 2, 3, { ...off, rolloutIs: "sequence", rolloutIsThreshold: 2, rolloutIsBatchNormalize: true });
  const s0 = Math.exp(0.2), s1 = Math.exp(-0.1), norm = (s0 + s1) / 2;
  [s0, s0, s0, s1, s1, 0].forEach((x, i) => close(r.weights![i], x / norm, `weight ${i}`));
  close(r.metrics["rollout_corr/rollout_is_max"], s0, "max");
  close(r.metrics["rollout_corr/rollout_is_min"], s1, "min");
  close(r.metrics["rollout_corr/rollout_is_batch_norm_factor"], norm, "norm factor");
  close(r.metrics["rollout_corr/rollout_is_mean"], (3 * s0 + 2 * s1) / 5, "token mean of sequence weights");
});

test("rollout correction: token_k1 and seq_sum_k2 rejection masks and fractions, by hand", () => {
  // k1 = -log_ratio = [-0.5, 0, 0.3, 0.2, -0.1]; kept in [ln 0.9, ln 1.2] = [-0.105, 0.182]: tokens 1 and 4
  const a = computeRolloutCorrection(OLD, ROLL, MASK, 2, 3, { ...off, rolloutRs: "token_k1", rolloutRsThreshold: "0.9_1.2" });
  assert.deepEqual(Array.from(a.responseMask), [0, 1, 0, 0, 1, 0]);
  close(a.metrics["rollout_corr/rollout_rs_token_k1_masked_fraction"], 0.6, "token fraction");
  close(a.metrics["rollout_corr/rollout_rs_token_k1_seq_masked_fraction"], 1, "both rows lose a token");
  close(a.metrics["rollout_corr/rollout_rs_masked_fraction"], 0.6, "combined");
  close(a.metrics["rollout_corr/rollout_rs_token_k1_mean"], (-0.5 + 0 + 0.3 + 0.2 - 0.1) / 5, "k1 mean");
  close(a.metrics["rollout_corr/rollout_rs_token_k1_fraction_high"], 0.4, "above ln 1.2");
  close(a.metrics["rollout_corr/rollout_rs_token_k1_fraction_low"], 0.2, "below ln 0.9");
  // k2 = lr^2/2 summed per row: 0.17 and 0.025; upper 0.1 rejects row 0 only
  const b = computeRolloutCorrection(OLD, ROLL, MASK, 2, 3, { ...off, rolloutRs: "seq_sum_k2", rolloutRsThreshold: 0.1 });
  assert.deepEqual(Array.from(b.responseMask), [0, 0, 0, 1, 1, 0]);
  close(b.metrics["rollout_corr/rollout_rs_seq_sum_k2_max"], 0.17, "row max");
  close(b.metrics["rollout_corr/rollout_rs_seq_sum_k2_min"], 0.025, "row min");
  close(b.metrics["rollout_corr/rollout_rs_seq_masked_fraction"], 0.5, "one row of two");
  // both at once: every option must pass
  const c = computeRolloutCorrection(OLD, ROLL, MASK, 2, 3, { ...off, rolloutRs: "token_k1,seq_sum_k2", rolloutRsThreshold: "0.9_1.2,0.1" });
  assert.deepEqual(Array.from(c.responseMask), [0, 0, 0, 0, 1, 0]);
});

test("rollout correction: off-policy diagnostics, by hand", () => {
  const m = computeRolloutCorrection(OLD, ROLL, MASK, 2, 3, off).metrics;
  close(m["rollout_corr/kl"], -(0.5 + 0 - 0.3 - 0.2 + 0.1) / 5, "kl");
  close(m["rollout_corr/training_ppl"], (Math.exp(3.5 / 3) + Math.exp(1)) / 2, "training ppl");
  close(m["rollout_corr/rollout_ppl"], (Math.exp(3.7 / 3) + Math.exp(1.9 / 2)) / 2, "rollout ppl");
  close(m["rollout_corr/chi2_seq"], (Math.exp(0.4) + Math.exp(-0.2)) / 2 - 1, "chi2 seq");
  const lr = [0.5, 0, -0.3, -0.2, 0.1];
  close(m["rollout_corr/k3_kl"], lr.reduce((a, x) => a + Math.exp(x) - x - 1, 0) / 5, "k3");
  close(m["rollout_corr/chi2_token"], lr.reduce((a, x) => a + Math.exp(2 * x), 0) / 5 - 1, "chi2 token");
  close(m["rollout_corr/log_ppl_diff"], ((-3.7 / 3 + 3.5 / 3) + (-1.9 / 2 + 1)) / 2, "log ppl diff");
});

test("rollout correction: config errors name the key; the batch gets the mask and weights", () => {
  assert.throws(() => rolloutCorrectionConfig({ rollout_is: "tokens" }), /algorithm\.rollout_correction\.rollout_is must be null, token or sequence/);
  assert.throws(() => parseRsThresholds(["token_k2"], null), /rollout_rs_threshold must be set/);
  assert.throws(() => parseRsThresholds(["token_k2", "seq_max_k3"], "1,2,3"), /exactly 2/);
  assert.throws(() => parseRsThresholds(["token_k2"], "0.5_2"), /takes one upper bound/);
  assert.deepEqual(parseRsThresholds(["seq_mean_k1"], 2).get("seq_mean_k1"), { lower: 0.5, upper: 2 });
  assert.throws(() => computeRolloutCorrection(OLD, ROLL, MASK, 2, 3, { ...off, rolloutRs: "token_k4", rolloutRsThreshold: 1 }), /unknown option 'token_k4'/);
  const batch = new DataProto({
    old_log_probs: tensor(OLD, [2, 3], "float32"), rollout_log_probs: tensor(ROLL, [2, 3], "float32"), response_mask: tensor(Int32Array.from(MASK), [2, 3], "int32"),
  }, {}, {});
  const metrics = applyRolloutCorrection(batch, { rollout_is: "token", rollout_is_threshold: 2.0, rollout_rs: "seq_sum_k2", rollout_rs_threshold: 0.1 });
  assert.deepEqual(Array.from(batch.batch.response_mask!.data), [0, 0, 0, 1, 1, 0]);
  assert.deepEqual(batch.batch.rollout_is_weights!.shape, [2, 3]);
  assert.ok("rollout_corr/rollout_is_mean" in metrics && "rollout_corr/rollout_rs_seq_sum_k2_mean" in metrics && "rollout_corr/kl" in metrics);
  assert.deepEqual(applyRolloutCorrection(new DataProto({}, {}, {}), {}), {}, "no rollout_log_probs: nothing to do");
});
