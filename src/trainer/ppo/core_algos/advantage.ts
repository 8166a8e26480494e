// Token-level advantage estimators: GAE, REINFORCE++ and ReMax (verl core_algos §4.1).
// They return {advantages, returns} as [B,T] float32 tensors; masked positions carry
// whatever the recursion leaves there (callers re-mask), as in verl.
import type { AdvEstimatorArgs, AdvEstimatorOutput } from "./types.js";
import { maskedWhitenHost, readMatrix, readVector, sameShape, toTensor2D } from "./host_math.js";

/** Blend `next` and `carry` by the mask value, without letting a NaN in a skipped slot leak. */
function keepWhereMasked(m: number, next: number, carry: number): number {
  if (m === 0) return carry;
  if (m === 1) return next;
  return next * m + (1 - m) * carry;
}

function discount(args: AdvEstimatorArgs, key: "gamma" | "lam"): number {
  const v = args[key] ?? args.config?.[key] ?? 1.0;
  if (typeof v !== "number" || !Number.isFinite(v)) throw new Error(`advantage estimator: ${key} must be a finite number, got ${String(v)}`);
  return v;
}

/**
 * Generalised advantage estimation. Tokens whose mask is 0 (tool output in a
 * multi-turn response) are skipped: the TD recursion jumps over them, so their values
 * never matter. Advantages are whitened over the mask; returns = raw advantages + values.
 */
export function computeGaeAdvantageReturn(args: AdvEstimatorArgs): AdvEstimatorOutput {
  if (!args.values) throw new Error("advantage estimator 'gae' needs `values` (the critic's values; enable the critic)");
  const rewards = readMatrix(args.tokenLevelRewards, "tokenLevelRewards");
  const values = readMatrix(args.values, "values");
  const mask = readMatrix(args.responseMask, "responseMask");
  sameShape(rewards, values, "tokenLevelRewards", "values");
  sameShape(rewards, mask, "tokenLevelRewards", "responseMask");
  const gamma = discount(args, "gamma"), lam = discount(args, "lam");
  const { rows, cols } = rewards;
  const adv = new Float64Array(rows * cols);
  const ret = new Float64Array(rows * cols);
  for (let i = 0; i < rows; i++) {
    let nextValue = 0, lastGaeLam = 0;
    for (let t = cols - 1; t >= 0; t--) {
      const k = i * cols + t, m = mask.data[k]!, v = values.data[k]!;
      const delta = rewards.data[k]! + gamma * nextValue - v;
      const gae = delta + gamma * lam * lastGaeLam;
      nextValue = keepWhereMasked(m, v, nextValue);
      lastGaeLam = keepWhereMasked(m, gae, lastGaeLam);
      adv[k] = lastGaeLam;
      ret[k] = lastGaeLam + v;
    }
  }
  return { advantages: toTensor2D(maskedWhitenHost(adv, mask.data), rows, cols), returns: toTensor2D(ret, rows, cols) };
}

/**
 * REINFORCE++: discounted return G_t = r_t + γ·G_{t+1}, reset at every masked token;
 * advantages = whiten(G) over the mask, ×mask; returns = G.
 */
export function computeReinforcePlusPlusOutcomeAdvantage(args: AdvEstimatorArgs): AdvEstimatorOutput {
  const rewards = readMatrix(args.tokenLevelRewards, "tokenLevelRewards");
  const mask = readMatrix(args.responseMask, "responseMask");
  sameShape(rewards, mask, "tokenLevelRewards", "responseMask");
  const gamma = discount(args, "gamma");
  const { rows, cols } = rewards;
  const ret = new Float64Array(rows * cols);
  for (let i = 0; i < rows; i++) {
    let running = 0;
    for (let t = cols - 1; t >= 0; t--) {
      const k = i * cols + t;
      running = rewards.data[k]! + gamma * running;
      ret[k] = running;
      running *= mask.data[k]!;
    }
  }
  const adv = maskedWhitenHost(ret, mask.data).map((a, k) => a * mask.data[k]!);
  return { advantages: toTensor2D(adv, rows, cols), returns: toTensor2D(ret, rows, cols) };
}

/** ReMax: returns = reverse cumulative sum of r·mask; advantages = returns − baseline·mask. */
export function computeRemaxOutcomeAdvantage(args: AdvEstimatorArgs): AdvEstimatorOutput {
  if (!args.rewardBaselines) throw new Error("advantage estimator 'remax' needs `rewardBaselines` (the greedy rollout's rewards, batch key reward_baselines)");
  const rewards = readMatrix(args.tokenLevelRewards, "tokenLevelRewards");
  const mask = readMatrix(args.responseMask, "responseMask");
  sameShape(rewards, mask, "tokenLevelRewards", "responseMask");
  const { rows, cols } = rewards;
  const baselines = readVector(args.rewardBaselines, "rewardBaselines", rows);
  const ret = new Float64Array(rows * cols);
  const adv = new Float64Array(rows * cols);
  for (let i = 0; i < rows; i++) {
    let acc = 0;
    for (let t = cols - 1; t >= 0; t--) {
      const k = i * cols + t, m = mask.data[k]!;
      acc += rewards.data[k]! * m;
      ret[k] = acc;
      adv[k] = acc - baselines[i]! * m;
    }
  }
  return { advantages: toTensor2D(adv, rows, cols), returns: toTensor2D(ret, rows, cols) };
}
