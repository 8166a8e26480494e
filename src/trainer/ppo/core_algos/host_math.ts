// Float64 arithmetic on the host for the advantage estimators. They run on the driver,
// outside any gradient tape, over inputs that came from typed arrays, so reading the
// tensors once and looping in JS is both exact and faster than many small tensor ops.
import * as tf from "@tensorflow/tfjs";

export interface HostMatrix {
  data: Float64Array;
  rows: number;
  cols: number;
}

export function readMatrix(t: tf.Tensor, name: string): HostMatrix {
  if (t.rank !== 2) throw new Error(`${name} must be a [batch, response_length] tensor, got shape [${t.shape.join(", ")}]`);
  return { data: Float64Array.from(t.dataSync()), rows: t.shape[0]!, cols: t.shape[1]! };
}

export function readVector(t: tf.Tensor, name: string, length: number): Float64Array {
  if (t.size !== length) throw new Error(`${name} must hold ${length} values (one per row), got shape [${t.shape.join(", ")}]`);
  return Float64Array.from(t.dataSync());
}

export function sameShape(a: HostMatrix, b: HostMatrix, nameA: string, nameB: string): void {
  if (a.rows !== b.rows || a.cols !== b.cols) {
    throw new Error(`${nameB} has shape [${b.rows}, ${b.cols}] but ${nameA} has [${a.rows}, ${a.cols}]`);
  }
}

export function toTensor2D(values: Float64Array, rows: number, cols: number): tf.Tensor2D {
  return tf.tensor2d(Float32Array.from(values), [rows, cols], "float32");
}

/** Σ_t of each row. */
export function rowSums(m: HostMatrix): Float64Array {
  const out = new Float64Array(m.rows);
  for (let i = 0; i < m.rows; i++) {
    let s = 0;
    for (let t = 0; t < m.cols; t++) s += m.data[i * m.cols + t]!;
    out[i] = s;
  }
  return out;
}

/** Row i's scalar broadcast over its tokens and multiplied by the mask. */
export function broadcastRows(scalars: Float64Array, mask: HostMatrix): Float64Array {
  const out = new Float64Array(mask.rows * mask.cols);
  for (let i = 0; i < mask.rows; i++) {
    for (let t = 0; t < mask.cols; t++) out[i * mask.cols + t] = scalars[i]! * mask.data[i * mask.cols + t]!;
  }
  return out;
}

/** verl's masked_whiten in float64: stats over the mask (unbiased), applied everywhere. */
export function maskedWhitenHost(values: Float64Array, mask: Float64Array): Float64Array {
  let n = 0, s = 0;
  for (let k = 0; k < values.length; k++) {
    const m = mask[k]!;
    n += m;
    if (m !== 0) s += values[k]! * m;
  }
  if (n === 0) throw new Error("masked whitening needs at least one response token in the batch; every response_mask is empty");
  if (n === 1) throw new Error("masked whitening needs at least two response tokens in the batch (unbiased variance); use a larger batch");
  const mean = s / (n + 1e-8);
  let sq = 0;
  for (let k = 0; k < values.length; k++) {
    const m = mask[k]!;
    if (m !== 0) sq += (values[k]! - mean) ** 2 * m;
  }
  const variance = (sq / (n + 1e-8)) * (n / (n - 1));
  const inv = 1 / Math.sqrt(variance + 1e-8);
  return values.map((v) => (v - mean) * inv);
}

/** Rows of each group id, in first-seen order. */
export function groupRows(index: readonly (string | number)[] | undefined, rows: number, estimator: string): Map<string | number, number[]> {
  if (!index) throw new Error(`advantage estimator '${estimator}' needs \`index\` (the uid of each row)`);
  if (index.length !== rows) throw new Error(`index has ${index.length} entries but the batch has ${rows} rows`);
  const groups = new Map<string | number, number[]>();
  index.forEach((id, row) => {
    const g = groups.get(id);
    if (g) g.push(row);
    else groups.set(id, [row]);
  });
  return groups;
}

export function mean(xs: readonly number[]): number {
  let s = 0;
  for (const x of xs) s += x;
  return s / xs.length;
}

/** Unbiased standard deviation (torch.std); NaN for fewer than two values. */
export function stdUnbiased(xs: readonly number[]): number {
  if (xs.length < 2) return NaN;
  const mu = mean(xs);
  let s = 0;
  for (const x of xs) s += (x - mu) ** 2;
  return Math.sqrt(s / (xs.length - 1));
}
