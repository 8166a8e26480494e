// Validation metrics (verl process_validation_metrics, §5.4): per data source, per
// prompt (uid), per variable: mean@N, std@N, and bootstrap best@n / worst@n / maj@n
// for n = 2, 4, 8, ..., N, then averaged over prompts. Bootstrap draws come from a
// seeded Rng (seed 42 by default), so the numbers are reproducible; they differ from
// verl's numpy draws only by sampling noise.
import { Rng } from "../../utils/rng.js";

/** 2, 4, 8, ... below N, then N; empty for N ≤ 1. */
export function genNs(nResps: number): number[] {
  if (nResps <= 1) return [];
  const ns: number[] = [];
  for (let n = 2; n < nResps; n *= 2) ns.push(n);
  ns.push(nResps);
  return ns;
}

function meanOf(xs: readonly number[]): number {
  return xs.reduce((a, b) => a + b, 0) / xs.length;
}

/** Population standard deviation (np.std). */
function stdOf(xs: readonly number[]): number {
  const mu = meanOf(xs);
  return Math.sqrt(xs.reduce((a, b) => a + (b - mu) ** 2, 0) / xs.length);
}

/**
 * Draw `nBootstrap` subsets of `subsetSize` with replacement and return (mean, std) of
 * each reducer over the subsets. All reducers see the same subsets.
 */
export function bootstrapMetric<T>(
  data: readonly T[],
  subsetSize: number,
  reduceFns: ((sample: T[]) => number)[],
  nBootstrap = 1000,
  seed = 42,
): [number, number][] {
  if (data.length === 0) throw new Error("bootstrapMetric: no data to resample");
  const rng = new Rng(seed);
  const results = reduceFns.map(() => new Array<number>(nBootstrap));
  for (let b = 0; b < nBootstrap; b++) {
    const sample = Array.from({ length: subsetSize }, () => data[rng.int(data.length)]!);
    reduceFns.forEach((fn, f) => (results[f]![b] = fn(sample)));
  }
  return results.map((r) => [meanOf(r), stdOf(r)]);
}

/** The value of the first sample carrying the most common vote (ties: the vote seen first). */
export function calcMajVal<T extends Record<string, unknown>>(data: readonly T[], voteKey: string, valKey: string): number {
  const votes = new Map<unknown, number[]>();
  for (const d of data) {
    const vote = d[voteKey];
    const list = votes.get(vote) ?? [];
    list.push(Number(d[valKey]));
    votes.set(vote, list);
  }
  let best: number[] | undefined;
  for (const list of votes.values()) if (!best || list.length > best.length) best = list;
  if (!best) throw new Error("calcMajVal: no data");
  return best[0]!;
}

type Nested = Record<string, Record<string, Record<string, number>>>;

function asNumber(v: unknown): number | undefined {
  if (typeof v === "number") return v;
  if (typeof v === "boolean") return v ? 1 : 0;
  if (typeof v === "bigint") return Number(v);
  return undefined;
}

function metricsForVariable(vals: number[], preds: unknown[] | undefined, seed: number): Record<string, number> {
  const n = vals.length;
  const metric: Record<string, number> = { [`mean@${n}`]: meanOf(vals) };
  if (n <= 1) return metric;
  metric[`std@${n}`] = stdOf(vals);
  for (const k of genNs(n)) {
    const [[bestMean, bestStd], [worstMean, worstStd]] = bootstrapMetric(vals, k, [(s) => Math.max(...s), (s) => Math.min(...s)], 1000, seed) as [[number, number], [number, number]];
    Object.assign(metric, { [`best@${k}/mean`]: bestMean, [`best@${k}/std`]: bestStd, [`worst@${k}/mean`]: worstMean, [`worst@${k}/std`]: worstStd });
    if (preds) {
      const votes = vals.map((val, i) => ({ val, pred: preds[i] }));
      const [[majMean, majStd]] = bootstrapMetric(votes, k, [(s) => calcMajVal(s, "pred", "val")], 1000, seed) as [[number, number]];
      Object.assign(metric, { [`maj@${k}/mean`]: majMean, [`maj@${k}/std`]: majStd });
    }
  }
  return metric;
}

/**
 * {data_source: {variable: {metric: value}}} from per-sample data sources, uids and
 * variables (`reward` and the numeric reward extras; `pred`, when present, votes for maj@n).
 * String-valued variables are skipped.
 */
export function processValidationMetrics(
  dataSources: readonly string[],
  sampleUids: readonly (string | number)[],
  infosDict: Record<string, readonly unknown[]>,
  seed = 42,
): Nested {
  if (sampleUids.length !== dataSources.length) throw new Error(`validation metrics: ${sampleUids.length} uids for ${dataSources.length} samples`);
  for (const [k, v] of Object.entries(infosDict)) {
    if (v.length !== dataSources.length) throw new Error(`validation metrics: '${k}' has ${v.length} values for ${dataSources.length} samples`);
  }
  // data source -> uid -> variable -> values
  const grouped = new Map<string, Map<string | number, Map<string, unknown[]>>>();
  dataSources.forEach((ds, i) => {
    const byUid = grouped.get(ds) ?? new Map<string | number, Map<string, unknown[]>>();
    grouped.set(ds, byUid);
    const vars = byUid.get(sampleUids[i]!) ?? new Map<string, unknown[]>();
    byUid.set(sampleUids[i]!, vars);
    for (const [name, vals] of Object.entries(infosDict)) {
      const list = vars.get(name) ?? [];
      list.push(vals[i]);
      vars.set(name, list);
    }
  });
  const out: Nested = {};
  for (const [ds, byUid] of grouped) {
    const perVar: Record<string, Record<string, number[]>> = {};
    for (const vars of byUid.values()) {
      const preds = vars.get("pred");
      for (const [name, raw] of vars) {
        const nums = raw.map(asNumber);
        if (raw.length === 0 || nums.some((x) => x === undefined)) continue;
        const metric = metricsForVariable(nums as number[], preds, seed);
        const acc = (perVar[name] ??= {});
        for (const [m, v] of Object.entries(metric)) (acc[m] ??= []).push(v);
      }
    }
    out[ds] = {};
    for (const [name, metrics] of Object.entries(perVar)) {
      out[ds]![name] = Object.fromEntries(Object.entries(metrics).map(([m, vals]) => [m, meanOf(vals)]));
    }
  }
  return out;
}

/**
 * Flatten to logged keys: `val-core/{ds}/{var}/{metric}` when var is the core variable
 * (`acc` if present, else `reward`) and the metric is mean/maj/best at the largest n;
 * everything else under `val-aux/`. `numTurns` adds val-aux/num_turns/{min,max,mean}.
 */
export function validationMetricsToDict(nested: Nested, numTurns?: readonly number[]): Record<string, number> {
  const out: Record<string, number> = {};
  for (const [ds, vars] of Object.entries(nested)) {
    const core = "acc" in vars ? "acc" : "reward";
    for (const [name, metrics] of Object.entries(vars)) {
      const nMax = Math.max(...Object.keys(metrics).map((m) => Number.parseInt(m.split("@").at(-1)!.split("/")[0]!, 10)));
      for (const [m, v] of Object.entries(metrics)) {
        const isCore = name === core && ["mean", "maj", "best"].some((p) => m.startsWith(p)) && m.includes(`@${nMax}`);
        out[`${isCore ? "val-core" : "val-aux"}/${ds}/${name}/${m}`] = v;
      }
    }
  }
  if (numTurns && numTurns.length > 0) {
    out["val-aux/num_turns/min"] = Math.min(...numTurns);
    out["val-aux/num_turns/max"] = Math.max(...numTurns);
    out["val-aux/num_turns/mean"] = meanOf(numTurns);
  }
  return out;
}
