// A small WebAssembly assembler: enough to emit SIMD kernels specialised at run
// time (head size, group size baked in) without a compiler in the toolchain.
// Functions import one shared memory ("env" "memory") and address it in bytes.
import { wasmApi } from "./wasm_api.js";

export const enum Ty { i32 = 0x7f, f32 = 0x7d, v128 = 0x7b }

function uleb(n: number): number[] {
  const out: number[] = [];
  do {
    let b = n & 0x7f;
    n >>>= 7;
    if (n !== 0) b |= 0x80;
    out.push(b);
  } while (n !== 0);
  return out;
}

function sleb(n: number): number[] {
  const out: number[] = [];
  for (;;) {
    const b = n & 0x7f;
    n >>= 7;
    if ((n === 0 && (b & 0x40) === 0) || (n === -1 && (b & 0x40) !== 0)) { out.push(b); return out; }
    out.push(b | 0x80);
  }
}

const utf8 = (s: string) => [...new TextEncoder().encode(s)];
const vec = (items: number[][]) => [...uleb(items.length), ...items.flat()];

/** SIMD opcodes (after the 0xfd prefix) used by the kernels. */
export const V = {
  load: 0x00, store: 0x0b, i8x16Shuffle: 0x0d, f32x4Splat: 0x13, f32x4Extract: 0x1f,
  f32x4Nearest: 0x6a, i32x4Shl: 0xab, i32x4Add: 0xae,
  f32x4Add: 0xe4, f32x4Sub: 0xe5, f32x4Mul: 0xe6, f32x4Div: 0xe7, f32x4Min: 0xe8, f32x4Max: 0xe9,
  i32x4TruncSatF32x4S: 0xf8, i32x4Splat: 0x11,
} as const;

/** One function body, written as a stack machine with chained emitters. */
export class Fn {
  readonly code: number[] = [];
  private readonly locals: Ty[] = [];

  constructor(readonly params: Ty[], readonly results: Ty[] = []) {}

  /** A new local of type t; returns its index. */
  local(t: Ty): number {
    this.locals.push(t);
    return this.params.length + this.locals.length - 1;
  }

  raw(...bytes: number[]): this { this.code.push(...bytes); return this; }
  get(i: number): this { return this.raw(0x20, ...uleb(i)); }
  set(i: number): this { return this.raw(0x21, ...uleb(i)); }
  i32(v: number): this { return this.raw(0x41, ...sleb(v | 0)); }
  f32(v: number): this {
    const b = new Uint8Array(new Float32Array([v]).buffer);
    return this.raw(0x43, ...b);
  }
  i32Add(): this { return this.raw(0x6a); }
  i32Mul(): this { return this.raw(0x6c); }
  i32Shl(): this { return this.raw(0x74); }
  i32GeS(): this { return this.raw(0x4e); }
  i32LtS(): this { return this.raw(0x48); }
  f32Add(): this { return this.raw(0x92); }
  f32Mul(): this { return this.raw(0x94); }
  f32Div(): this { return this.raw(0x95); }
  f32Max(): this { return this.raw(0x97); }
  f32Load(offset = 0): this { return this.raw(0x2a, 2, ...uleb(offset)); }
  f32Store(offset = 0): this { return this.raw(0x38, 2, ...uleb(offset)); }
  simd(op: number, ...imm: number[]): this { return this.raw(0xfd, ...uleb(op), ...imm); }
  vLoad(offset = 0): this { return this.simd(V.load, 4, ...uleb(offset)); }
  vStore(offset = 0): this { return this.simd(V.store, 4, ...uleb(offset)); }
  lane(i: number): this { return this.simd(V.f32x4Extract, i); }
  /** i8x16.shuffle picking four f32 lanes from the concatenation of the two operands (lanes 0-7). */
  shuffle32(l0: number, l1: number, l2: number, l3: number): this {
    return this.simd(V.i8x16Shuffle, ...[l0, l1, l2, l3].flatMap((l) => [4 * l, 4 * l + 1, 4 * l + 2, 4 * l + 3]));
  }
  /** block { loop { ... } }: `body` gets br depths: 1 leaves, 0 repeats. */
  loop(body: () => void): this {
    this.raw(0x02, 0x40, 0x03, 0x40);
    body();
    return this.raw(0x0b, 0x0b);
  }
  br(depth: number): this { return this.raw(0x0c, ...uleb(depth)); }
  brIf(depth: number): this { return this.raw(0x0d, ...uleb(depth)); }

  encode(): number[] {
    const body = [...vec(this.locals.map((t) => [1, t])), ...this.code, 0x0b];
    return [...uleb(body.length), ...body];
  }
}

/** A module importing env.memory and exporting the named functions. */
export function assemble(fns: Record<string, Fn>): Uint8Array {
  const list = Object.entries(fns);
  const section = (id: number, content: number[]) => [id, ...uleb(content.length), ...content];
  const types = vec(list.map(([, f]) => [0x60, ...vec(f.params.map((p) => [p])), ...vec(f.results.map((r) => [r]))]));
  const name = (s: string) => [...uleb(utf8(s).length), ...utf8(s)];
  const imports = vec([[...name("env"), ...name("memory"), 0x02, 0x00, 0x01]]); // memory, limits: min 1 page, no max
  const funcs = vec(list.map((_, i) => uleb(i)));
  const exports = vec(list.map(([n], i) => [...name(n), 0x00, ...uleb(i)]));
  const code = vec(list.map(([, f]) => f.encode()));
  return new Uint8Array([
    0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00,
    ...section(1, types), ...section(2, imports), ...section(3, funcs), ...section(7, exports), ...section(10, code),
  ]);
}

let simdOk: boolean | undefined;

/** Whether this runtime validates a module using 128-bit SIMD. */
export function simdSupported(): boolean {
  if (simdOk === undefined) {
    const f = new Fn([], [Ty.f32]);
    f.f32(1).simd(V.f32x4Splat).lane(0);
    try {
      simdOk = wasmApi.validate(assemble({ probe: f }));
    } catch {
      simdOk = false;
    }
  }
  return simdOk === true;
}

const modules = new Map<string, object>();

/**
 * Instantiate the function `build()` makes against `memory`, compiling each
 * distinct kernel (by `key`) once per process: decoders are made per generate call.
 */
export function instantiateKernel<T>(memory: object, key: string, name: string, build: () => Fn): T {
  let mod = modules.get(key);
  if (!mod) {
    mod = new wasmApi.Module(assemble({ [name]: build() }));
    modules.set(key, mod);
  }
  return new wasmApi.Instance(mod, { env: { memory } }).exports[name] as T;
}
