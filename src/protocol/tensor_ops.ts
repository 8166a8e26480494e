// Row operations on TensorData (first dimension = rows). These back DataProto's
// indexing, concat and repeat. Every result owns a fresh buffer, so a result can
// be moved to another thread without detaching the source.
import { arrayFor, numel, rowSize, type TensorData, type TypedArray } from "./tensor.js";

/** Check a tensor is well formed; `where` names it in the error. */
export function checkTensor(t: TensorData, where: string): void {
  if (t === null || typeof t !== "object" || !ArrayBuffer.isView(t.data) || !Array.isArray(t.shape)) {
    throw new Error(`${where}: not a TensorData ({ data: TypedArray, shape: number[], dtype })`);
  }
  if (t.shape.length === 0) throw new Error(`${where}: a batch tensor needs a batch dimension, got shape []`);
  for (const d of t.shape) {
    if (!Number.isInteger(d) || d < 0) throw new Error(`${where}: bad shape [${t.shape.join(", ")}]`);
  }
  const expected = t.dtype === "float32" ? Float32Array : t.dtype === "int32" ? Int32Array : t.dtype === "bool" ? Uint8Array : undefined;
  if (expected === undefined) throw new Error(`${where}: unknown dtype ${String(t.dtype)}`);
  if (!(t.data instanceof expected)) {
    throw new Error(`${where}: dtype ${t.dtype} needs a ${expected.name}, got ${t.data.constructor.name}`);
  }
  const n = numel(t.shape);
  if (t.data.length !== n) {
    const detached = n > 0 && t.data.buffer.byteLength === 0;
    throw new Error(detached
      ? `${where}: its buffer was moved to another thread (toTransfer); clone() before transferring data you keep using`
      : `${where}: data has ${t.data.length} elements but shape [${t.shape.join(", ")}] needs ${n}`);
  }
}

function like(t: TensorData, rows: number): TensorData {
  return { data: arrayFor(t.dtype, rows * rowSize(t)), shape: [rows, ...t.shape.slice(1)], dtype: t.dtype };
}

/** Rows `idx` (already validated, non-negative) of t, in that order. */
export function gatherRows(t: TensorData, idx: ArrayLike<number>): TensorData {
  const r = rowSize(t);
  const out = like(t, idx.length);
  for (let i = 0; i < idx.length; i++) {
    const s = idx[i]! * r;
    out.data.set(t.data.subarray(s, s + r), i * r);
  }
  return out;
}

/** Rows [start, end) of t as a copy. */
export function sliceRows(t: TensorData, start: number, end: number): TensorData {
  const r = rowSize(t);
  const rows = Math.max(0, end - start);
  return { data: t.data.slice(start * r, (start + rows) * r) as TypedArray, shape: [rows, ...t.shape.slice(1)], dtype: t.dtype };
}

/** One row without its batch dimension (a view: do not transfer it). */
export function rowOf(t: TensorData, i: number): TensorData {
  const r = rowSize(t);
  return { data: t.data.subarray(i * r, (i + 1) * r), shape: t.shape.slice(1), dtype: t.dtype };
}

/** Concatenate along rows; dtype and trailing shape must agree. */
export function concatRows(parts: TensorData[], key: string): TensorData {
  const first = parts[0]!;
  const tail = first.shape.slice(1).join(",");
  let rows = 0;
  parts.forEach((p, i) => {
    if (p.dtype !== first.dtype) throw new Error(`concat: batch key '${key}' has dtype ${p.dtype} in item ${i} but ${first.dtype} in item 0`);
    if (p.shape.slice(1).join(",") !== tail) {
      throw new Error(`concat: batch key '${key}' has shape [${p.shape.join(", ")}] in item ${i}, incompatible with [${first.shape.join(", ")}] in item 0`);
    }
    rows += p.shape[0]!;
  });
  const out = like(first, rows);
  let off = 0;
  for (const p of parts) { out.data.set(p.data, off); off += p.data.length; }
  return out;
}

/** Row i of the result comes from source row `src[i]` (a repeat pattern). */
export function repeatIndex(counts: ArrayLike<number>): Int32Array {
  let total = 0;
  for (let i = 0; i < counts.length; i++) total += counts[i]!;
  const idx = new Int32Array(total);
  let k = 0;
  for (let i = 0; i < counts.length; i++) for (let j = 0; j < counts[i]!; j++) idx[k++] = i;
  return idx;
}

/** Exact equality (dtype, shape, values; NaN differs from NaN, as torch.equal). */
export function tensorsEqual(a: TensorData, b: TensorData): boolean {
  if (a.dtype !== b.dtype || a.shape.length !== b.shape.length || a.shape.some((d, i) => d !== b.shape[i])) return false;
  for (let i = 0; i < a.data.length; i++) if (a.data[i] !== b.data[i]) return false;
  return true;
}

export function cloneTensor(t: TensorData): TensorData {
  return { data: t.data.slice() as TypedArray, shape: [...t.shape], dtype: t.dtype };
}
