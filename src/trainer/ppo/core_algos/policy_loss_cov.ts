// Covariance-based entropy-preserving losses (Cui et al. 2025, verl §4.2): clip_cov
// zeroes the gradient of a few random high-covariance tokens, kl_cov adds a KL term to
// the top-covariance tokens. Token selection runs off the gradient tape as tensor ops
// (no synchronous reads), so these work on every backend.
import * as tf from "@tensorflow/tfjs";
import type { PolicyLossArgs, PolicyLossOutput } from "./types.js";
import { aggLoss } from "./agg_loss.js";
import { detached, maskedMean, toFloatMask } from "./functional.js";
import { batchInfo, checkLossShapes, clipRange, lossAggModeOf, policyLossNumber, requireConfig } from "./policy_config.js";

/**
 * A 0/1 mask (same shape as `keys`) selecting the `k` largest keys among eligible
 * positions (fewer if fewer are eligible). `k` is a scalar tensor.
 */
export function selectTopK(keys: tf.Tensor, eligible: tf.Tensor, k: tf.Tensor): tf.Tensor {
  return detached((keysIn, eligibleIn, kIn) => {
    const n = keysIn.size;
    const flat = tf.where(tf.cast(tf.reshape(eligibleIn, [n]), "bool"), tf.reshape(keysIn, [n]), tf.fill([n], -Infinity));
    const sorted = tf.topk(flat, n, true);
    const ranks = tf.range(0, n, 1, "float32");
    const chosenSorted = tf.cast(tf.logicalAnd(tf.less(ranks, kIn), tf.notEqual(sorted.values, -Infinity)), "float32");
    // Undo the sort: argsort of the sort indices is the inverse permutation.
    const inverse = tf.topk(tf.neg(tf.cast(sorted.indices, "float32")), n, true).indices;
    return tf.reshape(tf.gather(chosenSorted, inverse), keysIn.shape);
  }, keys, tf.cast(eligible, "float32"), k);
}

function requireRng(args: PolicyLossArgs): NonNullable<PolicyLossArgs["rng"]> {
  if (!args.rng) throw new Error("policy loss 'clip_cov' picks tokens at random and needs `rng` (an Rng from src/utils/rng.ts) in its arguments");
  return args.rng;
}

/**
 * Clip-Cov: the PPO clipped loss, except that up to max(⌊clip_cov_ratio·N⌋, 1) tokens,
 * drawn at random among unclipped tokens with clip_cov_lb < cov < clip_cov_ub
 * (cov = (A − mean A)(logπ − mean logπ)), get no gradient.
 */
export function computePolicyLossClipCov(args: PolicyLossArgs): PolicyLossOutput {
  requireConfig(args, "clip_cov");
  checkLossShapes(args, "clip_cov");
  const { low, high } = clipRange(args.config);
  const ratioOfTokens = policyLossNumber(args.config, "clip_cov_ratio", 0.0002);
  const ub = policyLossNumber(args.config, "clip_cov_ub", 5.0);
  const lb = policyLossNumber(args.config, "clip_cov_lb", 1.0);
  if (!(ratioOfTokens > 0)) throw new Error(`actor_rollout_ref.actor.policy_loss.clip_cov_ratio must be larger than 0, got ${ratioOfTokens}`);
  const rng = requireRng(args);
  const draws = Float32Array.from({ length: args.logProb.size }, () => rng.random());
  const mode = lossAggModeOf(args);
  return tf.tidy(() => {
    const mask = toFloatMask(args.responseMask);
    const A = args.advantages;
    const negKl = tf.sub(args.logProb, args.oldLogProb);
    const ratio = tf.exp(negKl);
    const losses1 = tf.mul(tf.neg(A), ratio);
    const losses2 = tf.mul(tf.neg(A), tf.clipByValue(ratio, 1 - low, 1 + high));
    // Which tokens lose their gradient: a constant for backprop.
    const dropped = detached((logp, oldLogp, adv, m, u) => {
      const r = tf.exp(tf.sub(logp, oldLogp));
      const valid = tf.greater(m, 0);
      const clippedByOrigin = tf.logicalAnd(tf.greater(tf.mul(tf.neg(adv), tf.clipByValue(r, 1 - low, 1 + high)), tf.mul(tf.neg(adv), r)), valid);
      const cov = tf.mul(tf.sub(adv, maskedMean(adv, m)), tf.sub(logp, maskedMean(logp, m)));
      const inBand = tf.logicalAnd(tf.greater(cov, lb), tf.less(cov, ub));
      const eligible = tf.logicalAnd(tf.logicalAnd(valid, tf.logicalNot(clippedByOrigin)), inBand);
      const clipNum = tf.maximum(tf.floor(tf.mul(tf.sum(m), ratioOfTokens)), 1);
      return selectTopK(u, eligible, clipNum);
    }, args.logProb, args.oldLogProb, A, mask, tf.tensor(draws, A.shape, "float32"));
    let pgLosses = tf.mul(tf.maximum(losses1, losses2), tf.sub(1, dropped));
    if (args.rolloutIsWeights) pgLosses = tf.mul(pgLosses, args.rolloutIsWeights);
    return {
      pgLoss: aggLoss(pgLosses, mask, mode, batchInfo(args)),
      metrics: { "actor/pg_clipfrac": maskedMean(dropped, mask) as tf.Scalar, "actor/ppo_kl": maskedMean(tf.neg(negKl), mask) as tf.Scalar },
    };
  });
}

/**
 * KL-Cov: L = −A·r, and for the k = max(1, ⌊kl_cov_ratio·N⌋) valid tokens of largest
 * covariance, L = −A·r + ppo_kl_coef·|logπ − logπ_old|. Metric actor/ppo_kl is the mean |Δlogπ|.
 */
export function computePolicyLossKlCov(args: PolicyLossArgs): PolicyLossOutput {
  requireConfig(args, "kl_cov");
  checkLossShapes(args, "kl_cov");
  const ratioOfTokens = policyLossNumber(args.config, "kl_cov_ratio", 0.0002);
  const coef = policyLossNumber(args.config, "ppo_kl_coef", 1.0);
  if (!(ratioOfTokens > 0)) throw new Error(`actor_rollout_ref.actor.policy_loss.kl_cov_ratio must be larger than 0, got ${ratioOfTokens}`);
  const mode = lossAggModeOf(args);
  return tf.tidy(() => {
    const mask = toFloatMask(args.responseMask);
    const A = args.advantages;
    const negKl = tf.sub(args.logProb, args.oldLogProb);
    const absKl = tf.abs(negKl);
    const ratio = tf.exp(negKl);
    const losses1 = tf.mul(tf.neg(A), ratio);
    const lossesKl = tf.add(losses1, tf.mul(coef, absKl));
    const chosen = detached((logp, adv, m) => {
      const valid = tf.cast(tf.greater(m, 0), "float32");
      const n = tf.sum(valid);
      // Plain means over the valid tokens (no +1e-8 here, as in verl).
      const safeN = tf.maximum(n, 1);
      const isValid = tf.cast(valid, "bool");
      const meanA = tf.div(tf.sum(tf.where(isValid, adv, tf.zerosLike(adv))), safeN);
      const meanLogp = tf.div(tf.sum(tf.where(isValid, logp, tf.zerosLike(logp))), safeN);
      const cov = tf.mul(tf.sub(adv, meanA), tf.sub(logp, meanLogp));
      return selectTopK(cov, valid, tf.maximum(tf.floor(tf.mul(n, ratioOfTokens)), 1));
    }, args.logProb, A, mask);
    let pgLosses = tf.where(tf.cast(chosen, "bool"), lossesKl, losses1);
    if (args.rolloutIsWeights) pgLosses = tf.mul(pgLosses, args.rolloutIsWeights);
    return {
      pgLoss: aggLoss(pgLosses, mask, mode, batchInfo(args)),
      metrics: { "actor/ppo_kl": maskedMean(absKl, mask) as tf.Scalar },
    };
  });
}
