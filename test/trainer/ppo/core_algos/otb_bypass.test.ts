// verl's optimal_token_baseline (and tir_optimal_token_baseline), sum_pi_squared, the
// rollout-correction bypass_mode loss and the variance proxies, against numbers worked
// out by hand from verl's formulas (core_algos.py, rollout_corr_helper.py, metric_utils.py).
import { before, test } from "node:test";
import assert from "node:assert/strict";
import * as tf from "@tensorflow/tfjs";
import {
  bypassIsWeights, bypassRejectionMask, getAdvEstimator,
  type ActorLossConfig, type AdvEstimatorArgs, type PolicyLossArgs,
} from "../../../../src/trainer/ppo/core_algos/index.js";
import { computeRolloutCorrection, rolloutCorrectionConfig } from "../../../../src/trainer/ppo/rollout_corr.js";
import { computeVarianceProxyMetrics } from "../../../../src/trainer/ppo/metric_utils.js";
import { validatePpoNames } from "../../../../src/trainer/ppo/validate_names.js";
import { loadConfig } from "../../../../src/config/index.js";
import { tensor } from "../../../../src/protocol/tensor.js";
import { makeConfig } from "../../../../src/models/config.js";
import { initModel } from "../../../../src/models/init.js";
import { responseLogProbs } from "../../../../src/rollout/log_probs.js";
import { Rng } from "../../../../src/utils/rng.js";
import { syntheticBatch } from "../../../workers/helpers.js";
import { close, closeAll, cpu, randMat, read, t2, type Mat } from "../helpers.js";
import { evaluate } from "./loss_case.js";

before(cpu);

const ln = Math.log;

function otb(name: string, a: { rewards: Mat; mask: Mat; pi: Mat; spp: Mat; index: string[]; is?: Mat }) {
  const args: AdvEstimatorArgs = {
    tokenLevelRewards: t2(a.rewards), responseMask: t2(a.mask), index: a.index,
    oldLogProbs: t2(a.pi.map((r) => r.map(ln))), sumPiSquared: t2(a.spp), ...(a.is ? { rolloutIsWeights: t2(a.is) } : {}),
  };
  const out = getAdvEstimator(name)(args);
  const res = { adv: read(out.advantages), ret: read(out.returns) };
  tf.dispose([out.advantages, out.returns, args.tokenLevelRewards, args.responseMask, args.oldLogProbs!, args.sumPiSquared!]);
  return res;
}

// Row 0: π = 0.5, Σπ² = 0.5 -> w = 1 − 1 + 0.5 = 0.5, W = [0.5, 1, 1.5], G = [1, 1, 1].
// Row 1: π = 0.25, Σπ² = 0.25 -> w = 0.75, W = [0.75, 1.5, (1.5)], G = 0; its last slot is padding.
// Row 2 is alone in its group: A = G.
const CASE = {
  rewards: [[0, 0, 1], [0, 0, 0], [2, 0, 0]],
  mask: [[1, 1, 1], [1, 1, 0], [1, 0, 0]],
  pi: [[0.5, 0.5, 0.5], [0.25, 0.25, 0.25], [0.9, 0.9, 0.9]],
  spp: [[0.5, 0.5, 0.5], [0.25, 0.25, 0.25], [0.8, 0.8, 0.8]],
  index: ["a", "a", "b"],
};

test("optimal_token_baseline: B_t = Σ G·W·mask / Σ W·mask per group and position, by hand", () => {
  const { adv, ret } = otb("optimal_token_baseline", CASE);
  // B_0 = 0.5 / 1.25 = 0.4, B_1 = 1 / 2.5 = 0.4, B_2 = 1.5 / 1.5 = 1
  closeAll(adv, [0.6, 0.6, 0, -0.4, -0.4, 0, 2, 0, 0], 1e-6);
  closeAll(ret, [1, 1, 1, 0, 0, 0, 2, 0, 0], 1e-6);
});

test("optimal_token_baseline scales each token's energy by the rollout IS weight squared", () => {
  // row 1 weighs ρ = 2: w = 0.75·4 = 3, W = [3, 6]; B_0 = 0.5 / 3.5 = 1/7, B_1 = 1 / 7
  const { adv } = otb("optimal_token_baseline", { ...CASE, is: [[1, 1, 1], [2, 2, 2], [1, 1, 1]] });
  closeAll(adv.slice(0, 6), [6 / 7, 6 / 7, 0, -1 / 7, -1 / 7, 0], 1e-6);
});

test("tir_optimal_token_baseline packs each row's model tokens to the left and zeroes the longest row's tail", () => {
  // row 0: tokens at slots 0 and 2 (slot 1 is tool output): packed G = [1, 1], W = [0.5, 1]
  // row 1: three tokens, G = 0.5, W = [0.75, 1.5, 2.25]
  // B_0 = (0.5 + 0.375) / 1.25 = 0.7, B_1 = (1 + 0.75) / 2.5 = 0.7, B_2 = 0.5 but zeroed (row 1 is the single longest)
  const a = { rewards: [[0, 0, 1], [0, 0, 0.5]], mask: [[1, 0, 1], [1, 1, 1]], pi: [[0.5, 0.5, 0.5], [0.25, 0.25, 0.25]], spp: [[0.5, 0.5, 0.5], [0.25, 0.25, 0.25]], index: ["a", "a"] };
  const tir = otb("tir_optimal_token_baseline", a);
  closeAll(tir.adv, [0.3, 0, 0.3, -0.2, -0.2, 0.5], 1e-6);
  // the plain estimator compares slot with slot instead: B_1 = 0.75 / 1.5 = 0.5 (row 0 masked there),
  // B_2 = (1 + 1.125) / (1 + 2.25)
  const plain = otb("optimal_token_baseline", a);
  closeAll(plain.adv, [1 - 0.7, 0, 1 - 2.125 / 3.25, 0.5 - 0.7, 0, 0.5 - 2.125 / 3.25], 1e-6);
});

test("optimal_token_baseline names the setting when sum_pi_squared is missing", () => {
  assert.throws(() => getAdvEstimator("optimal_token_baseline")({ tokenLevelRewards: t2([[1]]), responseMask: t2([[1]]), index: ["a"] }),
    /sum_pi_squared.*calculate_sum_pi_squared=True/);
});

test("responseLogProbs' sumPiSquared is Σ softmax(logits / T)² at each response position", async () => {
  const config = makeConfig({ vocabSize: 32, dim: 16, hiddenDim: 32, nLayers: 1, nHeads: 4, nKvHeads: 2, maxSeqLen: 64 });
  const m = initModel(config, new Rng(3));
  const data = syntheticBatch(3, 4, 3, 32, 5);
  const temperature = 0.7;
  const got = tf.tidy(() => responseLogProbs(m, data, { temperature, calculateSumPiSquared: true }).sumPiSquared!.arraySync());
  // the reference: full logits at the positions that predict each response token
  const ids = data.batch.input_ids!, [B, L] = ids.shape as [number, number], R = 3;
  const want = tf.tidy(() => {
    const hidden = m.hiddenStates(tf.tensor2d(Int32Array.from(ids.data as ArrayLike<number>), [B, L], "int32"), {
      attentionMask: data.batch.attention_mask!.data, positionIds: data.batch.position_ids?.data,
    });
    const p = tf.softmax(tf.div(m.lmHead(hidden.slice([0, L - R - 1, 0], [B, R, -1])), temperature));
    return tf.sum(tf.square(p), -1).arraySync() as number[][];
  });
  const rm = data.batch.response_mask!.data;
  want.forEach((row, b) => row.forEach((v, t) => { if (rm[b * R + t]) close(got[b]![t]!, v, 1e-5, `Σπ² [${b}, ${t}]`); }));
  m.dispose();
});

// ---- bypass_mode -------------------------------------------------------------------------------

const ACTOR: ActorLossConfig = { clip_ratio: 0.2, clip_ratio_c: 3.0, loss_agg_mode: "token-mean" };

function bypassConfig(rc: Record<string, unknown>): ActorLossConfig {
  return { ...ACTOR, policy_loss: { loss_mode: "bypass_mode", rollout_correction: { rollout_is_threshold: 2.0, ...rc } } };
}

/** The loss, its gradient and metrics, through loss_case's shared evaluator (logProb given as numbers). */
async function lossAndGrad(name: string, a: Omit<PolicyLossArgs, "logProb"> & { logProb: Mat }): Promise<{ loss: number; grad: number[]; metrics: Record<string, number> }> {
  const logProb = t2(a.logProb);
  try {
    return await evaluate(name, { ...a, logProb });
  } finally {
    logProb.dispose();
  }
}

// one row: log π = [−1, −2], log π_rollout = [−1.5, −1.8] -> log ρ = [0.5, −0.2]
const LOGP = [[-1, -2]], ROLL = [[-1.5, -1.8]], ADV = [[1, 1]], MASK = [[1, 1]];
const base = () => ({ logProb: LOGP, oldLogProb: t2(ROLL), advantages: t2(ADV), responseMask: t2(MASK) });

test("bypass_mode reinforce with token IS: L = mean(−A·log π·min(ρ, thr)), gradient −A·w/n, ppo_kl = mean(log π_rollout − log π)", async () => {
  const w = [1.5, Math.exp(-0.2)]; // e^0.5 = 1.65 truncated to 1.5
  const r = await lossAndGrad("bypass_mode", { ...base(), config: bypassConfig({ loss_type: "reinforce", rollout_is: "token", rollout_is_threshold: 1.5 }) });
  close(r.loss, (1 * 1.5 + 2 * w[1]!) / 2, 1e-6, "loss");
  closeAll(r.grad, [-w[0]! / 2, -w[1]! / 2], 1e-6, "gradient (weights are constants)");
  close(r.metrics["actor/ppo_kl"]!, (-0.5 + 0.2) / 2, 1e-6, "ppo_kl");
});

test("bypass_mode reinforce with sequence IS and batch normalisation: the weight e^{Σ log ρ} divided by its mean is 1", async () => {
  const seq = await lossAndGrad("bypass_mode", { ...base(), config: bypassConfig({ loss_type: "reinforce", rollout_is: "sequence" }) });
  close(seq.loss, (Math.exp(0.3) * 3) / 2, 1e-5, "sequence weight e^0.3");
  const norm = await lossAndGrad("bypass_mode", { ...base(), config: bypassConfig({ loss_type: "reinforce", rollout_is: "sequence", rollout_is_batch_normalize: true }) });
  close(norm.loss, 3 / 2, 1e-5, "normalised");
});

test("bypass_mode rejection: token_k1 with bounds 0.7_1.4 drops the token whose ratio is e^0.5", async () => {
  const r = await lossAndGrad("bypass_mode", { ...base(), config: bypassConfig({ loss_type: "reinforce", rollout_rs: "token_k1", rollout_rs_threshold: "0.7_1.4" }) });
  close(r.loss, 2, 1e-6, "only token 1 (log π = −2) is left");
  closeAll(r.grad, [0, -1], 1e-6);
});

test("bypass_mode ppo_clip is the vanilla loss with π_old = π_rollout over the kept tokens, and no IS weights", async () => {
  const logp = randMat(3, 4, 21, -2, -0.3), roll = logp.map((r, i) => r.map((x, t) => x + 0.3 * Math.sin(i * 4 + t)));
  const adv = randMat(3, 4, 22), mask = [[1, 1, 1, 0], [1, 1, 1, 1], [1, 0, 1, 1]];
  const common = { logProb: logp, oldLogProb: t2(roll), advantages: t2(adv), responseMask: t2(mask) };
  const bypass = await lossAndGrad("bypass_mode", { ...common, config: bypassConfig({ loss_type: "ppo_clip", rollout_is: "token" }) });
  const vanilla = await lossAndGrad("vanilla", { ...common, config: ACTOR });
  close(bypass.loss, vanilla.loss, 1e-6);
  closeAll(bypass.grad, vanilla.grad, 1e-6);
  for (const k of ["actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower"]) close(bypass.metrics[k]!, vanilla.metrics[k]!, 1e-6, k);
  assert.throws(() => rolloutCorrectionConfig({ rollout_is: "tokens" }), /rollout_is must be null, token or sequence/);
  await assert.rejects(lossAndGrad("bypass_mode", { ...common, config: bypassConfig({ loss_type: "reinforc" }) }), /loss_type must be ppo_clip or reinforce/);
});

test("bypass_mode's tensor IS weights and rejection mask equal the host rollout correction's", () => {
  const B = 4, R = 5;
  const cur = randMat(B, R, 31, -3, -0.1), roll = cur.map((r, i) => r.map((x, t) => x + 0.6 * Math.cos(3 * i + t)));
  const mask = [[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 1, 1, 1, 0], [0, 0, 0, 0, 0]];
  const configs = [
    { rollout_is: "token", rollout_is_threshold: 1.3, rollout_is_batch_normalize: true },
    { rollout_is: "sequence", rollout_is_threshold: 3, rollout_is_batch_normalize: true, rollout_rs: "seq_max_k2,seq_mean_k3", rollout_rs_threshold: "0.1,0.05" },
    { rollout_is: "sequence", rollout_rs: "token_k1,seq_sum_k1", rollout_rs_threshold: "0.6_1.6,0.5_2.5" },
    { rollout_is: "token", rollout_rs: "token_k2,token_k3,seq_sum_k2", rollout_rs_threshold: 0.08 },
  ];
  for (const c of configs) {
    const cfg = rolloutCorrectionConfig(c);
    const host = computeRolloutCorrection(Float32Array.from(cur.flat()), Float32Array.from(roll.flat()), mask.flat(), B, R, cfg);
    const [w, m] = tf.tidy(() => {
      const lr = tf.sub(t2(cur), t2(roll)), mk = t2(mask);
      return [bypassIsWeights(lr, mk, cfg), cfg.rolloutRs ? bypassRejectionMask(lr, mk, cfg) : mk];
    });
    closeAll(read(w!), Array.from(host.weights!), 1e-5, `weights ${JSON.stringify(c)}`);
    assert.deepEqual(read(m!), Array.from(host.responseMask), `mask ${JSON.stringify(c)}`);
    tf.dispose([w!, m!]);
  }
});

// ---- variance proxies and config checks ---------------------------------------------------------------

test("variance_proxy metrics: W = Σ(1 − 2π + Σπ²), power E[Ā²·W], noise (power − grad_norm²)/(N − 1), by hand", () => {
  // row 0: π = 0.5, Σπ² = 0.5 over 2 tokens -> W = 1, Ā = 1; row 1: π = 0.25, Σπ² = 0.25, 1 token -> W = 0.75, Ā = −2
  const batch = {
    batch: {
      old_log_probs: tensor(Float32Array.from([ln(0.5), ln(0.5), ln(0.25), 0]), [2, 2], "float32"),
      sum_pi_squared: tensor(Float32Array.from([0.5, 0.5, 0.25, 0]), [2, 2], "float32"),
      advantages: tensor(Float32Array.from([1, 1, -2, 0]), [2, 2], "float32"),
      response_mask: tensor(Int32Array.from([1, 1, 1, 0]), [2, 2], "int32"),
    },
    nonTensorBatch: {}, metaInfo: {},
  };
  const m = computeVarianceProxyMetrics(batch, 0.5);
  close(m["variance_proxy/expected_w"]!, (1 + 0.75) / 2, 1e-6);
  close(m["variance_proxy/expected_a_squared"]!, (1 + 4) / 2, 1e-6);
  close(m["variance_proxy/proxy2_total_power"]!, (1 * 1 + 4 * 0.75) / 2, 1e-6);
  close(m["variance_proxy/proxy1_signal_strength"]!, 0.25, 1e-6);
  close(m["variance_proxy/proxy3_pure_noise"]!, 2 - 0.25, 1e-6);
  assert.deepEqual(computeVarianceProxyMetrics({ ...batch, batch: { ...batch.batch, sum_pi_squared: undefined as never } }), {});
});

test("the config check names what optimal_token_baseline and bypass_mode need", () => {
  const cfg = loadConfig({
    configName: "ppo_trainer",
    overrides: ["algorithm.adv_estimator=optimal_token_baseline", "algorithm.rollout_correction.bypass_mode=true", "algorithm.rollout_correction.loss_type=pg"],
  });
  assert.throws(() => validatePpoNames(cfg), (e: Error) =>
    /calculate_sum_pi_squared=True/.test(e.message) && /bypass_mode=true skips/.test(e.message) && /calculate_log_probs=True/.test(e.message) && /loss_type is "pg"/.test(e.message));
});

test("optim.override_optimizer_config: AdamW's keywords over the section's, Megatron's adam_* names, others refused by name", async () => {
  const { adamWArgs } = await import("../../../../src/workers/dp_optimizer.js");
  const { ConfigView } = await import("../../../../src/workers/config_view.js");
  const view = (over: unknown) => new ConfigView({ a: { optim: { lr: 1e-3, betas: [0.9, 0.999], weight_decay: 0.01, override_optimizer_config: over } } } as never, "a.optim");
  assert.deepEqual(adamWArgs(view(null)), { lr: 1e-3, betas: [0.9, 0.999], eps: 1e-8, weightDecay: 0.01 });
  assert.deepEqual(adamWArgs(view({ eps: 1e-6, betas: [0.8, 0.95], fused: true, amsgrad: false })), { lr: 1e-3, betas: [0.8, 0.95], eps: 1e-6, weightDecay: 0.01 });
  assert.deepEqual(adamWArgs(view({ adam_beta2: 0.98, adam_eps: 1e-5, lr: 2e-3 })), { lr: 2e-3, betas: [0.9, 0.98], eps: 1e-5, weightDecay: 0.01 });
  assert.throws(() => adamWArgs(view({ bf16_stochastic_round: true })), /a\.optim\.override_optimizer_config\.bf16_stochastic_round=true: verl-ts's AdamW takes/);
  assert.throws(() => adamWArgs(view({ amsgrad: true })), /amsgrad=true/);
});
