// Outcome (one scalar per response) advantage estimators that compare the responses
// of one prompt: GRPO and its variants, RLOO, OPO, GPG, REINFORCE++-baseline
// (verl core_algos §4.1). The score of row i is s_i = Σ_t tokenLevelRewards[i,t];
// groups are rows sharing an `index` (uid). Advantages are s-derived scalars
// broadcast over the response ×mask; returns equal advantages.
import type { AdvEstimatorArgs, AdvEstimatorOutput } from "./types.js";
import {
  broadcastRows, groupRows, maskedWhitenHost, mean, readMatrix, rowSums, sameShape, stdUnbiased, toTensor2D,
  type HostMatrix,
} from "./host_math.js";

const DEFAULT_EPS = 1e-6;

interface OutcomeInputs {
  mask: HostMatrix;
  scores: Float64Array;
  groups: Map<string | number, number[]>;
}

function outcomeInputs(args: AdvEstimatorArgs, estimator: string): OutcomeInputs {
  const rewards = readMatrix(args.tokenLevelRewards, "tokenLevelRewards");
  const mask = readMatrix(args.responseMask, "responseMask");
  sameShape(rewards, mask, "tokenLevelRewards", "responseMask");
  return { mask, scores: rowSums(rewards), groups: groupRows(args.index, rewards.rows, estimator) };
}

function broadcastOutcome(scalars: Float64Array, mask: HostMatrix): AdvEstimatorOutput {
  const adv = broadcastRows(scalars, mask);
  return { advantages: toTensor2D(adv, mask.rows, mask.cols), returns: toTensor2D(adv, mask.rows, mask.cols) };
}

function normByStd(args: AdvEstimatorArgs): boolean {
  return args.normAdvByStdInGrpo ?? args.config?.norm_adv_by_std_in_grpo ?? true;
}

/** Per-group mean and unbiased std; a singleton group uses mean 0 and std 1. */
function groupStats(scores: Float64Array, rows: number[]): { mu: number; sigma: number } {
  if (rows.length === 1) return { mu: 0, sigma: 1 };
  const xs = rows.map((r) => scores[r]!);
  return { mu: mean(xs), sigma: stdUnbiased(xs) };
}

/** GRPO: (s − mean_g)/(std_g + ε), or s − mean_g when normAdvByStdInGrpo is false (Dr.GRPO). */
export function computeGrpoOutcomeAdvantage(args: AdvEstimatorArgs): AdvEstimatorOutput {
  return groupNormalised(args, "grpo", stdUnbiased);
}

/**
 * The vectorised GRPO of verl: the same as `grpo` except that the group std is
 * floored, std = sqrt(max(var, ε)), before adding ε.
 */
export function computeGrpoVectorizedOutcomeAdvantage(args: AdvEstimatorArgs): AdvEstimatorOutput {
  const eps = args.epsilon ?? DEFAULT_EPS;
  return groupNormalised(args, "grpo_vectorized", (xs) => Math.sqrt(Math.max(stdUnbiased(xs) ** 2, eps)));
}

function groupNormalised(args: AdvEstimatorArgs, name: string, groupStd: (xs: number[]) => number): AdvEstimatorOutput {
  const { mask, scores, groups } = outcomeInputs(args, name);
  const eps = args.epsilon ?? DEFAULT_EPS, norm = normByStd(args);
  const out = new Float64Array(scores.length);
  for (const rows of groups.values()) {
    const xs = rows.map((r) => scores[r]!);
    // A singleton group uses mean 0 and std 1.
    const mu = rows.length > 1 ? mean(xs) : 0, sigma = rows.length > 1 ? groupStd(xs) : 1;
    for (const r of rows) out[r] = norm ? (scores[r]! - mu) / (sigma + eps) : scores[r]! - mu;
  }
  return broadcastOutcome(out, mask);
}

/** Pass@k GRPO: only the best response of a group gets r_max − r_second (÷ (std + ε) when normalising). */
export function computeGrpoPasskOutcomeAdvantage(args: AdvEstimatorArgs): AdvEstimatorOutput {
  const { mask, scores, groups } = outcomeInputs(args, "grpo_passk");
  const eps = args.epsilon ?? DEFAULT_EPS, norm = normByStd(args);
  const out = new Float64Array(scores.length);
  for (const [id, rows] of groups) {
    if (rows.length < 2) throw new Error(`grpo_passk needs at least 2 samples per group; group '${String(id)}' has ${rows.length}`);
    let best = rows[0]!;
    for (const r of rows) if (scores[r]! > scores[best]!) best = r;
    let second = -Infinity;
    for (const r of rows) if (r !== best && scores[r]! > second) second = scores[r]!;
    let advantage = scores[best]! - second;
    if (norm) advantage /= stdUnbiased(rows.map((r) => scores[r]!)) + eps;
    out[best] = advantage;
  }
  return broadcastOutcome(out, mask);
}

/** REINFORCE++ with a group-mean baseline: (s − mean_g) over the response, whitened over the mask, ×mask. */
export function computeReinforcePlusPlusBaselineOutcomeAdvantage(args: AdvEstimatorArgs): AdvEstimatorOutput {
  const { mask, scores, groups } = outcomeInputs(args, "reinforce_plus_plus_baseline");
  const centred = new Float64Array(scores.length);
  for (const rows of groups.values()) {
    const { mu } = groupStats(scores, rows);
    for (const r of rows) centred[r] = scores[r]! - mu;
  }
  const tiled = broadcastRows(centred, mask);
  const adv = maskedWhitenHost(tiled, mask.data).map((a, k) => a * mask.data[k]!);
  return { advantages: toTensor2D(adv, mask.rows, mask.cols), returns: toTensor2D(adv, mask.rows, mask.cols) };
}

/** RLOO: s − mean of the other responses of the group; a singleton keeps s. */
export function computeRlooOutcomeAdvantage(args: AdvEstimatorArgs): AdvEstimatorOutput {
  return rloo(args, "rloo", (s) => s);
}

/** Vectorised RLOO as verl has it: identical except that a singleton group gets 0. */
export function computeRlooVectorizedOutcomeAdvantage(args: AdvEstimatorArgs): AdvEstimatorOutput {
  return rloo(args, "rloo_vectorized", () => 0);
}

function rloo(args: AdvEstimatorArgs, name: string, singleton: (s: number) => number): AdvEstimatorOutput {
  const { mask, scores, groups } = outcomeInputs(args, name);
  const out = new Float64Array(scores.length);
  for (const rows of groups.values()) {
    const n = rows.length;
    if (n === 1) {
      out[rows[0]!] = singleton(scores[rows[0]!]!);
      continue;
    }
    const mu = mean(rows.map((r) => scores[r]!));
    for (const r of rows) out[r] = (scores[r]! * n) / (n - 1) - (mu * n) / (n - 1);
  }
  return broadcastOutcome(out, mask);
}

/**
 * OPO: s − Σ(len·s)/Σlen over the group (len = response tokens). A singleton's baseline
 * is 0; so is that of a group whose responses are all empty (verl divides 0 by 0).
 */
export function computeOpoOutcomeAdvantage(args: AdvEstimatorArgs): AdvEstimatorOutput {
  const { mask, scores, groups } = outcomeInputs(args, "opo");
  const lengths = rowSums(mask);
  const out = new Float64Array(scores.length);
  for (const rows of groups.values()) {
    let baseline = 0;
    if (rows.length > 1) {
      let num = 0, den = 0;
      for (const r of rows) {
        num += lengths[r]! * scores[r]!;
        den += lengths[r]!;
      }
      baseline = den > 0 ? num / den : 0;
    }
    for (const r of rows) out[r] = scores[r]! - baseline;
  }
  return broadcastOutcome(out, mask);
}

/** GPG: α·(s − mean_g)/f_norm with α = B / max(#rows with s ≠ 0, 1) and f_norm = 1. */
export function computeGpgOutcomeAdvantage(args: AdvEstimatorArgs): AdvEstimatorOutput {
  const { mask, scores, groups } = outcomeInputs(args, "gpg");
  const fNorm = 1.0;
  let nonzero = 0;
  for (const s of scores) if (s !== 0) nonzero++;
  const alpha = scores.length / Math.max(nonzero, 1);
  const out = new Float64Array(scores.length);
  for (const rows of groups.values()) {
    const { mu } = groupStats(scores, rows);
    for (const r of rows) out[r] = (alpha * (scores[r]! - mu)) / fNorm;
  }
  return broadcastOutcome(out, mask);
}
