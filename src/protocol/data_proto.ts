// DataProto: the batch that flows between the trainer and its workers, as verl
// defines it (verl/protocol.py). `batch` holds named tensors whose first
// dimension is the batch, `nonTensorBatch` holds one JS value per row, and
// `metaInfo` holds values for the whole batch.
//
// Ownership: slice/selectIdxs/chunk/split/concat/repeat build fresh buffers
// (safe to move to another thread); select/pop/rename/union share the tensors
// with the source, as verl's do. metaInfo is shallow-copied per result.
import type { TensorData } from "./tensor.js";
import { checkTensor, cloneTensor, concatRows, gatherRows, repeatIndex, rowOf, sliceRows, tensorsEqual } from "./tensor_ops.js";
import { deepEqual } from "./deep_equal.js";
import { isDataProtoPayload, packTensors, type DataProtoPayload } from "./transfer.js";

export type { DataProtoPayload } from "./transfer.js";

/** One row: `dp.at(i)`. Tensors lose their batch dimension. */
export interface DataProtoItem {
  batch: Record<string, TensorData>;
  nonTensorBatch: Record<string, unknown>;
  metaInfo: Record<string, unknown>;
}

/** Index list, or a boolean mask (Uint8Array, boolean[] or a bool TensorData) as long as the batch. */
export type IndexSpec = number[] | boolean[] | Int32Array | Uint8Array | TensorData;

/** Process-wide auto padding switch (verl's DataProtoConfig.auto_padding / VERL_AUTO_PADDING). */
export const dataProtoConfig = {
  autoPadding: ["1", "TRUE"].includes((process.env.VERL_AUTO_PADDING ?? "").toUpperCase()),
  autoPaddingKey: "_verl_auto_padding",
};

function isTensorData(v: unknown): v is TensorData {
  return v !== null && typeof v === "object" && ArrayBuffer.isView((v as TensorData).data) && Array.isArray((v as TensorData).shape);
}

function asList(keys: string | string[] | undefined, what: string): string[] {
  if (keys === undefined) return [];
  if (typeof keys === "string") return [keys];
  if (Array.isArray(keys)) return keys;
  throw new TypeError(`${what}: keys must be a string or a list of strings`);
}

export class DataProto {
  batch: Record<string, TensorData>;
  nonTensorBatch: Record<string, unknown[]>;
  metaInfo: Record<string, unknown>;

  constructor(batch: Record<string, TensorData> = {}, nonTensorBatch: Record<string, unknown[]> = {}, metaInfo: Record<string, unknown> = {}) {
    this.batch = { ...batch };
    this.nonTensorBatch = { ...nonTensorBatch };
    this.metaInfo = metaInfo;
    this.checkConsistency();
  }

  /** Throws naming the first key whose length disagrees with the batch size. */
  checkConsistency(): void {
    let size: number | undefined, pivot = "";
    for (const [key, t] of Object.entries(this.batch)) {
      checkTensor(t, `DataProto batch key '${key}'`);
      if (size === undefined) { size = t.shape[0]!; pivot = key; }
      else if (t.shape[0] !== size) {
        throw new Error(`DataProto: batch key '${key}' has ${t.shape[0]} rows but '${pivot}' has ${size}`);
      }
    }
    for (const [key, v] of Object.entries(this.nonTensorBatch)) {
      if (!Array.isArray(v)) throw new Error(`DataProto: non-tensor key '${key}' must be an array (one value per row), got ${typeof v}`);
      if (size === undefined) { size = v.length; pivot = key; }
      else if (v.length !== size) {
        throw new Error(`DataProto: non-tensor key '${key}' has length ${v.length} but '${pivot}' has ${size} rows`);
      }
    }
    if (this.metaInfo === null || typeof this.metaInfo !== "object") throw new Error("DataProto: metaInfo must be an object");
  }

  static fromDict(tensors: Record<string, TensorData> = {}, nonTensors: Record<string, unknown[]> = {}, metaInfo: Record<string, unknown> = {}): DataProto {
    return new DataProto(tensors, nonTensors, metaInfo);
  }

  /** Tensors (TensorData) go to `batch`, arrays to `nonTensorBatch`; anything else is an error. */
  static fromSingleDict(data: Record<string, TensorData | unknown[]>, metaInfo: Record<string, unknown> = {}): DataProto {
    const tensors: Record<string, TensorData> = {}, nonTensors: Record<string, unknown[]> = {};
    for (const [key, v] of Object.entries(data)) {
      if (isTensorData(v)) tensors[key] = v;
      else if (Array.isArray(v)) nonTensors[key] = v;
      else throw new Error(`DataProto.fromSingleDict: key '${key}' is neither a TensorData nor an array`);
    }
    return new DataProto(tensors, nonTensors, metaInfo);
  }

  get length(): number {
    const t = Object.values(this.batch)[0];
    if (t) return t.shape[0]!;
    const v = Object.values(this.nonTensorBatch)[0];
    return v ? v.length : 0;
  }

  /** The tensor under `key`; a clear error listing the keys when absent. */
  tensor(key: string): TensorData {
    const t = this.batch[key];
    if (!t) throw new Error(`DataProto: no batch key '${key}' (has: ${Object.keys(this.batch).join(", ") || "none"})`);
    return t;
  }

  private derive(batch: Record<string, TensorData>, nonTensor: Record<string, unknown[]>): DataProto {
    return new DataProto(batch, nonTensor, { ...this.metaInfo });
  }

  private mapRows(fn: (t: TensorData) => TensorData, gn: (v: unknown[]) => unknown[]): DataProto {
    const b: Record<string, TensorData> = {}, nt: Record<string, unknown[]> = {};
    for (const [k, t] of Object.entries(this.batch)) b[k] = fn(t);
    for (const [k, v] of Object.entries(this.nonTensorBatch)) nt[k] = gn(v);
    return this.derive(b, nt);
  }

  /** Rows [start, end) with Python semantics for negatives (`slice(0, -2)` drops the last two). */
  slice(start = 0, end?: number, step = 1): DataProto {
    if (!Number.isInteger(step) || step < 1) throw new Error(`DataProto.slice: step must be a positive integer, got ${step}`);
    const n = this.length;
    const norm = (i: number) => Math.min(n, Math.max(0, i < 0 ? n + i : i));
    const s = norm(start), e = norm(end ?? n);
    if (step === 1) return this.mapRows((t) => sliceRows(t, s, Math.max(s, e)), (v) => v.slice(s, Math.max(s, e)));
    const idx: number[] = [];
    for (let i = s; i < e; i += step) idx.push(i);
    return this.gather(idx);
  }

  /** Rows by index list (negatives count from the end) or boolean mask. */
  selectIdxs(idx: IndexSpec): DataProto {
    return this.gather(this.resolveIndex(idx, "selectIdxs"));
  }

  private resolveIndex(idx: IndexSpec, what: string): number[] {
    const n = this.length;
    const mask = (m: ArrayLike<unknown>): number[] => {
      if (m.length !== n) throw new Error(`DataProto.${what}: boolean mask has length ${m.length} but the batch has ${n} rows`);
      const out: number[] = [];
      for (let i = 0; i < m.length; i++) if (m[i]) out.push(i);
      return out;
    };
    if (isTensorData(idx)) {
      if (idx.shape.length !== 1) throw new Error(`DataProto.${what}: index tensor must be 1-D, got shape [${idx.shape.join(", ")}]`);
      return idx.dtype === "bool" ? mask(idx.data) : this.resolveIndex(Array.from(idx.data), what);
    }
    if (idx instanceof Uint8Array) return mask(idx);
    if (Array.isArray(idx) && idx.length > 0 && typeof idx[0] === "boolean") return mask(idx);
    return Array.from(idx as ArrayLike<number>, (i) => {
      if (!Number.isInteger(i) || i >= n || i < -n) throw new Error(`DataProto.${what}: index ${String(i)} out of range for ${n} rows`);
      return i < 0 ? n + i : i;
    });
  }

  private gather(idx: ArrayLike<number>): DataProto {
    return this.mapRows((t) => gatherRows(t, idx), (v) => Array.from(idx, (i) => v[i]));
  }

  /** Row i (negatives count from the end); tensors are views without the batch dimension. */
  at(i: number): DataProtoItem {
    const n = this.length;
    if (!Number.isInteger(i) || i >= n || i < -n) throw new Error(`DataProto.at: index ${i} out of range for ${n} rows`);
    const r = i < 0 ? n + i : i;
    const batch: Record<string, TensorData> = {}, nonTensorBatch: Record<string, unknown> = {};
    for (const [k, t] of Object.entries(this.batch)) batch[k] = rowOf(t, r);
    for (const [k, v] of Object.entries(this.nonTensorBatch)) nonTensorBatch[k] = v[r];
    return { batch, nonTensorBatch, metaInfo: this.metaInfo };
  }

  /** A sub-view. Omitted key lists keep everything; a missing batch key is an error,
   *  missing non-tensor / meta keys are skipped (verl's behaviour). */
  select(batchKeys?: string[], nonTensorKeys?: string[], metaKeys?: string[]): DataProto {
    const b: Record<string, TensorData> = {};
    for (const k of batchKeys ?? Object.keys(this.batch)) b[k] = this.tensor(k);
    const pick = <T>(src: Record<string, T>, keys?: string[]) =>
      Object.fromEntries(Object.entries(src).filter(([k]) => keys === undefined || keys.includes(k)));
    return new DataProto(b, pick(this.nonTensorBatch, nonTensorKeys), pick(this.metaInfo, metaKeys));
  }

  /** Remove the named keys from this and return them as a new DataProto; every key must exist. */
  pop(batchKeys: string[] = [], nonTensorKeys: string[] = [], metaKeys: string[] = []): DataProto {
    const check = (src: object, keys: string[], what: string) => {
      for (const k of keys) if (!(k in src)) throw new Error(`DataProto.pop: no ${what} key '${k}' (has: ${Object.keys(src).join(", ") || "none"})`);
    };
    check(this.batch, batchKeys, "batch");
    check(this.nonTensorBatch, nonTensorKeys, "non-tensor");
    check(this.metaInfo, metaKeys, "meta");
    const take = <T>(src: Record<string, T>, keys: string[]): Record<string, T> => {
      const out: Record<string, T> = {};
      for (const k of keys) { out[k] = src[k]!; delete src[k]; }
      return out;
    };
    const b = take(this.batch, batchKeys);
    const nt = take(this.nonTensorBatch, nonTensorKeys);
    const m = take(this.metaInfo, metaKeys);
    return new DataProto(b, nt, m);
  }

  /** Rename batch keys in place (verl renames batch keys only). */
  rename(oldKeys: string | string[], newKeys: string | string[]): this {
    const olds = asList(oldKeys, "rename"), news = asList(newKeys, "rename");
    if (olds.length !== news.length) throw new Error(`DataProto.rename: ${olds.length} old keys but ${news.length} new keys`);
    const moved = olds.map((k) => this.tensor(k));
    olds.forEach((k) => delete this.batch[k]);
    news.forEach((k, i) => {
      if (k in this.batch) throw new Error(`DataProto.rename: batch key '${k}' already exists`);
      this.batch[k] = moved[i]!;
    });
    return this;
  }

  /** Merge other into this. Keys present in both must hold equal values. */
  union(other: DataProto): this {
    const empty = Object.keys(this.batch).length + Object.keys(this.nonTensorBatch).length === 0;
    if (!empty && other.length !== this.length && Object.keys(other.batch).length + Object.keys(other.nonTensorBatch).length > 0) {
      throw new Error(`DataProto.union: batch sizes differ (${this.length} vs ${other.length})`);
    }
    for (const [k, t] of Object.entries(other.batch)) {
      const mine = this.batch[k];
      if (mine && !tensorsEqual(mine, t)) throw new Error(`DataProto.union: batch key '${k}' differs between the two DataProtos`);
    }
    for (const [k, v] of Object.entries(other.nonTensorBatch)) {
      if (k in this.nonTensorBatch && !deepEqual(this.nonTensorBatch[k], v)) {
        throw new Error(`DataProto.union: non-tensor key '${k}' differs between the two DataProtos`);
      }
    }
    for (const [k, v] of Object.entries(other.metaInfo)) {
      if (k in this.metaInfo && !deepEqual(this.metaInfo[k], v)) throw new Error(`DataProto.union: meta key '${k}' differs between the two DataProtos`);
    }
    Object.assign(this.batch, other.batch);
    Object.assign(this.nonTensorBatch, other.nonTensorBatch);
    Object.assign(this.metaInfo, other.metaInfo);
    this.checkConsistency();
    return this;
  }

  isPaddingEnabled(): boolean {
    return Boolean(this.metaInfo[dataProtoConfig.autoPaddingKey]) || dataProtoConfig.autoPadding;
  }

  /** n equal parts; the size must divide unless auto padding is on (then the first parts get one more row). */
  chunk(n: number): DataProto[] {
    if (!Number.isInteger(n) || n < 1) throw new Error(`DataProto.chunk: chunks must be a positive integer, got ${n}`);
    const len = this.length;
    if (len % n !== 0 && !this.isPaddingEnabled()) {
      throw new Error(`DataProto.chunk: only equal chunks are supported; ${len} rows do not split into ${n}`);
    }
    const base = Math.floor(len / n), extra = len % n;
    const out: DataProto[] = [];
    let start = 0;
    for (let i = 0; i < n; i++) {
      const size = base + (i < extra ? 1 : 0);
      out.push(this.slice(start, start + size));
      start += size;
    }
    return out;
  }

  /** Parts of `size` rows; the last may be shorter. */
  split(size: number): DataProto[] {
    if (!Number.isInteger(size) || size < 1) throw new Error(`DataProto.split: size must be a positive integer, got ${size}`);
    const out: DataProto[] = [];
    for (let i = 0; i < this.length; i += size) out.push(this.slice(i, i + size));
    return out;
  }

  /** Concatenate along the batch. Keys must match; meta is merged (conflicts are errors) except
   *  `metrics`, which is gathered from every item into a dict of lists (verl). */
  static concat(list: DataProto[]): DataProto {
    if (list.length === 0) throw new Error("DataProto.concat: empty list");
    const first = list[0]!;
    const sameKeys = (a: object, b: object, what: string, i: number) => {
      const ka = Object.keys(a).sort().join(","), kb = Object.keys(b).sort().join(",");
      if (ka !== kb) throw new Error(`DataProto.concat: item ${i} has ${what} keys [${kb}] but item 0 has [${ka}]`);
    };
    list.forEach((d, i) => { sameKeys(first.batch, d.batch, "batch", i); sameKeys(first.nonTensorBatch, d.nonTensorBatch, "non-tensor", i); });
    const batch: Record<string, TensorData> = {}, nonTensor: Record<string, unknown[]> = {};
    for (const k of Object.keys(first.batch)) batch[k] = concatRows(list.map((d) => d.batch[k]!), k);
    for (const k of Object.keys(first.nonTensorBatch)) nonTensor[k] = list.flatMap((d) => d.nonTensorBatch[k]!);
    return new DataProto(batch, nonTensor, mergeMeta(list));
  }

  /** Reorder rows in place: row i becomes old row idx[i]. */
  reorder(idx: number[] | Int32Array): void {
    const r = this.gather(this.resolveIndex(idx, "reorder"));
    this.batch = r.batch;
    this.nonTensorBatch = r.nonTensorBatch;
  }

  /** Repeat every row `times` times: interleave [a,a,b,b], else tile [a,b,a,b]. */
  repeat(times = 2, interleave = true): DataProto {
    if (!Number.isInteger(times) || times < 0) throw new Error(`DataProto.repeat: times must be a non-negative integer, got ${times}`);
    const n = this.length;
    const idx = interleave
      ? repeatIndex(new Array<number>(n).fill(times))
      : Int32Array.from({ length: n * times }, (_, i) => i % n);
    return this.gather(idx);
  }

  /** Repeat row i `timesPerRow[i]` times, keeping rows together. */
  sampleLevelRepeat(timesPerRow: number[] | Int32Array): DataProto {
    if (timesPerRow.length !== this.length) {
      throw new Error(`DataProto.sampleLevelRepeat: ${timesPerRow.length} repeat counts for ${this.length} rows`);
    }
    for (const t of timesPerRow) {
      if (!Number.isInteger(t) || t < 0) throw new Error(`DataProto.sampleLevelRepeat: repeat counts must be non-negative integers, got ${t}`);
    }
    return this.gather(repeatIndex(timesPerRow));
  }

  /** Append `size` copies of the first (or last) row in place (verl's padding). */
  padding(size: number, candidate: "first" | "last" = "first"): void {
    if (size === 0) return;
    if (this.length === 0) throw new Error("DataProto.padding: cannot pad an empty DataProto");
    const row = this.gather([candidate === "first" ? 0 : this.length - 1]);
    const padded = DataProto.concat([this, row.repeat(size)]);
    this.batch = padded.batch;
    this.nonTensorBatch = padded.nonTensorBatch;
  }

  /** A deep copy of the tensors (and structured clones of non-tensor values and meta). */
  clone(): DataProto {
    const b: Record<string, TensorData> = {};
    for (const [k, t] of Object.entries(this.batch)) b[k] = cloneTensor(t);
    return new DataProto(b, structuredClone(this.nonTensorBatch), structuredClone(this.metaInfo));
  }

  /** For postMessage(payload, transfer). The tensors' buffers MOVE: this DataProto's
   *  tensors are unusable afterwards (clone() first if you keep using it). */
  toTransfer(): { payload: DataProtoPayload; transfer: ArrayBuffer[] } {
    const { batch, transfer } = packTensors(this.batch);
    return { payload: { kind: "DataProto", batch, nonTensorBatch: this.nonTensorBatch, metaInfo: this.metaInfo }, transfer };
  }

  static fromTransfer(payload: DataProtoPayload): DataProto {
    if (!isDataProtoPayload(payload)) throw new Error("DataProto.fromTransfer: not a DataProto payload (expected the object made by toTransfer)");
    return new DataProto(payload.batch, payload.nonTensorBatch, payload.metaInfo);
  }
}

/** verl's concat meta merge: `metrics` (dict or list of dicts) from every item becomes a dict of lists. */
function mergeMeta(list: DataProto[]): Record<string, unknown> {
  const merged: Record<string, unknown> = {};
  const metrics: Record<string, unknown>[] = [];
  for (const d of list) {
    for (const [k, v] of Object.entries(d.metaInfo)) {
      if (k === "metrics") {
        if (v === null || v === undefined) continue;
        if (Array.isArray(v)) metrics.push(...(v as Record<string, unknown>[]));
        else metrics.push(v as Record<string, unknown>);
      } else if (k in merged) {
        if (!deepEqual(merged[k], v)) throw new Error(`DataProto.concat: conflicting values for meta key '${k}'`);
      } else {
        merged[k] = v;
      }
    }
  }
  if (metrics.length > 0) merged.metrics = listOfDictToDictOfList(metrics);
  return merged;
}

/** [{a:1,b:2},{a:3,b:4}] -> {a:[1,3], b:[2,4]}; keys must appear in the first dict. */
export function listOfDictToDictOfList(list: Record<string, unknown>[]): Record<string, unknown[]> {
  if (list.length === 0) return {};
  const out: Record<string, unknown[]> = {};
  for (const k of Object.keys(list[0]!)) out[k] = [];
  list.forEach((d, i) => {
    if (d === null || typeof d !== "object") throw new Error(`metrics item ${i} is not an object`);
    for (const [k, v] of Object.entries(d)) {
      const col = out[k];
      if (!col) throw new Error(`metrics item ${i} has key '${k}' that item 0 lacks`);
      col.push(v);
    }
  });
  return out;
}

/** Pad by repeating rows from the start until the size divides by k (verl's pad_dataproto_to_divisor). */
export function padDataProtoToDivisor(data: DataProto, k: number): { padded: DataProto; padSize: number } {
  if (!Number.isInteger(k) || k < 1) throw new Error(`padDataProtoToDivisor: divisor must be a positive integer, got ${k}`);
  const n = data.length;
  if (n % k === 0) return { padded: data, padSize: 0 };
  const padSize = k - (n % k);
  const parts = [data];
  for (let left = padSize; left > 0; left -= Math.min(left, n)) parts.push(data.slice(0, Math.min(left, n)));
  return { padded: DataProto.concat(parts), padSize };
}

/** Drop the last padSize rows. */
export function unpadDataProto(data: DataProto, padSize: number): DataProto {
  if (!Number.isInteger(padSize) || padSize < 0 || padSize > data.length) {
    throw new Error(`unpadDataProto: pad size ${padSize} is not in [0, ${data.length}]`);
  }
  return padSize === 0 ? data : data.slice(0, data.length - padSize);
}
