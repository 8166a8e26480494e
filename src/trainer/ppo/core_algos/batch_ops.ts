// Driver-side steps on a whole batch (verl ray_trainer helpers): the response mask,
// the in-reward KL penalty, the advantage computation and PF-PPO resampling. They
// read and write DataProto columns (typed arrays) and use tensors only inside.
import * as tf from "@tensorflow/tfjs";
import { tensor, type TensorData } from "../../../protocol/tensor.js";
import type { Rng } from "../../../utils/rng.js";
import type { AdvEstimatorArgs, AlgoConfig, DataProtoLike } from "./types.js";
import { getAdvEstimator } from "./registry.js";
import { klPenalty, type KlController } from "./kl.js";

function column(data: DataProtoLike, key: string, purpose: string): TensorData {
  const t = data.batch[key];
  if (!t) throw new Error(`batch key '${key}' is missing (needed by ${purpose}); present: ${Object.keys(data.batch).join(", ") || "none"}`);
  return t;
}

function toTf(t: TensorData, asFloat = true): tf.Tensor {
  const x = tf.tensor(t.data, t.shape, t.dtype === "float32" ? "float32" : "int32");
  return asFloat && x.dtype !== "float32" ? tf.cast(x, "float32") : x;
}

async function toTensorData(t: tf.Tensor): Promise<TensorData> {
  return tensor(Float32Array.from(await t.data()), [...t.shape], "float32");
}

/** attention_mask[:, -R:] with R = responses.shape[1] (verl compute_response_mask). */
export function computeResponseMask(data: DataProtoLike): TensorData {
  const responses = column(data, "responses", "computeResponseMask");
  const attention = column(data, "attention_mask", "computeResponseMask");
  const [rows, total] = attention.shape as [number, number];
  const r = responses.shape[1]!;
  if (r > total) throw new Error(`responses has ${r} columns but attention_mask only ${total}`);
  const out = new Int32Array(rows * r);
  for (let i = 0; i < rows; i++) for (let t = 0; t < r; t++) out[i * r + t] = Number(attention.data[i * total + total - r + t]);
  return tensor(out, [rows, r], "int32");
}

function ensureResponseMask(data: DataProtoLike): TensorData {
  data.batch.response_mask ??= computeResponseMask(data);
  return data.batch.response_mask;
}

/**
 * In-reward KL: token_level_rewards = token_level_scores − β·kl(old_log_probs, ref_log_prob)·mask,
 * with β the controller's value; then the controller sees the batch's mean per-sequence KL.
 */
export async function applyKlPenalty(data: DataProtoLike, klCtrl: KlController, klPenaltyKind = "kl"): Promise<Record<string, number>> {
  const purpose = "the in-reward KL penalty (algorithm.use_kl_in_reward)";
  const mask = ensureResponseMask(data);
  const scores = column(data, "token_level_scores", purpose);
  const old = column(data, "old_log_probs", purpose);
  const ref = column(data, "ref_log_prob", purpose);
  const beta = klCtrl.value;
  const [rewardsT, klT] = tf.tidy(() => {
    const m = toTf(mask);
    const kld = tf.mul(klPenalty(toTf(old), toTf(ref), klPenaltyKind), m);
    const perSeq = tf.div(tf.sum(kld, -1), tf.add(tf.sum(m, -1), 1e-8));
    return [tf.sub(toTf(scores), tf.mul(beta, kld)), tf.mean(perSeq)];
  });
  const currentKl = (await klT.data())[0]!;
  data.batch.token_level_rewards = await toTensorData(rewardsT);
  tf.dispose([rewardsT, klT]);
  klCtrl.update(currentKl, scores.shape[0]!);
  return { "actor/reward_kl_penalty": currentKl, "actor/reward_kl_penalty_coeff": beta };
}

export interface ComputeAdvantageOptions {
  advEstimator: string;
  gamma?: number;
  lam?: number;
  /** Kept for verl signature parity (unused there too). */
  numRepeat?: number;
  normAdvByStdInGrpo?: boolean;
  /** The `algorithm` section (use_pf_ppo, pf_ppo, gamma, ...). */
  config?: AlgoConfig;
  /** Needed when algorithm.use_pf_ppo resamples the batch. */
  rng?: Rng;
}

function groupIndex(data: DataProtoLike): (string | number)[] | undefined {
  const uid = data.nonTensorBatch.uid;
  if (!uid) return undefined;
  return uid.map((u, row) => {
    if (typeof u !== "string" && typeof u !== "number") throw new Error(`non-tensor 'uid' at row ${row} must be a string or number, got ${typeof u}`);
    return u;
  });
}

/**
 * Run the estimator named `advEstimator` over the batch (token_level_rewards,
 * response_mask, values / reward_baselines / old_log_probs / sum_pi_squared /
 * rollout_is_weights / uid when present) and write
 * `advantages` and `returns` back. Returns the batch (resampled when PF-PPO is on).
 */
export async function computeAdvantage<D extends DataProtoLike>(data: D, opts: ComputeAdvantageOptions): Promise<D> {
  const fn = getAdvEstimator(opts.advEstimator);
  const rewards = column(data, "token_level_rewards", `advantage estimator '${opts.advEstimator}'`);
  const mask = ensureResponseMask(data);
  const out = tf.tidy(() => {
    const args: AdvEstimatorArgs = {
      tokenLevelRewards: toTf(rewards),
      responseMask: toTf(mask),
      index: groupIndex(data),
      gamma: opts.gamma ?? opts.config?.gamma ?? 1.0,
      lam: opts.lam ?? opts.config?.lam ?? 1.0,
      normAdvByStdInGrpo: opts.normAdvByStdInGrpo ?? opts.config?.norm_adv_by_std_in_grpo ?? true,
      config: opts.config,
      data,
    };
    if (data.batch.values) args.values = toTf(data.batch.values);
    if (data.batch.reward_baselines) args.rewardBaselines = toTf(data.batch.reward_baselines);
    if (data.batch.old_log_probs) args.oldLogProbs = toTf(data.batch.old_log_probs);
    if (data.batch.sum_pi_squared) args.sumPiSquared = toTf(data.batch.sum_pi_squared);
    if (data.batch.rollout_is_weights) args.rolloutIsWeights = toTf(data.batch.rollout_is_weights);
    const res = fn(args);
    return { advantages: res.advantages, returns: res.returns };
  });
  for (const key of ["advantages", "returns"] as const) {
    if (out[key].shape.join() !== rewards.shape.join()) {
      tf.dispose([out.advantages, out.returns]);
      throw new Error(`advantage estimator '${opts.advEstimator}' returned ${key} of shape [${out[key].shape.join(", ")}], expected [${rewards.shape.join(", ")}]`);
    }
  }
  data.batch.advantages = await toTensorData(out.advantages);
  data.batch.returns = await toTensorData(out.returns);
  tf.dispose([out.advantages, out.returns]);
  if (opts.advEstimator === "gae" && opts.config?.use_pf_ppo) return pfPpoResample(data, opts);
  return data;
}

function pfPpoResample<D extends DataProtoLike>(data: D, opts: ComputeAdvantageOptions): D {
  if (!opts.rng) throw new Error("algorithm.use_pf_ppo resamples the batch and needs `rng` in computeAdvantage options");
  const select = (data as unknown as { selectIdxs?: (idx: number[]) => D }).selectIdxs;
  if (typeof select !== "function") throw new Error("algorithm.use_pf_ppo needs a DataProto (with selectIdxs) to resample");
  const scores = column(data, "token_level_scores", "PF-PPO reweighting");
  const rows = scores.shape[0]!, cols = scores.shape[1] ?? 1;
  const sums = Array.from({ length: rows }, (_, i) => {
    let s = 0;
    for (let t = 0; t < cols; t++) s += scores.data[i * cols + t]!;
    return s;
  });
  const idx = pfPpoSampleIndices(sums, opts.config?.pf_ppo?.reweight_method ?? "pow", opts.config?.pf_ppo?.weight_pow ?? 2.0, opts.rng);
  return select.call(data, idx);
}

/**
 * PF-PPO: weights from the sequence scores (pow: |s|^p; max_min: 1 at the max and min
 * else 0; max_random: 0.4 at the max else 0.1), +1e-8, then as many draws with
 * replacement as there are rows.
 */
export function pfPpoSampleIndices(scores: readonly number[], method: string, weightPow: number, rng: Rng): number[] {
  let weights: number[];
  const max = Math.max(...scores), min = Math.min(...scores);
  if (method === "pow") weights = scores.map((s) => Math.abs(s) ** weightPow);
  else if (method === "max_min") weights = scores.map((s) => (s === max || s === min ? 1 : 0));
  else if (method === "max_random") weights = scores.map((s) => (s === max ? 0.4 : 0.1));
  else throw new Error(`unsupported algorithm.pf_ppo.reweight_method '${method}'; choose pow, max_min or max_random`);
  weights = weights.map((w) => Math.max(w + 1e-8, 1e-8));
  const cdf: number[] = [];
  let acc = 0;
  for (const w of weights) cdf.push((acc += w));
  return scores.map(() => {
    const u = rng.random() * acc;
    let lo = 0, hi = cdf.length - 1;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (cdf[mid]! > u) hi = mid;
      else lo = mid + 1;
    }
    return lo;
  });
}
