// Kernels verl-ts registers behind tfjs's WebGPU backend (issue 23), so model code keeps
// calling tf.matMul. Today one: BatchMatMul on the tensor cores (webgpu_gemm.ts's direct
// kernel: operands packed to padded f16 copies, fragments loaded from storage) when the
// adapter has subgroup matrices and f16 and 16-bit matrix products were asked for
// (setMatmulPrecision, driven by verl's fsdp_config.mixed_precision.param_dtype). Anything
// else (float32 asked, a shape the kernel does not take, another backend) goes to tfjs's own
// kernel, which stays the reference and the fallback.
import * as tf from "@tensorflow/tfjs";
import {
  DEFAULT_DIRECT_TILE, DEFAULT_TILE, DirectGemmProgram, GemmProgram, PackF16Program, PackPadProgram, directPadding, fitTile, operandFormat,
  type DirectTile, type GemmShape, type GemmTile, type Rounding,
} from "./webgpu_gemm.js";
import type { GpuProgram, UniformValue } from "../rollout/webgpu_programs.js";

export type MatmulPrecision = "f32" | "f16" | "bf16";

interface TensorInfo { dataId: object; shape: number[]; dtype: string }
interface Backend {
  runWebGPUProgram(p: GpuProgram, inputs: TensorInfo[], dtype: string, uniforms?: UniformValue[]): TensorInfo;
  disposeData(id: object): boolean;
  incRef?(id: object): void;
}
type KernelArgs = { inputs: { a: TensorInfo; b: TensorInfo }; backend: Backend; attrs: { transposeA?: boolean; transposeB?: boolean } };
type KernelFunc = (args: KernelArgs) => TensorInfo;

/** Which products use the tensor cores, per thread (each rank thread has its own module state). */
const state: {
  precision: MatmulPrecision; installed: boolean; original?: KernelFunc; tile: GemmTile; direct: DirectTile;

  /** pack the operands to f16 first when both output extents reach this (0: always, Infinity: never) */
  packMin: number; calls: number; fallbacks: number;
} = { precision: "f32", installed: false, tile: { ...DEFAULT_TILE, buffers: 1 }, direct: DEFAULT_DIRECT_TILE, packMin: 256, calls: 0, fallbacks: 0 };

/** What the tensor-core path needs of the adapter, filled in by webgpu.ts. */
export const tensorCoreSupport = { available: false, reason: "the WebGPU backend was not initialised" };

export function matmulPrecision(): MatmulPrecision { return state.precision; }

/** Counters of the BatchMatMul override (products on the tensor cores, products sent to tfjs's kernel). */
export function tensorCoreStats(): { calls: number; fallbacks: number } { return { calls: state.calls, fallbacks: state.fallbacks }; }

/** verl's dtype names (bf16, bfloat16, fp16, float16, half, fp32, float32, float) to a matmul precision. */
export function parsePrecision(dtype: string, key: string): MatmulPrecision {
  const d = dtype.toLowerCase();
  if (["bf16", "bfloat16"].includes(d)) return "bf16";
  if (["fp16", "float16", "half", "f16"].includes(d)) return "f16";
  if (["fp32", "float32", "float", "f32"].includes(d)) return "f32";
  throw new Error(`${key}: unknown dtype '${dtype}' (use fp32, bf16 or fp16)`);
}

/**
 * Asks for 16-bit matrix products on this thread's WebGPU backend. On another backend, or
 * an adapter without the tensor-core features, products stay float32 and `false` is returned
 * (the caller reports it); with "f32" the override is uninstalled.
 */
export function setMatmulPrecision(p: MatmulPrecision, opts: { tile?: GemmTile; direct?: DirectTile; packMin?: number } = {}): boolean {
  state.precision = p;
  if (opts.tile) state.tile = opts.tile;
  if (opts.direct) state.direct = opts.direct;
  if (opts.packMin !== undefined) state.packMin = opts.packMin;
  if (p === "f32") { uninstall(); return true; }
  if (tf.getBackend() !== "webgpu" || !tensorCoreSupport.available) { state.precision = "f32"; return false; }
  install();
  return true;
}

function install(): void {
  if (state.installed) return;
  const k = tf.getKernel("BatchMatMul", "webgpu");
  if (!k) throw new Error("tensor-core matmul: tfjs's WebGPU backend has no BatchMatMul kernel to wrap");
  state.original = k.kernelFunc as unknown as KernelFunc;
  tf.unregisterKernel("BatchMatMul", "webgpu");
  tf.registerKernel({ kernelName: "BatchMatMul", backendName: "webgpu", kernelFunc: batchMatMul as unknown as tf.KernelFunc });
  state.installed = true;
}

function uninstall(): void {
  if (!state.installed || !state.original) return;
  tf.unregisterKernel("BatchMatMul", "webgpu");
  tf.registerKernel({ kernelName: "BatchMatMul", backendName: "webgpu", kernelFunc: state.original as unknown as tf.KernelFunc });
  state.installed = false;
}

const prod = (xs: number[]) => xs.reduce((a, b) => a * b, 1);

/** The product's shape in the kernel's terms, or null when the kernel does not take it. */
export function gemmShape(aShape: number[], bShape: number[], transposeA: boolean, transposeB: boolean): { shape: GemmShape; outShape: number[] } | null {
  if (aShape.length < 2 || bShape.length < 2) return null;
  const ar = aShape.length, br = bShape.length;
  const m = transposeA ? aShape[ar - 1]! : aShape[ar - 2]!, k = transposeA ? aShape[ar - 2]! : aShape[ar - 1]!;
  const kb = transposeB ? bShape[br - 1]! : bShape[br - 2]!, n = transposeB ? bShape[br - 2]! : bShape[br - 1]!;
  if (k !== kb) return null;
  const lead = (s: number[]) => s.slice(0, -2);
  const la = lead(aShape), lb = lead(bShape), batchA = prod(la), batchB = prod(lb);
  if (batchA !== batchB && batchA !== 1 && batchB !== 1) return null;
  const outLead = batchA >= batchB ? la : lb;
  if (batchA === batchB && la.length !== lb.length && la.join() !== lb.join()) return null;
  const batch = Math.max(batchA, batchB);
  if (m === 0 || n === 0 || k === 0) return null;
  return { shape: { batch, m, n, k, transposeA, transposeB, batchA, batchB }, outShape: [...outLead, m, n] };
}

function pack(backend: Backend, x: TensorInfo, rounding: Rounding): TensorInfo {
  const n = prod(x.shape);
  return backend.runWebGPUProgram(new PackF16Program(n, rounding), [x], "int32", PackF16Program.uniforms(n));
}

/**
 * One product with the workgroup-staged kernel, kept for the benchmark (bench/gpu_gemm.ts):
 * right on the H200 only single-buffered on whole tiles, and slower there than the direct
 * kernel, so the override never uses it; other cases need `experimental`.
 */
export function tensorCoreMatMul(backend: Backend, a: TensorInfo, b: TensorInfo, s: GemmShape, outShape: number[],
  opts: { tile?: GemmTile; packed?: boolean; rounding?: Rounding; strictUniformity?: boolean; experimental?: boolean } = {}): TensorInfo {
  const tile = fitTile(opts.tile ?? state.tile, s);
  if (!opts.experimental && (tile.buffers === 2 || s.m % tile.bm !== 0 || s.n % tile.bn !== 0)) {
    throw new Error(`staged tensor-core kernel: double-buffered tiles and edge tiles (here ${s.m} x ${s.n} on ${tile.bm} x ${tile.bn}, ${tile.buffers} buffers) gave wrong results on the H200 (docs/gpu.md); use directMatMul`);
  }
  const rounding = opts.rounding ?? (state.precision === "bf16" ? "bf16" : "f16");
  const packed = opts.packed ?? (s.m >= state.packMin && s.n >= state.packMin);
  const fa = operandFormat(s, "a", packed), fb = operandFormat(s, "b", packed);
  const pa = fa.packed ? pack(backend, a, rounding) : a, pb = fb.packed ? pack(backend, b, rounding) : b;
  const prog = new GemmProgram(s, tile, fa, fb, rounding, !opts.strictUniformity);
  const out = backend.runWebGPUProgram(prog, [pa, pb], "float32", prog.uniformValues());
  if (pa !== a) backend.disposeData(pa.dataId);
  if (pb !== b) backend.disposeData(pb.dataId);
  if (outShape.length === 3 && outShape.every((d, i) => d === out.shape[i])) return out;
  return { dataId: out.dataId, shape: outShape, dtype: "float32" };
}

/** The tfjs kernel `name` of this backend, called from inside a kernel (reshape, slice). */
function kernel(name: string): (a: object) => TensorInfo {
  const k = tf.getKernel(name, "webgpu");
  if (!k) throw new Error(`tensor-core matmul: tfjs's WebGPU backend has no ${name} kernel`);
  return k.kernelFunc as unknown as (a: object) => TensorInfo;
}

/**
 * One product with the direct kernel: both operands packed to zero-padded f16 copies, the
 * padded product, then the [m, n] corner sliced out when padding was needed.
 */
export function directMatMul(backend: Backend, a: TensorInfo, b: TensorInfo, s: GemmShape, outShape: number[],
  opts: { tile?: DirectTile; rounding?: Rounding; bPacked?: boolean; aPacked?: boolean } = {}): TensorInfo {
  const t = opts.tile ?? state.direct, rounding = opts.rounding ?? (state.precision === "bf16" ? "bf16" : "f16");
  const { mP, nP, kP } = directPadding(s, t);
  const packOne = (x: TensorInfo, batch: number, rows: number, cols: number, rowsP: number, colsP: number) => {
    const p = new PackPadProgram(batch, rows, cols, rowsP, colsP, rounding);
    return backend.runWebGPUProgram(p, [x], "int32", p.uniformValues());
  };
  // aPacked: a is already this product's padded f16 operand, written so by its producer (and owned by the caller)
  const pa = opts.aPacked ? a : s.transposeA ? packOne(a, s.batchA, s.k, s.m, kP, mP) : packOne(a, s.batchA, s.m, s.k, mP, kP);
  // bPacked: b is already this product's padded f16 operand (a PackedMatrix's words), kept by its owner
  const pb = opts.bPacked ? b : s.transposeB ? packOne(b, s.batchB, s.n, s.k, nP, kP) : packOne(b, s.batchB, s.k, s.n, kP, nP);
  const prog = new DirectGemmProgram(s, t);
  const full = backend.runWebGPUProgram(prog, [pa, pb], "float32", prog.uniformValues());
  if (!opts.aPacked) backend.disposeData(pa.dataId);
  if (!opts.bPacked) backend.disposeData(pb.dataId);
  let out = full;
  if (mP !== s.m || nP !== s.n) {
    out = kernel("Slice")({ inputs: { x: full }, backend, attrs: { begin: [0, 0, 0], size: [s.batch, s.m, s.n] } });
    backend.disposeData(full.dataId);
  }
  if (outShape.length === 3 && outShape.every((d, i) => d === out.shape[i])) return out;
  return { dataId: out.dataId, shape: outShape, dtype: "float32" };
}

/**
 * A float32 weight kept as the direct kernel's right operand: zero-padded f16 words (bf16
 * precision held in f16 for "bf16"), packed once so that products with it pack only their
 * left operand. The WebGPU decoder holds its weights this way under rollout.dtype=bf16/fp16.
 */
export class PackedMatrix {
  private constructor(readonly words: tf.Tensor, readonly k: number, readonly n: number, readonly transposed: boolean,
    readonly rounding: Rounding, readonly tile: DirectTile) {}

  /** w as [k, n] (transposed false) or [n, k] (true: the product multiplies by its transpose). */
  /** Matrices packed so far in this thread (tests check that weights are packed once, not per call). */
  static packs = 0;

  static pack(w: tf.Tensor2D, transposed: boolean, rounding: Rounding, tile: DirectTile = DEFAULT_DIRECT_TILE): PackedMatrix {
    PackedMatrix.packs++;
    if (tf.getBackend() !== "webgpu") throw new Error(`PackedMatrix: 16-bit weights need the WebGPU backend, this thread's is '${tf.getBackend()}'`);
    const [r, c] = w.shape, k = transposed ? c : r, n = transposed ? r : c;
    const { nP, kP } = directPadding({ batch: 1, m: 1, n, k, transposeA: false, transposeB: transposed, batchA: 1, batchB: 1 }, tile);
    const p = transposed ? new PackPadProgram(1, n, k, nP, kP, rounding) : new PackPadProgram(1, k, n, kP, nP, rounding);
    const info = (tf.backend() as unknown as Backend).runWebGPUProgram(p, [w], "int32", p.uniformValues());
    return new PackedMatrix(tf.engine().makeTensorFromTensorInfo(info as tf.TensorInfo), k, n, transposed, rounding, tile);
  }

  /** x [m, k] times the weight: float32 [m, n], accumulated in f32 on the tensor cores. */
  matMul(x: tf.Tensor2D): tf.Tensor2D {
    const [m, k] = x.shape;
    if (k !== this.k) throw new Error(`PackedMatrix: product of [${m}, ${k}] with a weight of ${this.k} rows`);
    const s: GemmShape = { batch: 1, m, n: this.n, k, transposeA: false, transposeB: this.transposed, batchA: 1, batchB: 1 };
    const info = directMatMul(tf.backend() as unknown as Backend, x, this.words, s, [m, this.n], { tile: this.tile, rounding: this.rounding, bPacked: true });
    return tf.engine().makeTensorFromTensorInfo(info as tf.TensorInfo) as tf.Tensor2D;
  }

  /** The padded shape [mP, kP] a left operand of m rows must have to be multiplied by this weight pre-packed. */
  leftPadding(m: number): { mP: number; kP: number } {
    const { mP, kP } = directPadding({ batch: 1, m, n: this.n, k: this.k, transposeA: false, transposeB: this.transposed, batchA: 1, batchB: 1 }, this.tile);
    return { mP, kP };
  }

  /**
   * The product of m rows given as padded f16 words ([leftPadding(m).mP, kP / 2] int32, padding
   * columns zero, rounded as this weight is), e.g. written by the decoder's normalisation: float32 [m, n].
   */
  matMulPacked(words: tf.Tensor, m: number): tf.Tensor2D {
    const { mP, kP } = this.leftPadding(m);
    if (words.dtype !== "int32" || words.size !== (mP * kP) / 2) throw new Error(`PackedMatrix: a packed left operand of ${m} rows needs ${(mP * kP) / 2} int32 words, got ${words.size} ${words.dtype}`);
    const s: GemmShape = { batch: 1, m, n: this.n, k: this.k, transposeA: false, transposeB: this.transposed, batchA: 1, batchB: 1 };
    const info = directMatMul(tf.backend() as unknown as Backend, words, this.words, s, [m, this.n], { tile: this.tile, rounding: this.rounding, bPacked: true, aPacked: true });
    return tf.engine().makeTensorFromTensorInfo(info as tf.TensorInfo) as tf.Tensor2D;
  }

  dispose(): void { this.words.dispose(); }
}

function batchMatMul(args: KernelArgs): TensorInfo {
  const { a, b } = args.inputs, ta = !!args.attrs.transposeA, tb = !!args.attrs.transposeB;
  const g = state.precision !== "f32" && a.dtype === "float32" && b.dtype === "float32" ? gemmShape(a.shape, b.shape, ta, tb) : null;
  if (!g) { state.fallbacks++; return state.original!(args); }
  state.calls++;
  return directMatMul(args.backend, a, b, g.shape, g.outShape);
}

/** verl's FSDP mixed-precision section as verl-ts runs it. */
export interface MixedPrecision { products: MatmulPrecision; key: string }

/**
 * `<section>.fsdp_config.mixed_precision.{param_dtype,reduce_dtype,buffer_dtype}` (absent: fp32).
 * param_dtype picks the matrix products' precision (bf16/fp16: the tensor-core kernel, inputs
 * rounded inside it, f32 accumulation; weights, gradients and optimizer state stay float32);
 * gradients are reduced and buffers kept in float32, so reduce_dtype and buffer_dtype other
 * than fp32 are an error naming the key.
 */
export function readMixedPrecision(get: (key: string) => string | null, section: string): MixedPrecision {
  const base = `${section}.fsdp_config.mixed_precision`;
  for (const k of ["reduce_dtype", "buffer_dtype"]) {
    const v = get(`${base}.${k}`);
    if (v !== null && parsePrecision(v, `${base}.${k}`) !== "f32") {
      throw new Error(`${base}.${k}=${v}: verl-ts reduces gradients and keeps buffers in float32 only (set fp32 or leave it out)`);
    }
  }
  const p = get(`${base}.param_dtype`);
  return { products: p === null ? "f32" : parsePrecision(p, `${base}.param_dtype`), key: `${base}.param_dtype` };
}

const reported = new Set<string>();

/**
 * Runs `fn` with this section's matrix precision, restoring float32 after (the rollout engine in
 * the same thread keeps its own float32 products). When 16-bit products were asked for but this
 * backend or adapter has no tensor-core kernel, the products stay float32 and one line says so.
 */
export async function withMatmulPrecision<T>(mp: MixedPrecision, fn: () => Promise<T>): Promise<T> {
  if (mp.products === "f32") return fn();
  const ok = setMatmulPrecision(mp.products);
  if (!reported.has(mp.key)) {
    reported.add(mp.key);
    console.error(ok
      ? `[verl-ts] ${mp.key}=${mp.products}: matrix products on the tensor cores (inputs rounded to ${mp.products === "bf16" ? "bf16 precision, held in f16" : "f16"}, f32 accumulation; float32 weights and optimizer state)`
      : `[verl-ts] ${mp.key}=${mp.products}: no tensor-core kernel on backend '${tf.getBackend()}' (${tensorCoreSupport.reason}); products stay float32`);
  }
  try {
    return await fn();
  } finally {
    setMatmulPrecision("f32");
  }
}
