// Rollout correction's bypass mode as a policy loss (verl's loss_mode "bypass_mode",
// which the trainer selects when algorithm.rollout_correction.bypass_mode=true): the
// batch's old_log_probs are the rollout engine's own log-probs (no recomputation), so
// the loss itself corrects for the engine/trainer mismatch against the current policy:
//   log ρ = sg(log π_θ) − log π_rollout   (weights and mask are constants for the backward pass)
//   rollout_is: token → w = min(e^{log ρ}, thr); sequence → w = min(e^{Σ_t log ρ}, thr) per row
//               (optionally divided by the batch mean, rollout_is_batch_normalize)
//   rollout_rs: tokens whose k1/k2/k3 statistic (per token, or per sequence sum/mean/max)
//               leaves its threshold are dropped from the mask
//   loss_type=reinforce: L = agg(−A · log π_θ · w) over the kept tokens
//   loss_type=ppo_clip:  the vanilla (dual-clip) PPO loss with π_old = π_rollout over the
//               kept tokens, without w (the ratio already is the IS correction)
// The same statistics as the host rollout_corr.ts, as tensor ops: here they run inside the
// gradient tape, on the current policy, one micro-batch at a time.
import * as tf from "@tensorflow/tfjs";
import type { PolicyLossArgs, PolicyLossOutput } from "./types.js";
import { aggLoss } from "./agg_loss.js";
import { maskedMean, maskedSum, offTape, stopGradient, toFloatMask } from "./functional.js";
import { batchInfo, checkLossShapes, lossAggModeOf, requireConfig } from "./policy_config.js";
import { computePolicyLossVanilla } from "./policy_loss.js";
import { parseRsThresholds, rolloutCorrectionConfig, rsOptions, type RolloutCorrectionConfig } from "../rollout_corr.js";

const SAFETY_BOUND = 20;
export const BYPASS_LOSS_TYPES = ["ppo_clip", "reinforce"] as const;

/** Truncated (and optionally batch-normalised) IS weights [B, R], 0 on padding; a constant for backprop. */
export function bypassIsWeights(logRatio: tf.Tensor, mask: tf.Tensor, cfg: RolloutCorrectionConfig): tf.Tensor {
  return tf.tidy(() => {
    const m = toFloatMask(mask), thr = cfg.rolloutIsThreshold;
    const exponent = cfg.rolloutIs === "token" ? logRatio : tf.expandDims(maskedSum(logRatio, m, -1), -1);
    let w = tf.minimum(tf.mul(tf.exp(tf.clipByValue(exponent, -SAFETY_BOUND, SAFETY_BOUND)), m), thr);
    if (cfg.rolloutIsBatchNormalize) {
      let norm: tf.Tensor;
      if (cfg.rolloutIs === "token") norm = maskedMean(w, m);
      else {
        const seqMask = tf.cast(tf.greater(tf.sum(m, -1), 0), "float32");
        norm = tf.div(tf.sum(tf.mul(maskedMean(w, m, -1), seqMask)), tf.maximum(tf.sum(seqMask), 1e-8));
      }
      w = tf.div(w, tf.where(tf.greater(norm, 1e-8), norm, tf.onesLike(norm)));
    }
    return stopGradient(w);
  });
}

/** The response mask with rollout_rs's rejections applied (float 0/1). */
export function bypassRejectionMask(logRatio: tf.Tensor, mask: tf.Tensor, cfg: RolloutCorrectionConfig): tf.Tensor {
  const options = rsOptions(cfg.rolloutRs!);
  const thresholds = parseRsThresholds(options, cfg.rolloutRsThreshold);
  return tf.tidy(() => {
    const m = toFloatMask(mask);
    const lr = tf.clipByValue(logRatio, -SAFETY_BOUND, SAFETY_BOUND);
    const k = { k1: () => tf.neg(lr), k2: () => tf.mul(tf.square(lr), 0.5), k3: () => tf.sub(tf.sub(tf.exp(lr), 1), lr) };
    let keep = tf.onesLike(m);
    for (const opt of options) {
      const th = thresholds.get(opt)!, kind = opt.slice(-2) as "k1" | "k2" | "k3";
      const tok = k[kind]();
      let stat: tf.Tensor;
      if (opt.startsWith("token")) stat = tok;
      else if (opt.startsWith("seq_sum")) stat = tf.expandDims(maskedSum(tok, m, -1), -1);
      else if (opt.startsWith("seq_mean")) stat = tf.expandDims(maskedMean(tok, m, -1), -1);
      else {
        // seq_max over the valid tokens; a row with none reads 0
        const max = tf.max(tf.where(tf.cast(m, "bool"), tok, tf.fill(tok.shape, -Infinity)), -1);
        stat = tf.expandDims(tf.where(tf.isInf(max), tf.zerosLike(max), max), -1);
      }
      let pass = kind === "k1" ? tf.lessEqual(stat, Math.log(th.upper)) : tf.lessEqual(stat, th.upper);
      if (kind === "k1") pass = tf.logicalAnd(pass, tf.greaterEqual(stat, Math.log(th.lower!)));
      keep = tf.mul(keep, tf.cast(tf.broadcastTo(pass, m.shape), "float32"));
    }
    return tf.mul(m, keep);
  });
}

/**
 * REINFORCE with optional IS weights: L = agg(−A · log π · w); actor/ppo_kl is the mean of
 * log π_rollout − log π over the mask (`oldLogProb` carries the rollout log-probs).
 */
export function computePolicyLossReinforce(args: PolicyLossArgs): PolicyLossOutput {
  requireConfig(args, "reinforce");
  checkLossShapes(args, "reinforce");
  return tf.tidy(() => {
    const mask = toFloatMask(args.responseMask);
    let losses = tf.mul(tf.neg(args.advantages), args.logProb);
    if (args.rolloutIsWeights) losses = tf.mul(losses, args.rolloutIsWeights);
    return {
      pgLoss: aggLoss(losses, mask, lossAggModeOf(args), batchInfo(args)),
      metrics: { "actor/ppo_kl": maskedMean(tf.sub(args.oldLogProb, args.logProb), mask) as tf.Scalar },
    };
  });
}

/** The rollout_correction section bypass mode reads (verl passes it inside policy_loss). */
function bypassSection(args: PolicyLossArgs): Record<string, unknown> {
  const section = args.config.policy_loss?.rollout_correction;
  if (!section || typeof section !== "object") {
    throw new Error("policy loss 'bypass_mode' needs policy_loss.rollout_correction (set algorithm.rollout_correction.bypass_mode=true; the trainer passes the section)");
  }
  return section as Record<string, unknown>;
}

export function bypassLossType(section: Record<string, unknown>): (typeof BYPASS_LOSS_TYPES)[number] {
  const t = section.loss_type ?? "ppo_clip";
  if (!BYPASS_LOSS_TYPES.includes(t as never)) {
    throw new Error(`algorithm.rollout_correction.loss_type must be ${BYPASS_LOSS_TYPES.join(" or ")}, got ${JSON.stringify(t)}`);
  }
  return t as (typeof BYPASS_LOSS_TYPES)[number];
}

/** verl's compute_policy_loss_bypass_mode: `oldLogProb` holds the rollout log-probs. */
export function computePolicyLossBypassMode(args: PolicyLossArgs): PolicyLossOutput {
  requireConfig(args, "bypass_mode");
  checkLossShapes(args, "bypass_mode");
  const section = bypassSection(args);
  const lossType = bypassLossType(section);
  const cfg = rolloutCorrectionConfig(section);
  // off the tape: the weights and the mask are constants of the backward pass (comparisons have no gradient)
  const off = (f: (logRatio: tf.Tensor, mask: tf.Tensor) => tf.Tensor) =>
    offTape(() => tf.tidy(() => f(tf.sub(args.logProb, args.oldLogProb), toFloatMask(args.responseMask))));
  const weights = cfg.rolloutIs !== null ? off((lr, m) => bypassIsWeights(lr, m, cfg)) : null;
  const mask = cfg.rolloutRs !== null ? off((lr, m) => bypassRejectionMask(lr, m, cfg)) : tf.cast(args.responseMask, "float32");
  const inner = { ...args, responseMask: mask };
  try {
    return lossType === "reinforce"
      ? computePolicyLossReinforce({ ...inner, rolloutIsWeights: weights })
      : computePolicyLossVanilla({ ...inner, rolloutIsWeights: null });
  } finally {
    // inside a gradient tape the tape keeps what the backward pass needs
    tf.dispose([weights, mask].filter((t): t is tf.Tensor => t !== null));
  }
}
