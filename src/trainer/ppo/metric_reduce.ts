// Reducing per-micro-batch metric lists to one number per key (verl reduce_metrics and
// its Metric aggregator).

export type Aggregation = "mean" | "sum" | "min" | "max";
const AGGREGATIONS: readonly Aggregation[] = ["mean", "sum", "min", "max"];

/** Values collected over micro-batches with an explicit reduction (e.g. sum for globally normalised losses). */
export class Metric {
  readonly values: number[] = [];
  readonly aggregation: Aggregation;

  constructor(aggregation: Aggregation | string, value?: number | number[]) {
    if (!AGGREGATIONS.includes(aggregation as Aggregation)) {
      throw new Error(`unsupported metric aggregation '${aggregation}'; choose ${AGGREGATIONS.join(", ")}`);
    }
    this.aggregation = aggregation as Aggregation;
    if (value !== undefined) this.extend(Array.isArray(value) ? value : [value]);
  }

  append(value: number | Metric): void {
    if (value instanceof Metric) return this.extend(value);
    if (typeof value !== "number") throw new Error(`metric values must be numbers, got ${typeof value}`);
    this.values.push(value);
  }

  extend(values: number[] | Metric): void {
    if (values instanceof Metric) {
      if (values.aggregation !== this.aggregation) throw new Error(`metric aggregation mismatch: ${this.aggregation} vs ${values.aggregation}`);
      values = values.values;
    }
    for (const v of values) this.append(v);
  }

  aggregate(): number {
    return reduceList(this.values, this.aggregation);
  }
}

function reduceList(values: readonly number[], how: Aggregation): number {
  if (values.length === 0) return how === "sum" ? 0 : NaN;
  switch (how) {
    case "max": return values.reduce((a, b) => Math.max(a, b), -Infinity);
    case "min": return values.reduce((a, b) => Math.min(a, b), Infinity);
    case "sum": return values.reduce((a, b) => a + b, 0);
    case "mean": return values.reduce((a, b) => a + b, 0) / values.length;
  }
}

/**
 * One number per key: a Metric uses its own aggregation; otherwise a key containing
 * "max" takes the max, one containing "min" the min, anything else the mean (verl's
 * substring rule, so `response_length/max` reduces by max). An empty list gives NaN.
 */
export function reduceMetrics(metrics: Record<string, readonly number[] | number | Metric>): Record<string, number> {
  const out: Record<string, number> = {};
  for (const [key, val] of Object.entries(metrics)) {
    if (val instanceof Metric) out[key] = val.aggregate();
    else {
      const list = typeof val === "number" ? [val] : val;
      out[key] = reduceList(list, key.includes("max") ? "max" : key.includes("min") ? "min" : "mean");
    }
  }
  return out;
}

/** Append a step's metrics to running lists (verl append_to_dict). */
export function appendToDict(into: Record<string, number[]>, metrics: Record<string, number>): void {
  for (const [k, v] of Object.entries(metrics)) (into[k] ??= []).push(v);
}
