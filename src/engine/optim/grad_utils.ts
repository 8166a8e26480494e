// Gradient plumbing between micro-batches, ranks and the optimizer: gradients are
// accumulated as one flat vector on the backend, read back asynchronously once per
// mini-batch (for the cross-rank all-reduce), and clipped by their global norm on the host.
import * as tf from "@tensorflow/tfjs";
import { concatFlat } from "../copies.js";
import { canReadInto, readIntoBuckets } from "../webgpu_transfer.js";
import { syncReadsForbidden } from "../sync_reads.js";

interface WasmBackendMemory {
  wasm?: { HEAPF32?: Float32Array };
  dataIdMap?: { get(dataId: object): { memoryOffset: number | null; dtype?: string } | undefined };
}

/**
 * Copies a float32 tensor's values into dst[at, at + size) straight from the backend's memory
 * (cpu: its array; wasm: its heap), with no array in between; false (nothing copied) on other
 * backends, which read asynchronously (WebGPU), and where synchronous reads are forbidden.
 */
export function readTensorInto(t: tf.Tensor, dst: Float32Array, at = 0): boolean {
  if (t.dtype !== "float32" || syncReadsForbidden()) return false;
  if (at < 0 || at + t.size > dst.length) throw new Error(`readTensorInto: ${t.size} values do not fit at ${at} of ${dst.length}`);
  const name = tf.getBackend(), be = tf.backend() as unknown as WasmBackendMemory & { readSync?(dataId: object): unknown };
  if (name === "wasm") {
    const info = be.dataIdMap?.get(t.dataId), heap = be.wasm?.HEAPF32;
    if (!info || info.memoryOffset === null || !heap) return false;
    dst.set(new Float32Array(heap.buffer, info.memoryOffset, t.size), at);
    return true;
  }
  if (name === "cpu") {
    const values = be.readSync?.(t.dataId);
    if (!(values instanceof Float32Array) || values.length !== t.size) return false;
    dst.set(values, at);
    return true;
  }
  return false;
}

/** Sums micro-batch gradients into one flat vector, in the order of `vars`. */
export class FlatGradAccumulator {
  private acc: tf.Tensor1D | undefined;
  readonly numel: number;

  constructor(readonly vars: tf.Variable[]) {
    this.numel = vars.reduce((a, v) => a + v.size, 0);
  }

  /** Add one micro-batch's gradients (a map keyed by variable name, as tf.variableGrads returns). */
  add(grads: tf.NamedTensorMap): void {
    const next = tf.tidy(() => {
      const flat = concatFlat(this.vars.map((v) => grads[v.name] ?? tf.zeros([v.size])));
      return this.acc ? this.acc.add(flat) as tf.Tensor1D : flat;
    });
    this.acc?.dispose();
    this.acc = next;
  }

  /**
   * The accumulated gradient as a host array (zeros if nothing was added); resets the
   * accumulator. Async: a GPU backend under Node can only read its buffers that way.
   */
  async take(): Promise<Float32Array> {
    if (!this.acc) return new Float32Array(this.numel);
    const acc = this.acc;
    this.acc = undefined;
    try {
      // the read may hand back the backend's own buffer; copy so callers may mutate it.
      return new Float32Array(await acc.data() as Float32Array);
    } finally {
      acc.dispose();
    }
  }

  /**
   * The accumulated gradient as host arrays of `bucket` elements each (the last shorter), every
   * read-back started at once so later buckets come back while earlier ones are reduced (on WebGPU
   * the reads are asynchronous copies the device makes on its own); resets the accumulator. The
   * arrays may be the backend's own: copy them, never change them.
   */
  takeBuckets(bucket: number): Promise<Float32Array>[] {
    if (!(Number.isInteger(bucket) && bucket >= 1)) throw new Error(`takeBuckets: bucket must be a positive integer, got ${bucket}`);
    const acc = this.acc;
    this.acc = undefined;
    const parts: Promise<Float32Array>[] = [];
    let handedOver = false;
    for (let o = 0; o < this.numel; o += bucket) {
      const len = Math.min(bucket, this.numel - o);
      if (!acc) {
        parts.push(Promise.resolve(new Float32Array(len)));
        continue;
      }
      handedOver = len === this.numel;
      const t = handedOver ? acc : acc.slice(o, len);
      parts.push(t.data<"float32">().finally(() => t.dispose()) as Promise<Float32Array>);
    }
    if (!handedOver) acc?.dispose();
    // A caller that fails half-way leaves the rest unread: not an unhandled rejection.
    for (const p of parts) p.catch(() => undefined);
    return parts;
  }

  /**
   * The accumulated gradient read back straight into dst[0, numel) in buckets of `bucket` values
   * (webgpu_transfer.ts: buffer copies into pooled staging, one submit, each bucket copied into dst
   * as it maps; no slice dispatch and no intermediate host array), one promise a bucket; resets the
   * accumulator. Undefined (the accumulator left as it is) where that path does not apply: use
   * takeBuckets.
   */
  takeBucketsInto(dst: Float32Array, bucket: number): Promise<void>[] | undefined {
    if (this.numel > dst.length) throw new Error(`takeBucketsInto: ${this.numel} values do not fit in ${dst.length}`);
    if (!this.acc || !canReadInto(this.acc)) return undefined;
    const acc = this.acc;
    this.acc = undefined;
    try {
      return readIntoBuckets(acc, dst, 0, bucket);
    } finally {
      acc.dispose(); // the copies are submitted: the buffer goes back to the pool behind them
    }
  }

  /**
   * The accumulated gradient copied into dst[at, at + numel) where the backend's memory can be read
   * in place (cpu, wasm: readTensorInto), zeros if nothing was added; resets the accumulator. False
   * (the accumulator left as it is) elsewhere: use takeBuckets.
   */
  takeInto(dst: Float32Array, at = 0): boolean {
    if (!this.acc) {
      if (at < 0 || at + this.numel > dst.length) throw new Error(`takeInto: ${this.numel} values do not fit at ${at} of ${dst.length}`);
      dst.fill(0, at, at + this.numel);
      return true;
    }
    if (!readTensorInto(this.acc, dst, at)) return false;
    this.acc.dispose();
    this.acc = undefined;
    return true;
  }

  /** The accumulated gradient as a tensor the caller owns (zeros if nothing was added); resets the accumulator. */
  takeTensor(): tf.Tensor1D {
    const acc = this.acc ?? tf.zeros([this.numel]) as tf.Tensor1D;
    this.acc = undefined;
    return acc;
  }

  dispose(): void {
    this.acc?.dispose();
    this.acc = undefined;
  }
}

/**
 * Where `k` contiguous slices of `n` elements start and end: k + 1 offsets, slice i being
 * [b[i], b[i+1]); the first n % k slices hold one element more (ZeRO-1's even split of the flat vector).
 */
export function shardBounds(n: number, k: number): number[] {
  if (!(Number.isInteger(n) && n >= 0 && Number.isInteger(k) && k >= 1)) throw new Error(`shardBounds: need n >= 0 and k >= 1 integers, got ${n}, ${k}`);
  const base = Math.floor(n / k), extra = n % k;
  return Array.from({ length: k + 1 }, (_, i) => i * base + Math.min(i, extra));
}

/** The sum of squares of flat[start, end), accumulated in float64 left to right (from `acc`: one sum continued over pieces). */
export function sumSquares(flat: Float32Array, start = 0, end = flat.length, acc = 0): number {
  let s = acc;
  for (let i = start; i < end; i++) s += flat[i]! * flat[i]!;
  return s;
}

/**
 * The norm from per-slice sums of squares, added in slice order. Ranks that each hold one slice's
 * sum get the bits of one rank holding them all, whatever the reduce's own order.
 */
export function normOfPartials(partials: ArrayLike<number>): number {
  let s = 0;
  for (let i = 0; i < partials.length; i++) s += partials[i]!;
  return Math.sqrt(s);
}

/** The L2 norm of a flat gradient, accumulated in float64. */
export function globalNorm(flat: Float32Array): number {
  return normOfPartials([sumSquares(flat)]);
}

/** torch's clip_grad_norm_ factor for a gradient of norm `norm`: maxNorm/(norm+1e-6) when that is below 1, else 1. */
export function clipCoefficient(norm: number, maxNorm: number | null | undefined): number {
  if (!Number.isFinite(norm) || maxNorm === null || maxNorm === undefined || !(maxNorm > 0)) return 1;
  return Math.min(1, maxNorm / (norm + 1e-6));
}

/** flat[start, end) *= coef, in place (each product rounded to float32 once). */
export function scaleInPlace(flat: Float32Array, coef: number, start = 0, end = flat.length): void {
  for (let i = start; i < end; i++) flat[i] = flat[i]! * coef;
}

/**
 * Clip in place to `maxNorm` (torch's clip_grad_norm_: scale by maxNorm/(norm+1e-6) when
 * that is below 1). Returns the norm before clipping; a non-finite norm leaves the
 * gradient untouched so that the caller can skip the step.
 */
export function clipByGlobalNorm(flat: Float32Array, maxNorm: number | null | undefined): number {
  const norm = globalNorm(flat);
  const coef = clipCoefficient(norm, maxNorm);
  if (coef < 1) scaleInPlace(flat, coef);
  return norm;
}
