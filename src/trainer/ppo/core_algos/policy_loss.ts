// Policy-gradient losses (verl §4.2): vanilla (dual-clip PPO), gspo, sapo, gpg,
// geo_mean (GMPO) and cispo. Each takes PolicyLossArgs and returns the scalar loss and
// metrics as scalar tensors (read them after the tape; see metrics.ts).
import * as tf from "@tensorflow/tfjs";
import type { PolicyLossArgs, PolicyLossOutput } from "./types.js";
import { aggLoss } from "./agg_loss.js";
import { maskedMean, maskedSum, stopGradient, toFloatMask } from "./functional.js";
import { fusedLossFor, fusedPpoMetric, fusedPpoTokenLosses, type PPO_METRICS } from "../../../engine/webgpu_fused_ppo.js";
import { actorNumber, batchInfo, checkLossShapes, clipRange, lossAggModeOf, requireConfig } from "./policy_config.js";

function prepare(args: PolicyLossArgs, loss: string): void {
  requireConfig(args, loss);
  checkLossShapes(args, loss);
}

function withIsWeights(pgLosses: tf.Tensor, args: PolicyLossArgs): tf.Tensor {
  return args.rolloutIsWeights ? tf.mul(pgLosses, args.rolloutIsWeights) : pgLosses;
}

const zero = (): tf.Scalar => tf.scalar(0);

/**
 * PPO clipped objective with separate ε_low/ε_high and dual clip (c = clip_ratio_c):
 * L = max(−A·r, −A·clip(r, 1−ε_lo, 1+ε_hi)), and for A < 0, min(L, −A·c).
 */
export function computePolicyLossVanilla(args: PolicyLossArgs): PolicyLossOutput {
  prepare(args, "vanilla");
  const { low, high } = clipRange(args.config);
  const clipC = actorNumber(args.config, "clip_ratio_c", 3.0);
  if (!(clipC > 1)) throw new Error(`actor_rollout_ref.actor.clip_ratio_c must be greater than 1.0 for dual-clip PPO, got ${clipC}`);
  const mode = lossAggModeOf(args);
  return tf.tidy(() => {
    const mask = toFloatMask(args.responseMask);
    const A = args.advantages;
    const w = args.rolloutIsWeights;
    if (fusedLossFor(args.logProb, args.oldLogProb, A, mask, ...(w ? [w] : []))) {
      // WebGPU: the same formulas as below, one kernel for the per-token loss and one per metric
      const clip = { low, high, clipC }, metric = (m: (typeof PPO_METRICS)[number]) => fusedPpoMetric(m, args.logProb, args.oldLogProb, A, mask, clip);
      return {
        pgLoss: aggLoss(fusedPpoTokenLosses(args.logProb, args.oldLogProb, A, w ?? null, clip), mask, mode, batchInfo(args)),
        metrics: { "actor/pg_clipfrac": metric("clipfrac"), "actor/ppo_kl": metric("ppo_kl"), "actor/pg_clipfrac_lower": metric("clipfrac_lower") },
      };
    }
    const negKl = tf.clipByValue(tf.sub(args.logProb, args.oldLogProb), -20, 20);
    const ratio = tf.exp(negKl);
    const ppoKl = maskedMean(tf.neg(negKl), mask);
    const losses1 = tf.mul(tf.neg(A), ratio);
    const losses2 = tf.mul(tf.neg(A), tf.clipByValue(ratio, 1 - low, 1 + high));
    const clipped1 = tf.maximum(losses1, losses2);
    const clipfrac = maskedMean(tf.cast(tf.greater(losses2, losses1), "float32"), mask);
    const losses3 = tf.mul(tf.neg(A), clipC);
    const clipped2 = tf.minimum(losses3, clipped1);
    const negative = tf.less(A, 0);
    const clipfracLower = maskedMean(tf.cast(tf.logicalAnd(tf.greater(clipped1, losses3), negative), "float32"), mask);
    const pgLosses = withIsWeights(tf.where(negative, clipped2, clipped1), args);
    return {
      pgLoss: aggLoss(pgLosses, mask, mode, batchInfo(args)),
      metrics: { "actor/pg_clipfrac": clipfrac as tf.Scalar, "actor/ppo_kl": ppoKl as tf.Scalar, "actor/pg_clipfrac_lower": clipfracLower as tf.Scalar },
    };
  });
}

/**
 * GSPO: sequence-level ratio s_i = exp(mean_t(logπ − logπ_old)), applied per token as
 * exp(sg(log s_i) + logπ − sg(logπ)) (clamped at e^10), clipped like PPO; always
 * aggregated with seq-mean-token-mean.
 */
export function computePolicyLossGspo(args: PolicyLossArgs): PolicyLossOutput {
  prepare(args, "gspo");
  const { low, high } = clipRange(args.config);
  return tf.tidy(() => {
    const mask = toFloatMask(args.responseMask);
    const A = args.advantages;
    const negKl = tf.sub(args.logProb, args.oldLogProb);
    const seqLengths = tf.maximum(tf.sum(mask, -1), 1);
    const negKlSeq = tf.div(maskedSum(negKl, mask, -1), seqLengths);
    const logSeqRatio = tf.minimum(
      tf.add(tf.sub(args.logProb, stopGradient(args.logProb)), tf.expandDims(stopGradient(negKlSeq), -1)),
      10,
    );
    const seqRatio = tf.exp(logSeqRatio);
    const losses1 = tf.mul(tf.neg(A), seqRatio);
    const losses2 = tf.mul(tf.neg(A), tf.clipByValue(seqRatio, 1 - low, 1 + high));
    const pgLosses = withIsWeights(tf.maximum(losses1, losses2), args);
    return {
      pgLoss: aggLoss(pgLosses, mask, "seq-mean-token-mean", batchInfo(args)),
      metrics: {
        "actor/pg_clipfrac": maskedMean(tf.cast(tf.greater(losses2, losses1), "float32"), mask) as tf.Scalar,
        "actor/ppo_kl": maskedMean(tf.neg(negKl), mask) as tf.Scalar,
        "actor/pg_clipfrac_lower": zero(),
      },
    };
  });
}

/**
 * SAPO: a smooth gate instead of a hard clip, f(r) = σ(τ(r − 1))·4/τ with τ = tau_pos
 * where A > 0 else tau_neg; L = −f(r)·A, aggregated with seq-mean-token-mean.
 */
export function computePolicyLossSapo(args: PolicyLossArgs): PolicyLossOutput {
  prepare(args, "sapo");
  const tauPos = actorNumber(args.config, "tau_pos", 1.0);
  const tauNeg = actorNumber(args.config, "tau_neg", 1.05);
  return tf.tidy(() => {
    const mask = toFloatMask(args.responseMask);
    const A = args.advantages;
    const negKl = tf.clipByValue(tf.sub(args.logProb, args.oldLogProb), -20, 20);
    const ratio = tf.exp(negKl);
    const taus = tf.where(tf.greater(A, 0), tf.fill(A.shape, tauPos), tf.fill(A.shape, tauNeg));
    const gates = tf.div(tf.mul(tf.sigmoid(tf.mul(taus, tf.sub(ratio, 1))), 4), taus);
    const pgLosses = withIsWeights(tf.mul(tf.neg(gates), A), args);
    return {
      pgLoss: aggLoss(pgLosses, mask, "seq-mean-token-mean", batchInfo(args)),
      metrics: { "actor/pg_clipfrac": zero(), "actor/ppo_kl": maskedMean(tf.neg(negKl), mask) as tf.Scalar, "actor/pg_clipfrac_lower": zero() },
    };
  });
}

/** GPG: plain policy gradient L = −logπ·A. */
export function computePolicyLossGpg(args: PolicyLossArgs): PolicyLossOutput {
  prepare(args, "gpg");
  const mode = lossAggModeOf(args);
  return tf.tidy(() => {
    const pgLosses = withIsWeights(tf.mul(tf.neg(args.logProb), args.advantages), args);
    return { pgLoss: aggLoss(pgLosses, toFloatMask(args.responseMask), mode, batchInfo(args)), metrics: {} };
  });
}

/**
 * GMPO (geo_mean): token log-ratios clipped sign-aware to [−ε_lo, ε_hi], sequence ratio
 * = exp(mean_t), sequence advantage = mean_t A, L = mean_rows(−A_seq·r_seq). The mean
 * divides by globalBatchSize·(1/dpSize) when given, else by the local row count (verl).
 */
export function computePolicyLossGeoMean(args: PolicyLossArgs): PolicyLossOutput {
  prepare(args, "geo_mean");
  const { low, high } = clipRange(args.config);
  const info = batchInfo(args);
  return tf.tidy(() => {
    const mask = toFloatMask(args.responseMask);
    const A = args.advantages;
    const negKl = tf.sub(args.logProb, args.oldLogProb);
    const sgn = tf.sign(A);
    const negKlClamp = tf.clipByValue(negKl, -low, high);
    const negKlMin = tf.mul(sgn, tf.minimum(tf.mul(sgn, negKl), tf.mul(sgn, negKlClamp)));
    const lengths = tf.add(tf.sum(mask, -1), 1e-8);
    const seqRatio = tf.exp(tf.div(maskedSum(negKlMin, mask, -1), lengths));
    const seqAdv = tf.div(maskedSum(A, mask, -1), lengths);
    let pgLosses = tf.mul(tf.neg(seqAdv), seqRatio);
    if (args.rolloutIsWeights) {
      const logW = tf.log(tf.add(args.rolloutIsWeights, 1e-10));
      pgLosses = tf.mul(pgLosses, tf.exp(tf.div(maskedSum(logW, mask, -1), lengths)));
    }
    const rows = info.globalBatchSize ? info.globalBatchSize / (info.dpSize ?? 1) : A.shape[0]!;
    const clipped = tf.notEqual(negKl, negKlClamp);
    return {
      pgLoss: tf.div(tf.sum(pgLosses), Math.max(rows, 1)) as tf.Scalar,
      metrics: {
        "actor/pg_clipfrac": maskedMean(tf.cast(tf.logicalAnd(clipped, tf.greater(A, 0)), "float32"), mask) as tf.Scalar,
        "actor/ppo_kl": maskedMean(tf.neg(negKl), mask) as tf.Scalar,
        "actor/pg_clipfrac_lower": maskedMean(tf.cast(tf.logicalAnd(clipped, tf.less(A, 0)), "float32"), mask) as tf.Scalar,
      },
    };
  });
}

/** CISPO: L = −sg(clip(r, 1−ε_lo, 1+ε_hi))·A·logπ; the gradient flows through logπ only. */
export function computePolicyLossCispo(args: PolicyLossArgs): PolicyLossOutput {
  prepare(args, "cispo");
  const { low, high } = clipRange(args.config);
  const mode = lossAggModeOf(args);
  return tf.tidy(() => {
    const mask = toFloatMask(args.responseMask);
    const negKl = tf.clipByValue(tf.sub(args.logProb, args.oldLogProb), -20, 20);
    const ratio = tf.exp(negKl);
    const clippedRatio = tf.clipByValue(ratio, 1 - low, 1 + high);
    const pgLosses = withIsWeights(tf.mul(tf.mul(tf.neg(stopGradient(clippedRatio)), args.advantages), args.logProb), args);
    return {
      pgLoss: aggLoss(pgLosses, mask, mode, batchInfo(args)),
      metrics: {
        "actor/pg_clipfrac": maskedMean(tf.cast(tf.notEqual(ratio, clippedRatio), "float32"), mask) as tf.Scalar,
        "actor/ppo_kl": maskedMean(tf.neg(negKl), mask) as tf.Scalar,
        "actor/pg_clipfrac_lower": zero(),
      },
    };
  });
}
