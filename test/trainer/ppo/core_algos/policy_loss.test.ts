import { before, test } from "node:test";
import assert from "node:assert/strict";
import * as tf from "@tensorflow/tfjs";
import { getPolicyLoss } from "../../../../src/trainer/ppo/core_algos/index.js";
import type { ActorLossConfig } from "../../../../src/trainer/ppo/core_algos/index.js";
import { Rng } from "../../../../src/utils/rng.js";
import { close, cpu, randMat } from "../helpers.js";
import { cispoRef, geoMeanRef, gpgRef, gspoRef, klCovRef, sapoRef, topCovPositions, vanillaRef } from "./reference_losses.js";
import { CASE, CONFIG, args, checkAgainst, evaluate } from "./loss_case.js";

before(cpu);

test("vanilla: dual-clip PPO value, metrics and gradient in every aggregation mode", async () => {
  for (const mode of ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]) {
    const got = await checkAgainst("vanilla", (x) => vanillaRef({ ...CASE, logp: x }, 0.2, 0.28, 3, mode), args(CASE, { lossAggMode: mode }));
    // The dual clip holds the A<0 token with ratio e^1.5 at −A·c: zero gradient there.
    assert.equal(got.grad[1 * 5 + 2], 0, `${mode}: dual-clipped token must have no gradient`);
    assert.ok(got.metrics["actor/pg_clipfrac_lower"]! > 0);
    assert.ok(got.metrics["actor/pg_clipfrac"]! > 0);
  }
});

test("vanilla: rollout IS weights multiply the token losses; global batch info from config.global_batch_info", async () => {
  const w = randMat(4, 5, 21, 0.5, 1.5);
  await checkAgainst("vanilla", (x) => vanillaRef({ ...CASE, logp: x, w }, 0.2, 0.28, 3, "token-mean"), args({ ...CASE, w }), { ...CASE, w });
  const config = { ...CONFIG, global_batch_info: { dp_size: 2, batch_num_tokens: 23 } };
  await checkAgainst("vanilla", (x) => vanillaRef({ ...CASE, logp: x }, 0.2, 0.28, 3, "token-mean", { dpSize: 2, batchNumTokens: 23 }), args(CASE, { config }));
  const direct = await evaluate("vanilla", args(CASE, { globalBatchInfo: { dpSize: 2, batchNumTokens: 23 } }));
  close(direct.loss, vanillaRef(CASE, 0.2, 0.28, 3, "token-mean", { dpSize: 2, batchNumTokens: 23 }).loss, 2e-5);
});

test("gspo: sequence-level ratio with stop-gradients; gradient of the token-level surrogate", async () => {
  await checkAgainst("gspo", (x) => gspoRef({ ...CASE, logp: x }, 0.2, 0.28, CASE.logp));
});

test("sapo: smooth gate with tau_pos / tau_neg", async () => {
  await checkAgainst("sapo", (x) => sapoRef({ ...CASE, logp: x }, 1.0, 1.05));
});

test("gpg: −logπ·A with the configured aggregation; no metrics", async () => {
  const got = await checkAgainst("gpg", (x) => gpgRef({ ...CASE, logp: x }, "seq-mean-token-sum"), args(CASE, { lossAggMode: "seq-mean-token-sum" }));
  assert.deepEqual(got.metrics, {});
});

test("cispo: clipped ratio is a constant weight on logπ", async () => {
  await checkAgainst("cispo", (x) => cispoRef({ ...CASE, logp: x }, 0.2, 0.28, "token-mean", CASE.logp));
});

test("geo_mean: sign-aware token clipping and a geometric-mean sequence ratio", async () => {
  await checkAgainst("geo_mean", (x) => geoMeanRef({ ...CASE, logp: x }, 0.2, 0.28));
});

test("kl_cov: the top-covariance tokens get the |Δlogπ| penalty", async () => {
  const config = { ...CONFIG, policy_loss: { kl_cov_ratio: 0.25, ppo_kl_coef: 0.7 } };
  await checkAgainst("kl_cov", (x) => klCovRef({ ...CASE, logp: x }, 0.25, 0.7, "token-mean", CASE.logp), args(CASE, { config }));
  // With a tiny ratio exactly one token is penalised: the loss differs from −A·r by coef·|Δ| at it.
  const tiny = { ...CONFIG, policy_loss: { kl_cov_ratio: 0.0002, ppo_kl_coef: 1.0 } };
  assert.equal(topCovPositions(CASE, 0.0002).size, 1);
  await checkAgainst("kl_cov", (x) => klCovRef({ ...CASE, logp: x }, 0.0002, 1.0, "token-mean", CASE.logp), args(CASE, { config: tiny }));
});

test("clip_cov: drops the gradient of random in-band tokens, reproducibly from the Rng", async () => {
  const config = { ...CONFIG, policy_loss: { clip_cov_ratio: 0.2, clip_cov_lb: -100, clip_cov_ub: 100 } };
  const a = await evaluate("clip_cov", args(CASE, { config, rng: new Rng(5) }));
  const b = await evaluate("clip_cov", args(CASE, { config, rng: new Rng(5) }));
  assert.deepEqual(a.grad, b.grad);
  // 11 valid tokens: max(⌊0.2·11⌋, 1) = 2 dropped, taken from the unclipped ones.
  close(a.metrics["actor/pg_clipfrac"]!, 2 / 11, 1e-6);
  const noDual = { ...CONFIG, clip_ratio_c: 1e9 };
  const plain = await evaluate("vanilla", args(CASE, { config: noDual }));
  const dropped = a.grad.map((g, k) => (g === 0 && plain.grad[k] !== 0 ? k : -1)).filter((k) => k >= 0);
  assert.equal(dropped.length, 2);
  a.grad.forEach((g, k) => { if (!dropped.includes(k)) close(g, plain.grad[k]!, 1e-6, `grad ${k}`); });
  // A different stream picks a different pair at least once over a few seeds.
  const picks = new Set<string>();
  for (let s = 0; s < 6; s++) picks.add(JSON.stringify((await evaluate("clip_cov", args(CASE, { config, rng: new Rng(100 + s) }))).grad.map((g) => g === 0)));
  assert.ok(picks.size > 1);
  // Outside the covariance band nothing is dropped.
  const none = await evaluate("clip_cov", args(CASE, { config: { ...CONFIG, policy_loss: { clip_cov_ratio: 0.2, clip_cov_lb: 50, clip_cov_ub: 100 } }, rng: new Rng(1) }));
  assert.equal(none.metrics["actor/pg_clipfrac"], 0);
  assert.throws(() => getPolicyLoss("clip_cov")(args(CASE, { config })), /needs `rng`/);
});

test("bad configuration and shapes are reported by key", () => {
  assert.throws(() => getPolicyLoss("vanilla")(args(CASE, { config: { ...CONFIG, clip_ratio_c: 1 } })), /clip_ratio_c must be greater than 1/);
  assert.throws(() => getPolicyLoss("vanilla")(args(CASE, { config: { clip_ratio: "0.2" } as unknown as ActorLossConfig })), /actor_rollout_ref\.actor\.clip_ratio must be a number/);
  assert.throws(() => getPolicyLoss("vanilla")(args(CASE, { lossAggMode: "token-sum" })), /invalid loss_agg_mode 'token-sum'/);
  assert.throws(() => getPolicyLoss("vanilla")({ ...args(CASE), advantages: tf.zeros([2, 5]) }), /advantages has shape \[2, 5\]/);
});

test("losses leak no tensors", async () => {
  const a = args(CASE, { rng: new Rng(3), config: { ...CONFIG, policy_loss: { clip_cov_ratio: 0.2, kl_cov_ratio: 0.2 } } });
  for (const name of ["vanilla", "gspo", "sapo", "gpg", "clip_cov", "kl_cov", "geo_mean", "cispo"]) {
    await evaluate(name, a);
    const before = tf.memory().numTensors;
    await evaluate(name, a);
    assert.equal(tf.memory().numTensors, before, `${name} leaked tensors`);
  }
});
