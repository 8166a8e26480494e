// The all-reduce's arithmetic on the bridge memory in WebAssembly SIMD: a JS loop
// over a SharedArrayBuffer-backed Float32Array runs at 4-5 ns an element here (V8
// neither vectorises it nor caches the loads), which made the combine and the mean
// cost more than the network; these loops run near memory speed. The module is
// assembled here (a few hundred bytes; no toolchain or dependency) and imports the
// bridge's shared memory. Results are the JS loops' bits: f32/f64 add and divide
// are IEEE operations rounded once in both (a float32 sum or quotient computed in
// double and rounded to float32 is the correctly rounded float32 result, since
// 53 >= 2*24+2), so only NaN payloads may differ. The mean's divide is fused into
// the last reduce-scatter step's add, so no pass of its own.

/** dst[i] += src[i] for n elements (byte offsets). */
export type AddFn = (dst: number, src: number, n: number) => void;
/** dst[i] = (dst[i] + src[i]) / d for n elements (byte offsets): each step rounded once, as in JS. */
export type AddDivFn = (dst: number, src: number, n: number, d: number) => void;

export interface SimdKernels {
  add32: AddFn;
  add64: AddFn;
  addDiv32: AddDivFn;
  addDiv64: AddDivFn;
}

const uleb = (n: number): number[] => {
  const out: number[] = [];
  do {
    let b = n & 0x7f;
    n >>>= 7;
    if (n) b |= 0x80;
    out.push(b);
  } while (n);
  return out;
};
const str = (s: string) => [...uleb(s.length), ...Buffer.from(s)];
const section = (id: number, body: number[]) => [id, ...uleb(body.length), ...body];
const vec = (items: number[][]) => [...uleb(items.length), ...items.flat()];

// Opcodes used below.
const GET = 0x20, SET = 0x21, I32C = 0x41, EQZ = 0x45, ADD = 0x6a, SUB = 0x6b, AND = 0x71, SHRU = 0x76;
const BLOCK = [0x02, 0x40], LOOP = [0x03, 0x40], BR = 0x0c, BRIF = 0x0d, END = 0x0b;
const simd = (op: number) => [0xfd, ...uleb(op)];

/**
 * One element-wise loop: 16-byte vectors, then the scalar tail. dst += src, or with `div`
 * dst = (dst + src) / d (param 3). f64: two lanes of 8 bytes, else four of 4.
 */
function body(f64: boolean, div: boolean): number[] {
  const K = div ? 4 : 3; // the counter local, after the params
  const lanesLog = f64 ? 1 : 2, elem = f64 ? 8 : 4;
  const vload = [...simd(0x00), 0, 0], vstore = [...simd(0x0b), 0, 0];
  const sload = [f64 ? 0x2b : 0x2a, f64 ? 3 : 2, 0], sstore = [f64 ? 0x39 : 0x38, f64 ? 3 : 2, 0];
  const vop = [...simd(f64 ? 0xf0 : 0xe4), ...(div ? [GET, 3, ...simd(f64 ? 0x14 : 0x13), ...simd(f64 ? 0xf3 : 0xe7)] : [])];
  const sop = [f64 ? 0xa0 : 0x92, ...(div ? [GET, 3, f64 ? 0xa3 : 0x95] : [])];
  const step = (bytes: number) => [GET, 0, I32C, bytes, ADD, SET, 0, GET, 1, I32C, bytes, ADD, SET, 1, GET, K, I32C, 1, SUB, SET, K, BR, 0];
  const loop = (load: number[], store: number[], op: number[], bytes: number) => [
    ...BLOCK, ...LOOP, GET, K, EQZ, BRIF, 1,
    GET, 0, GET, 0, ...load, GET, 1, ...load, ...op, ...store,
    ...step(bytes), END, END,
  ];
  const code = [
    GET, 2, I32C, lanesLog, SHRU, SET, K, ...loop(vload, vstore, vop, 16),
    GET, 2, I32C, (1 << lanesLog) - 1, AND, SET, K, ...loop(sload, sstore, sop, elem),
    END,
  ];
  const locals = [1, 1, 0x7f]; // one i32
  return [...uleb(locals.length + code.length), ...locals, ...code];
}

function moduleBytes(): Uint8Array {
  const I32 = 0x7f, F32 = 0x7d, F64 = 0x7c;
  const types = vec([[0x60, 3, I32, I32, I32, 0], [0x60, 4, I32, I32, I32, F32, 0], [0x60, 4, I32, I32, I32, F64, 0]]);
  // Imported shared memory: flags 3 (max given, shared), min 0, max 65536 pages.
  const imports = vec([[...str("m"), ...str("mem"), 0x02, 0x03, 0, ...uleb(65536)]]);
  const funcs = vec([[0], [0], [1], [2]]);
  const names = ["add32", "add64", "addDiv32", "addDiv64"];
  const exports = vec(names.map((n, i) => [...str(n), 0x00, i]));
  const code = vec([body(false, false), body(true, false), body(false, true), body(true, true)]);
  return new Uint8Array([
    0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00,
    ...section(1, types), ...section(2, imports), ...section(3, funcs), ...section(7, exports), ...section(10, code),
  ]);
}

/** A shared WebAssembly.Memory (this project's TypeScript libs do not declare WebAssembly). */
export interface WasmMemory {
  readonly buffer: SharedArrayBuffer;
  /** Adds `pages` 64 KiB pages; every thread's `buffer` then shows the new length (views never move). */
  grow(pages: number): number;
}
interface Wasm {
  Memory: new (d: { initial: number; maximum: number; shared: boolean }) => WasmMemory;
  Module: new (bytes: Uint8Array) => object;
  Instance: new (m: object, imports: object) => { exports: unknown };
}
const WA = (globalThis as unknown as { WebAssembly: Wasm }).WebAssembly;

/** A shared memory of at least `bytes` (whole 64 KiB pages); `growable`: up to 4 GiB by grow(). */
export function sharedMemory(bytes: number, growable = false): WasmMemory {
  const pages = Math.ceil(bytes / 65536);
  return new WA.Memory({ initial: pages, maximum: growable ? 65536 : pages, shared: true });
}

let compiled: object | undefined;

/** The kernels bound to `memory`. */
export function simdKernels(memory: WasmMemory): SimdKernels {
  compiled ??= new WA.Module(moduleBytes());
  return new WA.Instance(compiled, { m: { mem: memory } }).exports as SimdKernels;
}
