// How a rank's share of the batch is cut for training and inference: mini-batches
// (one optimizer step each), micro-batches (one forward/backward each, by count or
// by a token budget), and the tfjs tensors a micro-batch needs.
import * as tf from "@tensorflow/tfjs";
import type { DataProto } from "../protocol/index.js";
import type { TensorData } from "../protocol/tensor.js";
import { rearrangeMicroBatches } from "../trainer/ppo/seqlen_balancing.js";
import type { Rng } from "../utils/rng.js";

export interface MicroBatchSpec {
  /** Rows per micro-batch (ignored when maxTokenLen is set). */
  microBatchSize: number | null;
  /** Dynamic batch size: the token budget per micro-batch (use_dynamic_bsz). */
  maxTokenLen: number | null;
}

/** Attended tokens per row (prompt + response). */
export function seqLens(data: DataProto): number[] {
  const am = column(data, "attention_mask");
  const [rows, width] = am.shape as [number, number];
  const out = new Array<number>(rows).fill(0);
  for (let i = 0; i < rows; i++) for (let j = 0; j < width; j++) out[i]! += am.data[i * width + j]!;
  return out;
}

export function column(data: DataProto, key: string): TensorData {
  const t = data.batch[key];
  if (!t) throw new Error(`batch has no '${key}' (present: ${Object.keys(data.batch).join(", ") || "none"})`);
  return t;
}

/** Micro-batches of a mini-batch, each with the row indices it took (to restore order). */
export function microBatches(mini: DataProto, spec: MicroBatchSpec): { batches: DataProto[]; indices: number[][] } {
  const n = mini.length;
  if (n === 0) return { batches: [], indices: [] };
  if (spec.maxTokenLen !== null) {
    const width = column(mini, "attention_mask").shape[1]!;
    const parts = rearrangeMicroBatches(seqLens(mini), spec.maxTokenLen, { maxSeqLen: width });
    return { batches: parts.map((p) => mini.selectIdxs(p)), indices: parts };
  }
  const size = spec.microBatchSize;
  if (size === null || !(size > 0)) throw new Error("micro-batch size is not set (set *_micro_batch_size_per_gpu or use_dynamic_bsz)");
  const batches: DataProto[] = [], indices: number[][] = [];
  for (let s = 0; s < n; s += size) {
    const e = Math.min(n, s + size);
    batches.push(mini.slice(s, e));
    indices.push(Array.from({ length: e - s }, (_, i) => s + i));
  }
  return { batches, indices };
}

/** One epoch's mini-batches: the rows shuffled with `rng` when given, then cut into `size` rows each. */
export function miniBatches(data: DataProto, size: number, rng?: Rng): DataProto[] {
  if (!(size > 0)) throw new Error(`mini-batch size must be positive, got ${size}`);
  const src = rng ? data.selectIdxs(rng.permutation(data.length)) : data;
  return src.split(size);
}

/** A batch column as a tfjs tensor (int columns stay int32; call inside tf.tidy). */
export function toTf(t: TensorData, dtype?: "float32" | "int32"): tf.Tensor {
  const x = tf.tensor(t.data, t.shape, t.dtype === "float32" ? "float32" : "int32");
  return dtype && x.dtype !== dtype ? tf.cast(x, dtype) : x;
}

/** Σ response_mask and the number of rows with at least one response token. */
export function tokenAndSequenceCounts(mask: TensorData): { tokens: number; sequences: number } {
  const [rows, width] = mask.shape as [number, number];
  let tokens = 0, sequences = 0;
  for (let i = 0; i < rows; i++) {
    let c = 0;
    for (let j = 0; j < width; j++) c += mask.data[i * width + j]!;
    tokens += c;
    if (c > 0) sequences++;
  }
  return { tokens, sequences };
}

/**
 * Per-micro-batch metric means (clip fractions, KL, value means) combined into the
 * mini-batch's token-weighted mean over every rank: add() each micro-batch's means
 * with its token count, pack() the sums into the gradient all-reduce, read() after.
 * Unlike a plain mean over micro-batches, the result does not depend on how the
 * mini-batch was split, so 1 rank and N ranks report the same numbers.
 */
export class TokenWeightedMeans {
  private readonly sums = new Map<string, number>();
  private tokens = 0;

  add(means: Record<string, number>, tokens: number): void {
    this.tokens += tokens;
    for (const [k, v] of Object.entries(means)) this.sums.set(k, (this.sums.get(k) ?? 0) + v * tokens);
  }

  get keys(): string[] {
    return [...this.sums.keys()].sort();
  }

  /** [tokens, ...sums in key order]: the same layout on every rank (same loss code). */
  pack(): number[] {
    return [this.tokens, ...this.keys.map((k) => this.sums.get(k)!)];
  }

  /** Means from the all-reduced pack. */
  read(reduced: ArrayLike<number>): Record<string, number> {
    const tokens = reduced[0]!;
    return Object.fromEntries(this.keys.map((k, i) => [k, tokens > 0 ? reduced[i + 1]! / tokens : 0]));
  }
}
