// verl's rollout correction (algorithm.rollout_correction; decoupled mode here,
// bypass mode's loss in core_algos/policy_loss_bypass.ts): the
// rollout engine samples with its own numerics (llama.cpp vs the training
// engine), so the trainer's old_log_probs and the engine's rollout_log_probs
// differ a little. From log_ratio = old_log_probs - rollout_log_probs this gives
// truncated importance-sampling weights (per token, or per sequence as the
// product of its tokens' ratios), a rejection mask from divergence estimators
// (k1 = -log_ratio, k2 = log_ratio^2 / 2, k3 = e^log_ratio - 1 - log_ratio; per
// token, or summed / averaged / maxed over a sequence), and off-policy
// diagnostics (KL, perplexities, chi^2), under verl's "rollout_corr/" names.
// Host math on the [B, R] arrays: the driver runs it once per batch, as verl does.
import type { DataProto } from "../../protocol/data_proto.js";
import { tensor, type TensorData } from "../../protocol/tensor.js";

export interface RolloutCorrectionConfig {
  rolloutIs: "token" | "sequence" | null;
  rolloutIsThreshold: number;
  rolloutIsBatchNormalize: boolean;
  rolloutRs: string | null;
  rolloutRsThreshold: string | number | null;
}

export interface RolloutCorrectionResult {
  /** rollout_is_weights [B, R] (truncated, 0 on padding); absent when rollout_is is off. */
  weights?: Float32Array;
  /** response_mask with rejected tokens set to 0. */
  responseMask: Int32Array;
  metrics: Record<string, number>;
}

/** exp(±20) bounds every exponent, as verl does. */
const SAFETY_BOUND = 20;
const RS_OPTIONS = ["token_k1", "token_k2", "token_k3", "seq_sum_k1", "seq_sum_k2", "seq_sum_k3", "seq_mean_k1", "seq_mean_k2", "seq_mean_k3", "seq_max_k2", "seq_max_k3"];
const KEY = "algorithm.rollout_correction";

const clampSafe = (x: number) => Math.min(SAFETY_BOUND, Math.max(-SAFETY_BOUND, x));

/** Masked reductions over [B, R] with verl's conventions (means divide by count + 1e-8). */
class Masked {
  readonly rowCount: Float64Array;
  readonly total: number;
  readonly validRows: number[];

  constructor(readonly mask: ArrayLike<number>, readonly B: number, readonly R: number) {
    this.rowCount = new Float64Array(B);
    let total = 0;
    for (let b = 0; b < B; b++) {
      for (let t = 0; t < R; t++) this.rowCount[b] += mask[b * R + t] ? 1 : 0;
      total += this.rowCount[b]!;
    }
    this.total = total;
    this.validRows = Array.from({ length: B }, (_, b) => b).filter((b) => this.rowCount[b]! > 0);
  }

  mean(f: (i: number) => number): number {
    let s = 0;
    for (let i = 0; i < this.B * this.R; i++) if (this.mask[i]) s += f(i);
    return s / (this.total + 1e-8);
  }
  rowSum(b: number, f: (i: number) => number): number {
    let s = 0;
    for (let t = 0; t < this.R; t++) if (this.mask[b * this.R + t]) s += f(b * this.R + t);
    return s;
  }
  rowMean(b: number, f: (i: number) => number): number {
    return this.rowSum(b, f) / (this.rowCount[b]! + 1e-8);
  }
  rowMax(b: number, f: (i: number) => number): number {
    let m = -Infinity;
    for (let t = 0; t < this.R; t++) if (this.mask[b * this.R + t]) m = Math.max(m, f(b * this.R + t));
    return m === -Infinity ? 0 : m;
  }
  extreme(f: (i: number) => number, pick: (a: number, b: number) => number, start: number): number {
    let m = start;
    for (let i = 0; i < this.B * this.R; i++) if (this.mask[i]) m = pick(m, f(i));
    return m;
  }
}

const mean = (xs: number[]) => (xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : 0);
/** torch's std: unbiased (n - 1). */
const std = (xs: number[]) => {
  if (xs.length < 2) return 0;
  const m = mean(xs);
  return Math.sqrt(xs.reduce((a, x) => a + (x - m) ** 2, 0) / (xs.length - 1));
};

/** std of a statistic clamped to [lo, hi] over the valid tokens (0 with one token or none). */
function clampedStd(m: Masked, f: (i: number) => number, lo: number, hi: number): number {
  if (m.total <= 1) return 0;
  const c = (i: number) => Math.min(hi, Math.max(lo, f(i)));
  const mu = m.mean(c);
  return Math.sqrt(Math.max(m.mean((i) => c(i) ** 2) - mu * mu, 0));
}

function isWeights(logRatio: Float32Array, m: Masked, cfg: RolloutCorrectionConfig): { weights: Float32Array; metrics: Record<string, number> } {
  const { B, R } = m, thr = cfg.rolloutIsThreshold, lower = 1 / thr;
  if (!(thr > 0)) throw new Error(`${KEY}.rollout_is_threshold must be positive, got ${thr}`);
  const w = new Float32Array(B * R);
  const metrics: Record<string, number> = {};
  if (cfg.rolloutIs === "token") {
    for (let i = 0; i < B * R; i++) w[i] = m.mask[i] ? Math.exp(clampSafe(logRatio[i]!)) : 0;
    metrics.rollout_is_mean = m.mean((i) => w[i]!);
    metrics.rollout_is_ratio_fraction_high = m.mean((i) => (w[i]! > thr ? 1 : 0));
    metrics.rollout_is_ratio_fraction_low = m.mean((i) => (w[i]! < lower ? 1 : 0));
    metrics.rollout_is_max = m.extreme((i) => w[i]!, Math.max, -Infinity);
    metrics.rollout_is_min = m.extreme((i) => w[i]!, Math.min, Infinity);
  } else {
    const sums = Array.from({ length: B }, (_, b) => m.rowSum(b, (i) => logRatio[i]!));
    for (let b = 0; b < B; b++) {
      const v = Math.exp(clampSafe(sums[b]!));
      for (let t = 0; t < R; t++) w[b * R + t] = m.mask[b * R + t] ? v : 0;
    }
    metrics.rollout_is_max = Math.exp(Math.min(Math.max(...sums), SAFETY_BOUND));
    metrics.rollout_is_min = Math.exp(Math.min(...sums));
    metrics.rollout_is_mean = m.mean((i) => w[i]!);
    metrics.rollout_is_ratio_fraction_high = mean(sums.map((s) => (s > Math.log(thr) ? 1 : 0)));
    metrics.rollout_is_ratio_fraction_low = mean(sums.map((s) => (s < Math.log(lower) ? 1 : 0)));
  }
  metrics.rollout_is_std = clampedStd(m, (i) => w[i]!, lower, thr);
  const clamped = (i: number) => Math.min(thr, Math.max(lower, w[i]!));
  const mc = m.mean(clamped);
  metrics.rollout_is_eff_sample_size = 1 / m.mean((i) => (clamped(i) / (mc + 1e-8)) ** 2);
  const seqMeans = Array.from({ length: B }, (_, b) => m.rowMean(b, (i) => w[i]!));
  metrics.rollout_is_seq_mean = mean(seqMeans);
  metrics.rollout_is_seq_std = std(seqMeans);
  metrics.rollout_is_seq_max = Math.max(...seqMeans);
  metrics.rollout_is_seq_min = Math.min(...seqMeans);
  metrics.rollout_is_seq_max_deviation = Math.max(...seqMeans.map((s) => Math.abs(s - 1)));
  metrics.rollout_is_seq_fraction_high = mean(seqMeans.map((s) => (s > thr ? 1 : 0)));
  metrics.rollout_is_seq_fraction_low = mean(seqMeans.map((s) => (s < lower ? 1 : 0)));

  // truncated importance sampling
  for (let i = 0; i < w.length; i++) w[i] = Math.min(w[i]!, thr);
  if (cfg.rolloutIsBatchNormalize) {
    const norm = cfg.rolloutIs === "token"
      ? m.mean((i) => w[i]!)
      : m.validRows.reduce((a, b) => a + m.rowMean(b, (i) => w[i]!), 0) / Math.max(m.validRows.length, 1e-8);
    if (norm > 1e-8) for (let i = 0; i < w.length; i++) w[i] = w[i]! / norm;
    metrics.rollout_is_batch_norm_factor = norm > 1e-8 ? norm : 1;
  }
  return { weights: w, metrics };
}

interface Threshold { lower: number | null; upper: number }

/** verl's threshold spec: one value for all options or one per option; k1 options take "lower_upper" (default lower 1/upper). */
export function parseRsThresholds(options: string[], spec: string | number | null): Map<string, Threshold> {
  if (spec === null || spec === undefined) throw new Error(`${KEY}.rollout_rs_threshold must be set when rollout_rs is on`);
  let parts = typeof spec === "number" ? [String(spec)] : String(spec).split(",").map((s) => s.trim()).filter(Boolean);
  if (parts.length === 0) throw new Error(`${KEY}.rollout_rs_threshold holds no value`);
  if (parts.length !== 1 && parts.length !== options.length) {
    throw new Error(`${KEY}.rollout_rs_threshold: give one threshold for all options or exactly ${options.length} (one per rollout_rs option)`);
  }
  if (parts.length === 1) parts = options.map(() => parts[0]!);
  const out = new Map<string, Threshold>();
  options.forEach((opt, j) => {
    const p = parts[j]!, num = (s: string) => {
      const v = Number(s);
      if (!Number.isFinite(v) || v <= 0) throw new Error(`${KEY}.rollout_rs_threshold: '${p}' for ${opt} must be positive numbers`);
      return v;
    };
    if (opt.endsWith("k1")) {
      const [lo, hi] = p.includes("_") ? p.split("_", 2) as [string, string] : [undefined, p];
      const upper = num(hi);
      out.set(opt, { lower: lo === undefined ? 1 / upper : num(lo), upper });
    } else {
      if (p.includes("_")) throw new Error(`${KEY}.rollout_rs_threshold: ${opt} takes one upper bound, got '${p}'`);
      out.set(opt, { lower: null, upper: num(p) });
    }
  });
  return out;
}

/** rollout_rs's comma-separated options, deduplicated and checked. */
export function rsOptions(spec: string): string[] {
  const options = [...new Set(String(spec).split(",").map((s) => s.trim()).filter(Boolean))];
  if (options.length === 0) throw new Error(`${KEY}.rollout_rs holds no option`);
  for (const o of options) if (!RS_OPTIONS.includes(o)) throw new Error(`${KEY}.rollout_rs: unknown option '${o}' (one of ${RS_OPTIONS.join(", ")})`);
  return options;
}

function rejection(logRatio: Float32Array, m: Masked, cfg: RolloutCorrectionConfig): { keep: Float32Array; metrics: Record<string, number> } {
  const { B, R } = m;
  const options = rsOptions(String(cfg.rolloutRs));
  const thresholds = parseRsThresholds(options, cfg.rolloutRsThreshold);
  const lr = (i: number) => clampSafe(logRatio[i]!);
  const k = { k1: (i: number) => -lr(i), k2: (i: number) => 0.5 * lr(i) ** 2, k3: (i: number) => Math.exp(lr(i)) - 1 - lr(i) };
  const combined = new Float32Array(B * R).fill(1);
  const metrics: Record<string, number> = {};
  for (const opt of options) {
    const th = thresholds.get(opt)!, kind = opt.slice(-2) as "k1" | "k2" | "k3", isK1 = kind === "k1";
    const upper = isK1 ? Math.log(th.upper) : th.upper, lower = isK1 ? Math.log(th.lower!) : 0;
    const pass = (v: number) => v <= upper && (!isK1 || v >= lower);
    const tokenLevel = opt.startsWith("token");
    let stat: (i: number) => number, seqStat: number[] | undefined;
    if (tokenLevel) {
      stat = k[kind];
    } else {
      const agg = opt.startsWith("seq_sum") ? m.rowSum.bind(m) : opt.startsWith("seq_mean") ? m.rowMean.bind(m) : m.rowMax.bind(m);
      const s = (seqStat = Array.from({ length: B }, (_, b) => agg(b, k[kind])));
      stat = (i) => s[Math.floor(i / R)]!;
    }
    const keep = new Float32Array(B * R);
    for (let i = 0; i < B * R; i++) keep[i] = pass(stat(i)) ? 1 : 0;
    for (let i = 0; i < B * R; i++) combined[i]! *= keep[i]!;

    const p = `rollout_rs_${opt}`;
    const seqValues = seqStat ?? Array.from({ length: B }, (_, b) => m.rowMean(b, stat));
    const valid = m.validRows.map((b) => seqValues[b]!);
    const seqLevel = !tokenLevel && valid.length > 0;
    metrics[`${p}_mean`] = m.mean(stat);
    metrics[`${p}_max`] = seqLevel ? Math.max(...valid) : m.extreme(stat, Math.max, -Infinity);
    metrics[`${p}_min`] = seqLevel ? Math.min(...valid) : m.extreme(stat, Math.min, Infinity);
    metrics[`${p}_fraction_high`] = seqLevel ? mean(valid.map((v) => (v > upper ? 1 : 0))) : m.mean((i) => (stat(i) > upper ? 1 : 0));
    metrics[`${p}_fraction_low`] = !isK1 ? 0 : seqLevel ? mean(valid.map((v) => (v < lower ? 1 : 0))) : m.mean((i) => (stat(i) < lower ? 1 : 0));
    metrics[`${p}_std`] = clampedStd(m, stat, isK1 ? lower : 0, upper);
    metrics[`${p}_seq_mean`] = mean(valid);
    metrics[`${p}_seq_std`] = std(valid);
    metrics[`${p}_seq_max`] = valid.length ? Math.max(...valid) : 0;
    metrics[`${p}_seq_min`] = valid.length ? Math.min(...valid) : 0;
    metrics[`${p}_seq_max_deviation`] = valid.length ? Math.max(...valid.map(Math.abs)) : 0;
    metrics[`${p}_seq_fraction_high`] = mean(valid.map((v) => (v > upper ? 1 : 0)));
    if (isK1 || valid.length === 0) metrics[`${p}_seq_fraction_low`] = isK1 ? mean(valid.map((v) => (v < lower ? 1 : 0))) : 0;
    metrics[`${p}_masked_fraction`] = m.mean((i) => 1 - keep[i]!);
    const rowRejected = (b: number) => m.rowSum(b, (i) => 1 - keep[i]!) > 0;
    metrics[`${p}_seq_masked_fraction`] = m.validRows.length ? m.validRows.filter(rowRejected).length / m.validRows.length : 0;
  }
  metrics.rollout_rs_masked_fraction = m.mean((i) => 1 - combined[i]!);
  metrics.rollout_rs_seq_masked_fraction = mean(Array.from({ length: B }, (_, b): number => (m.rowSum(b, (i) => (combined[i]! > 0.5 ? 0 : 1)) > 0 ? 1 : 0)));
  return { keep: combined, metrics };
}

/** KL, perplexities and chi^2 between the training policy (old) and the rollout policy. */
export function offPolicyMetrics(oldLp: Float32Array, rolloutLp: Float32Array, m: Masked): Record<string, number> {
  const { B } = m, rows = Array.from({ length: B }, (_, b) => b);
  const lr = (i: number) => oldLp[i]! - rolloutLp[i]!;
  const mOld = rows.map((b) => m.rowMean(b, (i) => oldLp[i]!)), mRoll = rows.map((b) => m.rowMean(b, (i) => rolloutLp[i]!));
  const diff = rows.map((b) => mRoll[b]! - mOld[b]!);
  return {
    training_ppl: mean(mOld.map((x) => Math.exp(-x))),
    training_log_ppl: mean(mOld.map((x) => -x)),
    kl: m.mean((i) => rolloutLp[i]! - oldLp[i]!),
    k3_kl: m.mean((i) => Math.exp(lr(i)) - lr(i) - 1),
    rollout_ppl: mean(mRoll.map((x) => Math.exp(-x))),
    rollout_log_ppl: mean(mRoll.map((x) => -x)),
    log_ppl_diff: mean(diff),
    log_ppl_abs_diff: mean(diff.map(Math.abs)),
    log_ppl_diff_max: Math.max(...diff),
    log_ppl_diff_min: Math.min(...diff),
    ppl_ratio: mean(diff.map(Math.exp)),
    chi2_token: m.mean((i) => Math.exp(clampSafe(lr(i))) ** 2) - 1,
    chi2_seq: mean(rows.map((b) => Math.exp(2 * clampSafe(m.rowSum(b, lr))))) - 1,
  };
}

/**
 * IS weights, rejection mask and diagnostics for one batch ([B, R] row-major arrays).
 * The mask that comes back always has the rejections applied (all ones kept when rollout_rs is off).
 */
export function computeRolloutCorrection(
  oldLogProbs: Float32Array, rolloutLogProbs: Float32Array, responseMask: ArrayLike<number>, B: number, R: number, cfg: RolloutCorrectionConfig,
): RolloutCorrectionResult {
  if (oldLogProbs.length !== B * R || rolloutLogProbs.length !== B * R || responseMask.length !== B * R) {
    throw new Error(`rollout correction: old_log_probs, rollout_log_probs and response_mask must all be [${B}, ${R}]`);
  }
  const m = new Masked(responseMask, B, R);
  if (m.total === 0) throw new Error("rollout correction: response_mask holds no valid token");
  const logRatio = new Float32Array(B * R);
  for (let i = 0; i < B * R; i++) logRatio[i] = oldLogProbs[i]! - rolloutLogProbs[i]!;
  const metrics: Record<string, number> = {};
  let weights: Float32Array | undefined;
  if (cfg.rolloutIs !== null) {
    const r = isWeights(logRatio, m, cfg);
    weights = r.weights;
    Object.assign(metrics, r.metrics);
  }
  const mask = Int32Array.from({ length: B * R }, (_, i) => (responseMask[i] ? 1 : 0));
  if (cfg.rolloutRs !== null) {
    const r = rejection(logRatio, m, cfg);
    for (let i = 0; i < mask.length; i++) mask[i] = mask[i]! * r.keep[i]! > 0 ? 1 : 0;
    Object.assign(metrics, r.metrics);
  }
  Object.assign(metrics, offPolicyMetrics(oldLogProbs, rolloutLogProbs, m));
  return { weights, responseMask: mask, metrics: Object.fromEntries(Object.entries(metrics).map(([k, v]) => [`rollout_corr/${k}`, v])) };
}

/** The settings from algorithm.rollout_correction (a plain object from the config). */
export function rolloutCorrectionConfig(section: Record<string, unknown> | undefined): RolloutCorrectionConfig {
  const s = section ?? {};
  const is = s.rollout_is ?? null;
  if (is !== null && is !== "token" && is !== "sequence") throw new Error(`${KEY}.rollout_is must be null, token or sequence, got ${JSON.stringify(is)}`);
  const thr = s.rollout_is_threshold ?? 2.0;
  if (typeof thr !== "number") throw new Error(`${KEY}.rollout_is_threshold must be a number, got ${JSON.stringify(thr)}`);
  const rs = s.rollout_rs ?? null;
  if (rs !== null && typeof rs !== "string") throw new Error(`${KEY}.rollout_rs must be null or a string of options, got ${JSON.stringify(rs)}`);
  const rsThr = s.rollout_rs_threshold ?? null;
  if (rsThr !== null && typeof rsThr !== "string" && typeof rsThr !== "number") throw new Error(`${KEY}.rollout_rs_threshold must be a number or a string, got ${JSON.stringify(rsThr)}`);
  return { rolloutIs: is, rolloutIsThreshold: thr, rolloutIsBatchNormalize: s.rollout_is_batch_normalize === true, rolloutRs: rs, rolloutRsThreshold: rsThr };
}

/**
 * verl's compute_rollout_correction_and_add_to_batch: with rollout_log_probs in the batch,
 * replace response_mask by the rejection-applied mask, add rollout_is_weights when
 * rollout_is is on, and return the rollout_corr/ metrics.
 */
export function applyRolloutCorrection(batch: DataProto, section: Record<string, unknown> | undefined): Record<string, number> {
  const roll = batch.batch.rollout_log_probs;
  if (!roll) return {};
  const old = batch.batch.old_log_probs, mask = batch.batch.response_mask;
  if (!old || !mask) throw new Error("rollout correction: the batch needs old_log_probs and response_mask beside rollout_log_probs");
  const [B, R] = mask.shape as [number, number];
  const f32 = (t: TensorData) => (t.data instanceof Float32Array ? t.data : Float32Array.from(t.data as ArrayLike<number>));
  const out = computeRolloutCorrection(f32(old), f32(roll), mask.data as ArrayLike<number>, B, R, rolloutCorrectionConfig(section));
  batch.batch.response_mask = tensor(out.responseMask, [B, R], "int32");
  if (out.weights) batch.batch.rollout_is_weights = tensor(out.weights, [B, R], "float32");
  return out.metrics;
}

/** Whether algorithm.rollout_correction.bypass_mode is on. */
export function isBypassMode(section: Record<string, unknown> | undefined): boolean {
  return section?.bypass_mode === true;
}

/**
 * verl's apply_bypass_mode: old_log_probs are the rollout engine's log-probs (the actor's
 * log-prob pass is skipped); the actor then trains with the bypass_mode policy loss.
 */
export function applyBypassMode(batch: DataProto): void {
  const roll = batch.batch.rollout_log_probs;
  if (!roll) throw new Error(`${KEY}.bypass_mode=true needs rollout_log_probs in the batch: set actor_rollout_ref.rollout.calculate_log_probs=True`);
  batch.batch.old_log_probs = roll;
}
