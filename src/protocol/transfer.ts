// Moving a DataProto between threads. The payload is structured-clone-able; the
// tensors' ArrayBuffers go in the transfer list so postMessage moves them (the
// sender's arrays become detached) instead of copying element by element.
// SharedArrayBuffer-backed tensors are shared as they are; a tensor that views
// only part of a larger buffer is first copied (one memcpy) so that moving it
// cannot detach unrelated data.
import type { TensorData, TypedArray } from "./tensor.js";

export interface DataProtoPayload {
  /** Marks the object as a DataProto payload; checked by fromTransfer. */
  kind: "DataProto";
  batch: Record<string, TensorData>;
  nonTensorBatch: Record<string, unknown[]>;
  metaInfo: Record<string, unknown>;
}

export function packTensors(batch: Record<string, TensorData>): { batch: Record<string, TensorData>; transfer: ArrayBuffer[] } {
  const transfer = new Set<ArrayBuffer>();
  const out: Record<string, TensorData> = {};
  for (const [key, t] of Object.entries(batch)) {
    let data: TypedArray = t.data;
    const buf = data.buffer;
    const isShared = typeof SharedArrayBuffer !== "undefined" && buf instanceof SharedArrayBuffer;
    if (!isShared) {
      const whole = data.byteOffset === 0 && data.byteLength === buf.byteLength;
      if (!whole) data = data.slice() as TypedArray;
      transfer.add(data.buffer as ArrayBuffer);
    }
    out[key] = { data, shape: [...t.shape], dtype: t.dtype };
  }
  return { batch: out, transfer: [...transfer] };
}

export function isDataProtoPayload(x: unknown): x is DataProtoPayload {
  if (x === null || typeof x !== "object") return false;
  const p = x as Record<string, unknown>;
  return p.kind === "DataProto" && typeof p.batch === "object" && typeof p.nonTensorBatch === "object" && typeof p.metaInfo === "object";
}
