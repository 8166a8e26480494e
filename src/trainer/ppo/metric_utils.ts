// Per-step data, timing and throughput metrics with verl's names (§5.1, §5.2),
// computed on the host from DataProto columns.
import type { TensorData } from "../../protocol/tensor.js";
import type { DataProtoLike } from "./core_algos/types.js";

export { reduceMetrics, Metric, appendToDict, type Aggregation } from "./metric_reduce.js";
export { processValidationMetrics, validationMetricsToDict, bootstrapMetric, calcMajVal, genNs } from "./validation_metrics.js";

function column(batch: DataProtoLike, key: string): TensorData {
  const t = batch.batch[key];
  if (!t) throw new Error(`metrics: batch key '${key}' is missing; present: ${Object.keys(batch.batch).join(", ") || "none"}`);
  return t;
}

interface Stats { mean: number; max: number; min: number }

function stats(xs: ArrayLike<number>): Stats {
  let s = 0, max = -Infinity, min = Infinity;
  for (let i = 0; i < xs.length; i++) {
    const x = xs[i]!;
    s += x;
    if (x > max) max = x;
    if (x < min) min = x;
  }
  return { mean: xs.length ? s / xs.length : NaN, max: xs.length ? max : NaN, min: xs.length ? min : NaN };
}

/** torch.var (unbiased). */
function varianceUnbiased(xs: ArrayLike<number>): number {
  const n = xs.length;
  if (n < 2) return NaN;
  let s = 0;
  for (let i = 0; i < n; i++) s += xs[i]!;
  const mu = s / n;
  let q = 0;
  for (let i = 0; i < n; i++) q += (xs[i]! - mu) ** 2;
  return q / (n - 1);
}

function rowSums(t: TensorData, from = 0, to?: number): Float64Array {
  const rows = t.shape[0]!, cols = t.shape[1] ?? 1, end = to ?? cols;
  const out = new Float64Array(rows);
  for (let i = 0; i < rows; i++) {
    let s = 0;
    for (let c = from; c < end; c++) s += Number(t.data[i * cols + c]);
    out[i] = s;
  }
  return out;
}

/** Elements of `t` where `mask` is non-zero. */
function maskedSelect(t: TensorData, mask: TensorData): number[] {
  const out: number[] = [];
  for (let k = 0; k < t.data.length; k++) if (mask.data[k]) out.push(Number(t.data[k]));
  return out;
}

/** Prompt and response lengths from attention_mask (all attended tokens, tool output included). */
export function computeResponseInfo(batch: DataProtoLike): { promptLength: Float64Array; responseLength: Float64Array; maxPromptLength: number; maxResponseLength: number } {
  const responses = column(batch, "responses");
  const attention = column(batch, "attention_mask");
  const width = attention.shape[1]!, r = responses.shape[1]!;
  return {
    promptLength: rowSums(attention, 0, width - r),
    responseLength: rowSums(attention, width - r, width),
    maxPromptLength: width - r,
    maxResponseLength: r,
  };
}

function fractionEqual(xs: ArrayLike<number>, v: number): number {
  let c = 0;
  for (let i = 0; i < xs.length; i++) if (xs[i] === v) c++;
  return xs.length ? c / xs.length : NaN;
}

function numericList(values: unknown[], key: string): number[] {
  return values.map((v, i) => {
    const n = typeof v === "bigint" ? Number(v) : v;
    if (typeof n !== "number") throw new Error(`metrics: non-tensor '${key}' row ${i} is not a number`);
    return n;
  });
}

/**
 * critic/score|rewards/{mean,max,min} (sequence sums over non-aborted rows),
 * critic/advantages|returns[|values]/{mean,max,min} over response tokens,
 * critic/vf_explained_var, response_length[_non_aborted]/*, response/aborted_ratio,
 * prompt_length/*, num_turns/* and tool_call_counts/* when present.
 */
export function computeDataMetrics(batch: DataProtoLike, useCritic = true): Record<string, number> {
  const scores = rowSums(column(batch, "token_level_scores"));
  const rewards = rowSums(column(batch, "token_level_rewards"));
  const mask = column(batch, "response_mask");
  const { promptLength, responseLength, maxPromptLength, maxResponseLength } = computeResponseInfo(batch);
  const keep = Array.from(responseLength, (l) => l !== 0);
  const nonAborted = keep.filter(Boolean).length;
  if (nonAborted === 0) throw new Error("metrics: every response in the batch is empty (aborted); nothing to measure");
  const pick = (xs: Float64Array) => Array.from(xs).filter((_, i) => keep[i]);
  const score = stats(pick(scores)), reward = stats(pick(rewards));
  const adv = stats(maskedSelect(column(batch, "advantages"), mask));
  const returnsSel = maskedSelect(column(batch, "returns"), mask);
  const ret = stats(returnsSel);
  const respLen = stats(responseLength), promptLen = stats(promptLength);
  const respLenKept = pick(responseLength);
  const kept = stats(respLenKept);
  const metrics: Record<string, number> = {
    "critic/score/mean": score.mean, "critic/score/max": score.max, "critic/score/min": score.min,
    "critic/rewards/mean": reward.mean, "critic/rewards/max": reward.max, "critic/rewards/min": reward.min,
    "critic/advantages/mean": adv.mean, "critic/advantages/max": adv.max, "critic/advantages/min": adv.min,
    "critic/returns/mean": ret.mean, "critic/returns/max": ret.max, "critic/returns/min": ret.min,
  };
  if (useCritic) {
    const valuesSel = maskedSelect(column(batch, "values"), mask);
    const v = stats(valuesSel);
    const diff = returnsSel.map((r, i) => r - valuesSel[i]!);
    Object.assign(metrics, {
      "critic/values/mean": v.mean, "critic/values/max": v.max, "critic/values/min": v.min,
      "critic/vf_explained_var": 1 - varianceUnbiased(diff) / (varianceUnbiased(returnsSel) + 1e-5),
    });
  }
  Object.assign(metrics, {
    "response_length/mean": respLen.mean, "response_length/max": respLen.max, "response_length/min": respLen.min,
    "response_length/clip_ratio": fractionEqual(responseLength, maxResponseLength),
    "response_length_non_aborted/mean": kept.mean, "response_length_non_aborted/max": kept.max,
    "response_length_non_aborted/min": kept.min, "response_length_non_aborted/clip_ratio": fractionEqual(respLenKept, maxResponseLength),
    "response/aborted_ratio": 1 - nonAborted / keep.length,
    "prompt_length/mean": promptLen.mean, "prompt_length/max": promptLen.max, "prompt_length/min": promptLen.min,
    "prompt_length/clip_ratio": fractionEqual(promptLength, maxPromptLength),
  });
  for (const [key, prefix] of [["__num_turns__", "num_turns"], ["tool_call_counts", "tool_call_counts"]] as const) {
    const col = batch.nonTensorBatch[key];
    if (!col) continue;
    const s = stats(numericList(col, key));
    Object.assign(metrics, { [`${prefix}/min`]: s.min, [`${prefix}/max`]: s.max, [`${prefix}/mean`]: s.mean });
  }
  return metrics;
}

/** timing_s/<name> for every timer, timing_per_token_ms/<name> for gen (÷ response tokens) and ref, values, adv, update_critic, update_actor (÷ all tokens). */
export function computeTimingMetrics(batch: DataProtoLike, timingRaw: Record<string, number>): Record<string, number> {
  const { promptLength, responseLength } = computeResponseInfo(batch);
  const responseTokens = responseLength.reduce((a, b) => a + b, 0);
  const allTokens = promptLength.reduce((a, b) => a + b, 0) + responseTokens;
  const perSection: Record<string, number> = { gen: responseTokens };
  for (const name of ["ref", "values", "adv", "update_critic", "update_actor"]) perSection[name] = allTokens;
  const out: Record<string, number> = {};
  for (const [name, seconds] of Object.entries(timingRaw)) out[`timing_s/${name}`] = seconds;
  for (const [name, tokens] of Object.entries(perSection)) {
    if (name in timingRaw) out[`timing_per_token_ms/${name}`] = (timingRaw[name]! * 1000) / tokens;
  }
  return out;
}

/** perf/total_num_tokens (Σ meta_info.global_token_num), perf/time_per_step (timing 'step'), perf/throughput = tokens/(time·nGpus). */
export function computeThroughputMetrics(batch: DataProtoLike, timingRaw: Record<string, number>, nGpus: number): Record<string, number> {
  const perRow = batch.metaInfo.global_token_num;
  if (!Array.isArray(perRow)) throw new Error("metrics: meta_info.global_token_num (tokens per row) is missing; set it before computing throughput");
  const total = numericList(perRow, "global_token_num").reduce((a, b) => a + b, 0);
  const time = timingRaw.step;
  if (typeof time !== "number") throw new Error("metrics: timing 'step' is missing; throughput needs the step time");
  return { "perf/total_num_tokens": total, "perf/time_per_step": time, "perf/throughput": total / (time * nGpus) };
}

/**
 * verl's gradient-variance proxies (variance_proxy/*), from the actor's Σπ² when the batch has it:
 * W(τ) = Σ_t (1 − 2π_t + Σπ²_t)·mask (×ρ_t² with rollout IS weights), Ā(τ) the mean advantage
 * over the response; total power E[Ā²·max(W, 0)] (with IS weights E[ρ̄²·Ā²·W] on the unweighted
 * W), signal strength grad_norm², pure noise max(0, (power − signal)/(N − 1)).
 */
export function computeVarianceProxyMetrics(batch: DataProtoLike, gradNorm?: number): Record<string, number> {
  const spp = batch.batch.sum_pi_squared, old = batch.batch.old_log_probs, adv = batch.batch.advantages, mask = batch.batch.response_mask;
  if (!spp || !old || !adv || !mask) return {};
  const [N, T] = mask.shape as [number, number];
  const is = batch.batch.rollout_is_weights;
  const a = new Float64Array(N), w = new Float64Array(N), wPlain = new Float64Array(N), rho = new Float64Array(N);
  for (let i = 0; i < N; i++) {
    let n = 0, sa = 0, sw = 0, swPlain = 0, srho = 0;
    for (let t = 0; t < T; t++) {
      const k = i * T + t, m = Number(mask.data[k]);
      if (!m) continue;
      const step = 1 - 2 * Math.exp(Number(old.data[k])) + Number(spp.data[k]);
      const r2 = is ? Number(is.data[k]) ** 2 : 1;
      n += m; sa += Number(adv.data[k]) * m; sw += step * r2 * m;
      swPlain += ((step * r2) / Math.max(r2, 1e-10)) * m;
      if (is) srho += Number(is.data[k]) * m;
    }
    a[i] = sa / (n + 1e-8); w[i] = sw; wPlain[i] = Math.max(swPlain, 0); rho[i] = srho / (n + 1e-8);
  }
  const avg = (f: (i: number) => number) => {
    let s = 0;
    for (let i = 0; i < N; i++) s += f(i);
    return s / N;
  };
  const power = is ? avg((i) => rho[i]! ** 2 * a[i]! ** 2 * wPlain[i]!) : avg((i) => a[i]! ** 2 * Math.max(w[i]!, 0));
  const signal = gradNorm === undefined || !Number.isFinite(gradNorm) ? null : gradNorm ** 2;
  return {
    "variance_proxy/proxy1_signal_strength": signal ?? 0,
    "variance_proxy/proxy2_total_power": power,
    "variance_proxy/proxy3_pure_noise": signal !== null && N > 1 ? Math.max(0, (power - signal) / (N - 1)) : 0,
    "variance_proxy/expected_a_squared": avg((i) => a[i]! ** 2),
    "variance_proxy/expected_w": avg((i) => w[i]!),
  };
}
