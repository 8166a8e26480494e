// One message between hosts: a small header and a value whose typed arrays
// (DataProto tensors, all-reduce chunks) travel as raw bytes, never as JSON.
// Layout: u32 length of the skeleton | skeleton (v8 serialize: the header and
// the value with each large typed array replaced by an index) | padding to 8 |
// each typed array's bytes, padded to 8. Decoding copies each array into its
// own ArrayBuffer, so it can be moved on to a worker thread.
import { deserialize, serialize } from "node:v8";

const BIN_MARK = "__verl_ts_bin__";
/** Smaller typed arrays stay in the skeleton (the v8 format holds them fine). */
const MIN_BIN_BYTES = 256;
const MAX_DEPTH = 32;

type TypedArrayCtor = new (buffer: ArrayBuffer, byteOffset?: number, length?: number) => ArrayBufferView;
const CTORS: Record<string, TypedArrayCtor> = {
  Float32Array, Float64Array, Int8Array, Int16Array, Int32Array, Uint8Array, Uint16Array, Uint32Array, Uint8ClampedArray,
  BigInt64Array: BigInt64Array as unknown as TypedArrayCtor, BigUint64Array: BigUint64Array as unknown as TypedArrayCtor,
};

interface Skeleton {
  head: unknown;
  value: unknown;
  /** Per binary: constructor name and byte length. */
  bins: [string, number][];
}

export interface Frame<H = Record<string, unknown>> {
  head: H;
  value: unknown;
  /** The fresh buffers behind the value's large typed arrays (free to move to a thread). */
  buffers: ArrayBuffer[];
}

const pad8 = (n: number) => (n + 7) & ~7;

function isPlain(v: object): boolean {
  const p = Object.getPrototypeOf(v) as unknown;
  return p === Object.prototype || p === null;
}

export function encodeFrame(head: object, value: unknown = null): Buffer {
  const bins: ArrayBufferView[] = [];
  const walk = (v: unknown, depth: number): unknown => {
    if (v === null || typeof v !== "object" || depth > MAX_DEPTH) return v;
    if (ArrayBuffer.isView(v)) {
      if (v instanceof DataView || v.byteLength < MIN_BIN_BYTES || !(v.constructor.name in CTORS)) return v;
      bins.push(v);
      return { [BIN_MARK]: bins.length - 1 };
    }
    if (Array.isArray(v)) return v.map((x) => walk(x, depth + 1));
    if (isPlain(v)) {
      const out: Record<string, unknown> = {};
      for (const [k, x] of Object.entries(v)) out[k] = walk(x, depth + 1);
      return out;
    }
    return v;
  };
  const skeleton: Skeleton = { head, value: walk(value, 0), bins: [] };
  skeleton.bins = bins.map((b) => [b.constructor.name, b.byteLength]);
  const sk = serialize(skeleton);
  let total = pad8(4 + sk.length);
  for (const b of bins) total += pad8(b.byteLength);
  const out = Buffer.allocUnsafe(total);
  out.writeUInt32LE(sk.length, 0);
  sk.copy(out, 4);
  let off = pad8(4 + sk.length);
  for (const b of bins) {
    out.set(new Uint8Array(b.buffer, b.byteOffset, b.byteLength), off);
    off += pad8(b.byteLength);
  }
  return out;
}

export function decodeFrame<H = Record<string, unknown>>(buf: Buffer): Frame<H> {
  if (buf.length < 4) throw new Error(`wire: a frame of ${buf.length} bytes is too short`);
  const skLen = buf.readUInt32LE(0);
  if (4 + skLen > buf.length) throw new Error(`wire: frame header claims ${skLen} bytes but the frame has ${buf.length}`);
  const sk = deserialize(buf.subarray(4, 4 + skLen)) as Skeleton;
  let off = pad8(4 + skLen);
  const arrays = sk.bins.map(([name, bytes]) => {
    const Ctor = CTORS[name];
    if (!Ctor) throw new Error(`wire: unknown typed array '${name}'`);
    if (off + bytes > buf.length) throw new Error("wire: frame is truncated");
    const ab = new ArrayBuffer(bytes);
    new Uint8Array(ab).set(buf.subarray(off, off + bytes));
    off += pad8(bytes);
    return new Ctor(ab);
  });
  const walk = (v: unknown, depth: number): unknown => {
    if (v === null || typeof v !== "object" || depth > MAX_DEPTH || ArrayBuffer.isView(v)) return v;
    if (Array.isArray(v)) {
      for (let i = 0; i < v.length; i++) v[i] = walk(v[i], depth + 1);
      return v;
    }
    if (!isPlain(v)) return v;
    const rec = v as Record<string, unknown>;
    const keys = Object.keys(rec);
    if (keys.length === 1 && keys[0] === BIN_MARK) return arrays[rec[BIN_MARK] as number];
    for (const k of keys) rec[k] = walk(rec[k], depth + 1);
    return rec;
  };
  return { head: sk.head as H, value: walk(sk.value, 0), buffers: arrays.map((a) => a.buffer as ArrayBuffer) };
}
