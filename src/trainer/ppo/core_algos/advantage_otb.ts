// Optimal Token Baseline (verl's optimal_token_baseline and its multi-turn form
// tir_optimal_token_baseline): a baseline per token position and prompt group,
// weighted by each trajectory's accumulated "realized energy".
//   G_t  = Σ_{j≥t} r_j                           (reward-to-go over the response mask)
//   w_j  = (1 − 2·π_j + Σπ²_j) · ρ_j²           (π_j = exp(old_log_prob_j); ρ = rollout IS weight when present)
//   W_t  = Σ_{j≤t} w_j·mask_j
//   B_t  = Σ_i G_t^i·W_t^i·mask_t^i / (Σ_i W_t^i·mask_t^i + ε)   over the group's trajectories i
//   A_t  = (G_t − B_t)·mask_t
// A group of one keeps B = 0 (A = G). The multi-turn form first packs each row's
// masked tokens to the left (tool output between turns drops out), so position t
// is the t-th model token, and zeroes the baseline of the longest trajectory past
// the second-longest one (handle_zero_tail, on by default there, off for OTB).
// Σπ² comes from the actor (actor.calculate_sum_pi_squared=True).
import type { AdvEstimatorArgs, AdvEstimatorOutput } from "./types.js";
import { groupRows, readMatrix, sameShape, toTensor2D, type HostMatrix } from "./host_math.js";

const DEFAULT_EPS = 1e-8;

interface OtbInputs {
  rewards: HostMatrix;
  mask: HostMatrix;
  groups: Map<string | number, number[]>;
  /** G_t, reward-to-go. */
  returns: Float64Array;
  /** W_t, cumulative energy over the masked tokens. */
  energy: Float64Array;
}

function otbInputs(args: AdvEstimatorArgs, name: string): OtbInputs {
  if (!args.sumPiSquared) {
    throw new Error(`advantage estimator '${name}' needs sum_pi_squared from the actor: set actor_rollout_ref.actor.calculate_sum_pi_squared=True`);
  }
  if (!args.oldLogProbs) throw new Error(`advantage estimator '${name}' needs old_log_probs in the batch`);
  const rewards = readMatrix(args.tokenLevelRewards, "tokenLevelRewards");
  const mask = readMatrix(args.responseMask, "responseMask");
  const old = readMatrix(args.oldLogProbs, "oldLogProbs");
  const spp = readMatrix(args.sumPiSquared, "sumPiSquared");
  sameShape(rewards, mask, "tokenLevelRewards", "responseMask");
  sameShape(rewards, old, "tokenLevelRewards", "oldLogProbs");
  sameShape(rewards, spp, "tokenLevelRewards", "sumPiSquared");
  const is = args.rolloutIsWeights ? readMatrix(args.rolloutIsWeights, "rolloutIsWeights") : null;
  if (is) sameShape(rewards, is, "tokenLevelRewards", "rolloutIsWeights");
  const { rows, cols } = rewards;
  const returns = new Float64Array(rows * cols), energy = new Float64Array(rows * cols);
  for (let i = 0; i < rows; i++) {
    let g = 0;
    for (let t = cols - 1; t >= 0; t--) {
      const k = i * cols + t;
      g += rewards.data[k]! * mask.data[k]!;
      returns[k] = g;
    }
    let w = 0;
    for (let t = 0; t < cols; t++) {
      const k = i * cols + t;
      let step = 1 - 2 * Math.exp(old.data[k]!) + spp.data[k]!;
      if (is) step *= is.data[k]! ** 2;
      w += step * mask.data[k]!;
      energy[k] = w;
    }
  }
  return { rewards, mask, groups: groupRows(args.index, rows, name), returns, energy };
}

/** Zero the baseline of the group's single longest trajectory from the second-longest length on. */
function zeroTail(baselines: Float64Array, rows: number[], lengths: (r: number) => number, width: number): void {
  if (rows.length < 2) return;
  const sorted = rows.map(lengths).sort((a, b) => a - b);
  const max = sorted[sorted.length - 1]!, second = sorted[sorted.length - 2]!;
  const longest = rows.filter((r) => lengths(r) === max);
  if (longest.length === 1 && max > second) for (let t = second; t < width; t++) baselines[longest[0]! * width + t] = 0;
}

/** B_t over `rows` at each of `width` positions, from per-row value/energy/mask lookups. */
function groupBaseline(rows: number[], width: number, at: (r: number, t: number) => { g: number; w: number; m: number }, eps: number): Float64Array {
  const b = new Float64Array(width);
  for (let t = 0; t < width; t++) {
    let num = 0, den = 0;
    for (const r of rows) {
      const { g, w, m } = at(r, t);
      num += g * w * m;
      den += w * m;
    }
    b[t] = num / (den + eps);
  }
  return b;
}

/** verl's optimal_token_baseline (handle_zero_tail off). */
export function computeOptimalTokenBaselineAdvantage(args: AdvEstimatorArgs): AdvEstimatorOutput {
  const { mask, groups, returns, energy } = otbInputs(args, "optimal_token_baseline");
  const { rows: B, cols: T } = mask, eps = args.epsilon ?? DEFAULT_EPS;
  const baselines = new Float64Array(B * T);
  for (const rows of groups.values()) {
    if (rows.length === 1) continue;
    const b = groupBaseline(rows, T, (r, t) => ({ g: returns[r * T + t]!, w: energy[r * T + t]!, m: mask.data[r * T + t]! }), eps);
    for (const r of rows) baselines.set(b, r * T);
  }
  const adv = returns.map((g, k) => (g - baselines[k]!) * mask.data[k]!);
  return { advantages: toTensor2D(adv, B, T), returns: toTensor2D(returns, B, T) };
}

/**
 * verl's tir_optimal_token_baseline: the same baseline over each row's model tokens packed
 * to the left, with handle_zero_tail on; advantages are scattered back to the masked slots.
 */
export function computeTirOptimalTokenBaselineAdvantage(args: AdvEstimatorArgs): AdvEstimatorOutput {
  const { mask, groups, returns, energy } = otbInputs(args, "tir_optimal_token_baseline");
  const { rows: B, cols: T } = mask, eps = args.epsilon ?? DEFAULT_EPS;
  const slots: number[][] = Array.from({ length: B }, (_, i) => {
    const s: number[] = [];
    for (let t = 0; t < T; t++) if (mask.data[i * T + t]) s.push(i * T + t);
    return s;
  });
  const width = Math.max(0, ...slots.map((s) => s.length));
  const packed = (src: Float64Array) => {
    const out = new Float64Array(B * width);
    slots.forEach((s, i) => s.forEach((k, j) => (out[i * width + j] = src[k]!)));
    return out;
  };
  const G = packed(returns), W = packed(energy);
  const baselines = new Float64Array(B * width);
  for (const all of groups.values()) {
    const rows = all.filter((r) => slots[r]!.length > 0);
    if (rows.length < 2) continue;
    // packed padding holds G = W = 0, so it adds nothing to either sum
    const b = groupBaseline(rows, width, (r, t) => ({ g: G[r * width + t]!, w: W[r * width + t]!, m: 1 }), eps);
    for (const r of rows) baselines.set(b, r * width);
    zeroTail(baselines, rows, (r) => slots[r]!.length, width);
  }
  const adv = new Float64Array(B * T);
  slots.forEach((s, i) => s.forEach((k, j) => (adv[k] = (G[i * width + j]! - baselines[i * width + j]!) * mask.data[k]!)));
  return { advantages: toTensor2D(adv, B, T), returns: toTensor2D(returns, B, T) };
}
