// The safetensors format: an 8-byte little-endian header length, a JSON header
// {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}}, then
// the raw little-endian tensor bytes. We read F32, F16 and BF16 (to float32) and
// write F32.
import { readFileSync } from "node:fs";

export interface NamedArray {
  data: Float32Array;
  shape: number[];
}

const BYTES: Record<string, number> = { F32: 4, F16: 2, BF16: 2 };

/** float16 bits -> float32 value. */
export function halfToFloat(h: number): number {
  const s = h & 0x8000 ? -1 : 1, e = (h >> 10) & 0x1f, f = h & 0x3ff;
  if (e === 0) return s * f * 2 ** -24;
  if (e === 31) return f ? NaN : s * Infinity;
  return s * (1 + f / 1024) * 2 ** (e - 15);
}

interface HeaderEntry { dtype: string; shape: number[]; data_offsets: [number, number] }

/** Parse a safetensors buffer; every tensor comes back as float32. `file` names the source in errors. */
export function parseSafetensors(buf: Uint8Array, file: string): { tensors: Map<string, NamedArray>; metadata: Record<string, string> } {
  if (buf.byteLength < 8) throw new Error(`${file}: too short to be a safetensors file`);
  const dv = new DataView(buf.buffer, buf.byteOffset, buf.byteLength);
  const n = Number(dv.getBigUint64(0, true));
  if (n <= 0 || 8 + n > buf.byteLength) throw new Error(`${file}: bad safetensors header length ${n}`);
  let header: Record<string, unknown>;
  try {
    header = JSON.parse(new TextDecoder().decode(buf.subarray(8, 8 + n))) as Record<string, unknown>;
  } catch (e) {
    throw new Error(`${file}: safetensors header is not valid JSON (${(e as Error).message})`);
  }
  const base = 8 + n, dataLen = buf.byteLength - base;
  const tensors = new Map<string, NamedArray>();
  let metadata: Record<string, string> = {};
  for (const [name, raw] of Object.entries(header)) {
    if (name === "__metadata__") { metadata = (raw ?? {}) as Record<string, string>; continue; }
    const e = raw as HeaderEntry;
    const width = BYTES[e.dtype];
    if (!width) throw new Error(`${file}: tensor '${name}' has dtype ${e.dtype}; supported: ${Object.keys(BYTES).join(", ")}`);
    const count = e.shape.reduce((a, b) => a * b, 1);
    const [begin, end] = e.data_offsets;
    if (end - begin !== count * width || begin < 0 || end > dataLen) {
      throw new Error(`${file}: tensor '${name}' offsets [${begin}, ${end}] do not fit shape [${e.shape}] ${e.dtype} in ${dataLen} data bytes`);
    }
    const at = buf.byteOffset + base + begin, out = new Float32Array(count);
    if (e.dtype === "F32") {
      new Uint8Array(out.buffer).set(new Uint8Array(buf.buffer, at, count * 4));
    } else {
      const tdv = new DataView(buf.buffer, at, count * 2), bf = e.dtype === "BF16", u32 = new Uint32Array(out.buffer);
      for (let i = 0; i < count; i++) {
        const h = tdv.getUint16(2 * i, true);
        if (bf) u32[i] = h << 16;
        else out[i] = halfToFloat(h);
      }
    }
    tensors.set(name, { data: out, shape: [...e.shape] });
  }
  return { tensors, metadata };
}

export function readSafetensors(path: string): { tensors: Map<string, NamedArray>; metadata: Record<string, string> } {
  return parseSafetensors(new Uint8Array(readFileSync(path)), path);
}

/** Serialise float32 tensors (sorted by name, 8-byte aligned header, as the Python library writes). */
export function serializeSafetensors(tensors: Map<string, NamedArray>, metadata: Record<string, string> = { format: "pt" }): Uint8Array {
  const names = [...tensors.keys()].sort();
  const header: Record<string, unknown> = { __metadata__: metadata };
  let offset = 0;
  for (const name of names) {
    const t = tensors.get(name)!;
    if (t.data.length !== t.shape.reduce((a, b) => a * b, 1)) throw new Error(`safetensors: '${name}' has ${t.data.length} values for shape [${t.shape}]`);
    header[name] = { dtype: "F32", shape: t.shape, data_offsets: [offset, offset + t.data.byteLength] };
    offset += t.data.byteLength;
  }
  let json = JSON.stringify(header);
  json += " ".repeat((8 - ((8 + Buffer.byteLength(json)) % 8)) % 8);
  const hbytes = new TextEncoder().encode(json);
  const out = new Uint8Array(8 + hbytes.byteLength + offset);
  new DataView(out.buffer).setBigUint64(0, BigInt(hbytes.byteLength), true);
  out.set(hbytes, 8);
  let at = 8 + hbytes.byteLength;
  for (const name of names) {
    const d = tensors.get(name)!.data;
    out.set(new Uint8Array(d.buffer, d.byteOffset, d.byteLength), at);
    at += d.byteLength;
  }
  return out;
}
