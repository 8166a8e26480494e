// Kernels verl-ts registers behind tfjs's WebGPU backend (issue 23), so model code keeps
// calling tf.matMul. Today one: BatchMatMul on the tensor cores (webgpu_gemm.ts's direct
// kernel: operands packed to padded f16 copies, fragments loaded from storage) when the
// adapter has subgroup matrices and f16 and 16-bit matrix products were asked for
// (setMatmulPrecision, driven by verl's fsdp_config.mixed_precision.param_dtype). Anything
// else (float32 asked, a shape the kernel does not take, another backend) goes to tfjs's own
// kernel, which stays the reference and the fallback.
import * as tf from "@tensorflow/tfjs";
import {
  DEFAULT_DIRECT_TILE, DEFAULT_TILE, THIN_DIRECT_TILE, THIN_SIDE, isThinProduct, GemmProgram, PackF16Program, PackPadProgram, SplitKSumProgram, directKernel, directPadding, fitTile, operandFormat, stagedKernel,
  type DirectTile, type GemmShape, type GemmTile, type PaddedGemmKernel, type Rounding, type StagedTile,
} from "./webgpu_gemm.js";
import type { GpuProgram, UniformValue } from "../rollout/webgpu_programs.js";
import { GemmAutotuner, productClass, type ErrorCapture, type GemmCandidate, type GemmChoice, type GemmTimer } from "./gemm_autotune.js";
import { logger } from "../utils/logger.js";
import { isWeightLike } from "./weight_like.js";
import { holdPrefix } from "./webgpu_buffer_pool.js";
import { onDataReleased } from "./data_release.js";
import { submitRecorded } from "./webgpu_replay.js";

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
/** Whether the adapter runs the tensor-core kernels; `fragments` says in which fragment shape (subgroup_fragments.ts). */
export const tensorCoreSupport = { available: false, reason: "the WebGPU backend was not initialised", fragments: "" };

export function matmulPrecision(): MatmulPrecision { return state.precision; }

/** Whether this thread's products run on the tensor cores now (16-bit products on the WebGPU backend). */
export function onTensorCores(): boolean { return state.precision !== "f32" && state.installed && tf.getBackend() === "webgpu"; }

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

/**
 * Whether tfjs's WebGPU BatchMatMul would take its atomic split-K program (MatMulSplitKProgram) for
 * this float32 product: few 32 x 32 output tiles, more than 128 outputs, one batch and K >= 2000
 * (the rule of tfjs-backend-webgpu's batchMatMulImpl, with the backend's threshold).
 */
export function tfjsTakesAtomicSplitK(aShape: number[], bShape: number[], ta: boolean, tb: boolean, threshold: number): boolean {
  const ar = aShape.length, br = bShape.length;
  const outerA = ta ? aShape[ar - 1]! : aShape[ar - 2]!, outerB = tb ? bShape[br - 2]! : bShape[br - 1]!;
  const innerB = tb ? bShape[br - 1]! : bShape[br - 2]!;
  const batch = Math.max(prod(aShape.slice(0, -2)), prod(bShape.slice(0, -2)));
  const tiles = batch * Math.ceil(outerA / 32) * Math.ceil(outerB / 32);
  const few = tiles <= threshold || (outerA <= 8 && tiles <= threshold * 2);
  return few && batch * outerA * outerB > 128 && batch === 1 && innerB >= 2000;
}

/** tfjs's program types (webgpu_util's MatMulProgramType): the tiled one for few output tiles. */
const MATMUL_SMALL_OUTPUT_SIZE_PROGRAM = 2;

/**
 * tfjs's own BatchMatMul on WebGPU, kept off its atomic split-K program. With a transposed right
 * operand that program returns wrong products: x [200, 4864] times W^T, W [32, 4864], came back
 * with a relative error of 1.2 on an H100 and 1.4 on llvmpipe (the same product untransposed is
 * right), the shape of a LoRA factor or a value head on a short micro-batch. Its float atomics also
 * make the sum's order, and so its bits, vary from run to run. Such products take tfjs's tiled
 * small-output program instead (exact order, same bits every time).
 */
function guardedTfjsMatMul(tfjs: KernelFunc): KernelFunc {
  return (args) => {
    const { a, b } = args.inputs, backend = args.backend as Backend & { thresholdToIncreaseWorkgroups?: number };
    const flag = tf.env().getNumber("WEBGPU_THRESHOLD_TO_INCREASE_WORKGROUPS_FOR_MATMUL");
    const threshold = flag > 0 ? flag : backend.thresholdToIncreaseWorkgroups ?? 8;
    if (tf.env().getNumber("WEBGPU_MATMUL_PROGRAM_TYPE") >= 0 || !tfjsTakesAtomicSplitK(a.shape, b.shape, !!args.attrs.transposeA, !!args.attrs.transposeB, threshold)) return tfjs(args);
    tf.env().set("WEBGPU_MATMUL_PROGRAM_TYPE", MATMUL_SMALL_OUTPUT_SIZE_PROGRAM);
    try { return tfjs(args); } finally { tf.env().set("WEBGPU_MATMUL_PROGRAM_TYPE", -1); }
  };
}

let guardInstalled = false;
/** Registers the guarded float32 BatchMatMul on the webgpu backend (once; initBackend calls it). */
export function guardFloat32MatMul(): void {
  if (guardInstalled) return;
  const k = tf.getKernel("BatchMatMul", "webgpu");
  if (!k) throw new Error("float32 matmul guard: tfjs's WebGPU backend has no BatchMatMul kernel to wrap");
  if (state.installed) {
    // the tensor-core override is registered: guard what it falls back to
    state.original = guardedTfjsMatMul(state.original!);
  } else {
    tf.unregisterKernel("BatchMatMul", "webgpu");
    tf.registerKernel({ kernelName: "BatchMatMul", backendName: "webgpu", kernelFunc: guardedTfjsMatMul(k.kernelFunc as unknown as KernelFunc) as unknown as tf.KernelFunc });
  }
  guardInstalled = true;
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
function tfKernel(name: string): (a: object) => TensorInfo {
  const k = tf.getKernel(name, "webgpu");
  if (!k) throw new Error(`tensor-core matmul: tfjs's WebGPU backend has no ${name} kernel`);
  return k.kernelFunc as unknown as (a: object) => TensorInfo;
}

/** A packed operand's layout: what identifies its words (rounding, batch, stored extents) and its padded extents. */
export interface OperandLayout { base: string; batch: number; rowsP: number; colsP: number }

/**
 * Packed f16 copies of product operands, kept while their data lives.
 *
 * Weights: the forward product and the backward product with a weight pack it once each (two
 * layouts) instead of once a product, for as long as the weight's data is unchanged. Only data that
 * belongs to a tf.Variable, or is marked weight-like (engine/weight_like.ts), is kept this way; an
 * optimizer update assigns a variable new data, so the next product packs again, and the old copies
 * are freed when the old data is released (the backend's disposeData is wrapped for that). Nothing
 * in verl-ts writes a variable's buffer in place (assign replaces the data).
 *
 * Activations (`activationBytes` > 0): a tensor's data never changes either, and a pass packs the
 * same activation for several products: a linear layer's input for its forward product and again,
 * as the other layout, for its weight gradient; the output gradient for the input gradient and the
 * weight gradient; LoRA's input for the adapter's product and the frozen base product. Their copies
 * are kept too, least recently used first out once they pass `activationBytes` (trimmed after each
 * product, when nothing still to be recorded uses them), and freed with their data. A copy serves
 * another layout of the same operand when its rows are padded at least as far and its columns
 * alike (a K padded to 16 read from rows padded to 128: the rows past K are zeros no product
 * reads). VERL_GEMM_WEIGHT_CACHE=0 turns both off; VERL_GEMM_ACTIVATION_PACK_MB sets the bound (0: off).
 */
export class PackedWeightCache {
  /** copies packed so far (tests check that an unchanged weight is not packed again) */
  packs = 0;
  private readonly byData = new Map<object, Map<string, { info: TensorInfo; layout: OperandLayout }>>();
  /** activation copies, least recently used first: source data and layout key */
  private readonly lru = new Map<TensorInfo, { id: object; key: string; bytes: number }>();
  private heldBytes = 0;
  private readonly release: (id: object) => boolean;

  constructor(backend: Backend & { disposeData(id: object, force?: boolean): boolean }, public activationBytes = 0) {
    this.release = backend.disposeData.bind(backend);
    onDataReleased(backend, (id) => this.forget(id));
  }

  /**
   * x's packed copy in this layout: kept (owned false: the caller must not free it) when x is a
   * weight's data, or an activation while the bound allows; otherwise packed for the caller (owned).
   */
  get(x: TensorInfo, l: OperandLayout, pack: () => TensorInfo): { info: TensorInfo; owned: boolean } {
    const key = `${l.base}->${l.rowsP}x${l.colsP}`;
    const weight = keepsPackedCopies(x.dataId);
    if (!weight && this.activationBytes <= 0) { this.packs++; return { info: pack(), owned: true }; }
    let m = this.byData.get(x.dataId);
    const hit = m?.get(key) ?? (weight ? undefined : this.wider(m, l));
    if (hit) {
      if (!weight) this.touch(hit.info);
      return { info: hit.info, owned: false };
    }
    this.packs++;
    const info = pack();
    if (!m) this.byData.set(x.dataId, (m = new Map()));
    m.set(key, { info, layout: l });
    if (!weight) {
      const bytes = l.batch * l.rowsP * l.colsP * 2;
      this.lru.set(info, { id: x.dataId, key, bytes });
      this.heldBytes += bytes;
    }
    return { info, owned: false };
  }

  /** A kept activation copy with the same words per row and at least as many padded rows (batch 1). */
  private wider(m: Map<string, { info: TensorInfo; layout: OperandLayout }> | undefined, l: OperandLayout) {
    if (!m || l.batch !== 1) return undefined;
    for (const e of m.values()) if (e.layout.base === l.base && e.layout.colsP === l.colsP && e.layout.rowsP >= l.rowsP) return e;
    return undefined;
  }

  private touch(info: TensorInfo): void {
    const e = this.lru.get(info);
    if (e) { this.lru.delete(info); this.lru.set(info, e); }
  }

  /** Frees the least recently used activation copies past the bound. Call once a product is recorded (its copies are then owned by the queue). */
  trim(): void {
    for (const [info, e] of this.lru) {
      if (this.heldBytes <= this.activationBytes) break;
      this.lru.delete(info);
      this.heldBytes -= e.bytes;
      this.byData.get(e.id)?.delete(e.key);
      this.release(info.dataId);
    }
  }

  /** Operands with copies kept. */
  get size(): number { return this.byData.size; }

  /** Bytes of activation copies kept. */
  get activationBytesHeld(): number { return this.heldBytes; }

  private forget(id: object): void {
    const m = this.byData.get(id);
    if (!m) return;
    this.byData.delete(id);
    for (const { info } of m.values()) {
      const e = this.lru.get(info);
      if (e) { this.lru.delete(info); this.heldBytes -= e.bytes; }
      this.release(info.dataId);
    }
  }
}

/**
 * The registry answer per data object, remembered: walking a few hundred variables per product was
 * 3.5% of a LoRA step's host time on the H100. A data object's contents never change, so an answer
 * can only go stale by the object later becoming a variable's data (assign): then its copies are
 * not kept, which costs a pack, never a wrong product.
 */
const variableData = new WeakMap<object, boolean>();

/** Whether packed copies of this data are kept: it belongs to a tf.Variable (the engine's registry) or is marked weight-like. */
function keepsPackedCopies(id: object): boolean {
  if (isWeightLike(id)) return true;
  let known = variableData.get(id);
  if (known === undefined) {
    known = false;
    const vars = tf.engine().state.registeredVariables;
    for (const name in vars) if (vars[name]!.dataId === id) { known = true; break; }
    variableData.set(id, known);
  }
  return known;
}

const weightCaches = new WeakMap<object, PackedWeightCache>();

/** Default bound on kept activation copies (VERL_GEMM_ACTIVATION_PACK_MB overrides; 0 turns sharing off). */
export const DEFAULT_ACTIVATION_PACK_MB = 4096;

/** VERL_GEMM_ACTIVATION_PACK_MB as bytes (unset: the default), or an error naming the variable. */
export function activationPackBytes(env: string | undefined = process.env.VERL_GEMM_ACTIVATION_PACK_MB): number {
  if (env === undefined || env === "") return DEFAULT_ACTIVATION_PACK_MB * 2 ** 20;
  const mb = Number(env);
  if (!Number.isFinite(mb) || mb < 0) throw new Error(`VERL_GEMM_ACTIVATION_PACK_MB must be a number of MiB >= 0, got '${env}'`);
  return Math.floor(mb * 2 ** 20);
}

/** This backend's operand cache (made on first use), or none under VERL_GEMM_WEIGHT_CACHE=0. */
export function packedWeightCache(backend: Backend): PackedWeightCache | undefined {
  if (process.env.VERL_GEMM_WEIGHT_CACHE === "0") return undefined;
  let c = weightCaches.get(backend);
  if (!c) weightCaches.set(backend, (c = new PackedWeightCache(backend, activationPackBytes())));
  return c;
}

/**
 * One product with the direct kernel: both operands packed to zero-padded f16 copies, the
 * padded product, then the [m, n] corner sliced out when padding was needed.
 */
export function directMatMul(backend: Backend, a: TensorInfo, b: TensorInfo, s: GemmShape, outShape: number[],
  opts: { tile?: DirectTile; rounding?: Rounding; bPacked?: boolean; aPacked?: boolean; residual?: TensorInfo } = {}): TensorInfo {
  return paddedMatMul(backend, a, b, s, outShape, directKernel(opts.tile ?? state.direct), { rounding: opts.rounding, bPacked: opts.bPacked, aPacked: opts.aPacked, residual: opts.residual });
}

/** The device's workgroup-memory limit, where the backend has a device (0: unknown). */
function workgroupLimit(backend: Backend): number {
  return (backend as { device?: { limits?: { maxComputeWorkgroupStorageSize?: number } } }).device?.limits?.maxComputeWorkgroupStorageSize ?? 0;
}

/** An operand's stored extents (rows, cols) and their padded sizes for this kernel. */
function operandExtents(s: GemmShape, kernel: PaddedGemmKernel, which: "a" | "b"): { batch: number; rows: number; cols: number; rowsP: number; colsP: number } {
  const { mP, nP, kP } = kernel.padding(s);
  if (which === "a") return s.transposeA ? { batch: s.batchA, rows: s.k, cols: s.m, rowsP: kP, colsP: mP } : { batch: s.batchA, rows: s.m, cols: s.k, rowsP: mP, colsP: kP };
  return s.transposeB ? { batch: s.batchB, rows: s.n, cols: s.k, rowsP: nP, colsP: kP } : { batch: s.batchB, rows: s.k, cols: s.n, rowsP: kP, colsP: nP };
}

/** What identifies a packed operand's words: rounding, batch, extents and padding. */
function operandLayout(s: GemmShape, kernel: PaddedGemmKernel, which: "a" | "b", rounding: Rounding): OperandLayout {
  const e = operandExtents(s, kernel, which);
  return { base: `${rounding}:${e.batch}:${e.rows}x${e.cols}`, batch: e.batch, rowsP: e.rowsP, colsP: e.colsP };
}

/** One operand as the kernel's zero-padded f16 words (int32, two halves a word). */
export function packOperand(backend: Backend, x: TensorInfo, s: GemmShape, kernel: PaddedGemmKernel, which: "a" | "b", rounding: Rounding): TensorInfo {
  const e = operandExtents(s, kernel, which);
  const p = new PackPadProgram(e.batch, e.rows, e.cols, e.rowsP, e.colsP, rounding);
  return backend.runWebGPUProgram(p, [x], "int32", p.uniformValues());
}

/**
 * One product with a kernel on padded f16 operands (direct or staged): both operands packed to
 * zero-padded f16 copies (not when aPacked/bPacked: it is already this kernel's padded operand), the
 * padded product, then the [m, n] corner sliced out when padding was needed. `residual` ([batch, m,
 * n] float32) is added to the product in the pass that sums the split-K parts and crops the padding
 * (a pass of its own where there is neither).
 */
export function paddedMatMul(backend: Backend, a: TensorInfo, b: TensorInfo, s: GemmShape, outShape: number[], kernel: PaddedGemmKernel,
  opts: { rounding?: Rounding; aPacked?: boolean; bPacked?: boolean; weights?: PackedWeightCache; residual?: TensorInfo } = {}): TensorInfo {
  const rounding = opts.rounding ?? (state.precision === "bf16" ? "bf16" : "f16");
  const limit = workgroupLimit(backend), bytes = kernel.workgroupBytes(s);
  // checked here: under skip_validation an oversized pipeline is built anyway and crashes the process (docs/gpu.md)
  if (limit > 0 && bytes > limit) throw new Error(`tensor-core kernel needs ${bytes} bytes of workgroup memory, the device allows ${limit}`);
  const { mP, nP } = kernel.padding(s);
  const operand = (x: TensorInfo, which: "a" | "b") => opts.weights
    ? opts.weights.get(x, operandLayout(s, kernel, which, rounding), () => packOperand(backend, x, s, kernel, which, rounding))
    : { info: packOperand(backend, x, s, kernel, which, rounding), owned: true };
  const ga = opts.aPacked ? { info: a, owned: false } : operand(a, "a");
  const gb = opts.bPacked ? { info: b, owned: false } : operand(b, "b");
  const prog = kernel.program(s), splits = kernel.splits?.(s) ?? 1;
  const full = backend.runWebGPUProgram(prog, [ga.info, gb.info], "float32", prog.uniformValues());
  if (ga.owned) backend.disposeData(ga.info.dataId);
  if (gb.owned) backend.disposeData(gb.info.dataId);
  opts.weights?.trim(); // kept copies past the bound go now that this product is recorded
  let out = full;
  if (splits > 1 || opts.residual) {
    // the parts' sum (and the residual), cut to [batch, m, n] in the same pass
    const sum = new SplitKSumProgram(s.batch, splits, s.m, s.n, mP, nP, !!opts.residual);
    out = backend.runWebGPUProgram(sum, opts.residual ? [full, opts.residual] : [full], "float32", sum.uniformValues());
    backend.disposeData(full.dataId);
  } else if (mP !== s.m && nP === s.n && s.batch === 1 && rowPrefixOn) {
    out = rowPrefix(backend, full, [1, s.m, s.n]);
  } else if (mP !== s.m || nP !== s.n) {
    out = tfKernel("Slice")({ inputs: { x: full }, backend, attrs: { begin: [0, 0, 0], size: [s.batch, s.m, s.n] } });
    backend.disposeData(full.dataId);
  }
  if (outShape.length === 3 && outShape.every((d, i) => d === out.shape[i])) return out;
  return { dataId: out.dataId, shape: outShape, dtype: "float32" };
}

/**
 * A padded product [1, mP, n] whose padding is in rows only, as its first m rows [1, m, n]: those
 * are a prefix of the buffer, so no Slice dispatch copies them out (one product in three or more
 * paid one: token counts are rarely multiples of 128, model widths are). The tensor's recorded shape
 * and its read-back bytes are cut to the prefix; the buffer keeps its size and returns to the pool by
 * it. VERL_GEMM_ROW_PREFIX=0 slices instead.
 */
let rowPrefixOn = process.env.VERL_GEMM_ROW_PREFIX !== "0";
/** Runs fn with row-padded products handed on as prefix views (on) or sliced copies (off); tests and the bench compare the two. */
export function withRowPrefix<T>(on: boolean, fn: () => T): T {
  const before = rowPrefixOn;
  rowPrefixOn = on;
  try { return fn(); } finally { rowPrefixOn = before; }
}
function rowPrefix(backend: Backend, full: TensorInfo, shape: [number, number, number]): TensorInfo {
  const entry = (backend as unknown as { tensorMap: { get(id: object): { shape: number[]; resource?: unknown } | undefined } }).tensorMap.get(full.dataId);
  if (!entry?.resource) throw new Error("rowPrefix: the product's output has no GPU buffer");
  entry.shape = shape;
  holdPrefix(entry.resource as Parameters<typeof holdPrefix>[0], prod(shape) * 4);
  return { dataId: full.dataId, shape, dtype: "float32" };
}

/**
 * Whether a stored [rows, cols] weight packs to the same words as the right operand of x W^T
 * (rows are N, padded as N) and of x W (rows are K, padded as K): both of its extents must already
 * be multiples of the N and the K padding of `tile`.
 */
export function layoutsShareWords(rows: number, cols: number, tile: DirectTile): boolean {
  const pad = (k: number, n: number) => directPadding({ batch: 1, m: 1, n, k, transposeA: false, transposeB: false, batchA: 1, batchB: 1 }, tile);
  const asNT = pad(cols, rows), asNN = pad(rows, cols); // NT: [nP, kP] stored; NN: [kP, nP]
  return asNT.nP === asNN.kP && asNT.kP === asNN.nP;
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

  /**
   * The same weight for the other product (x W where this is x W^T, or the reverse) sharing these
   * words, where both layouts pad alike (each stored extent already a multiple of both paddings);
   * undefined otherwise (pack it again). Disposing either disposes the shared words.
   */
  otherLayout(): PackedMatrix | undefined {
    const rows = this.transposed ? this.n : this.k, cols = this.transposed ? this.k : this.n;
    if (!layoutsShareWords(rows, cols, this.tile)) return undefined;
    return new PackedMatrix(this.words, rows, cols, !this.transposed, this.rounding, this.tile);
  }

  /**
   * x [m, k] times the weight: float32 [m, n], accumulated in f32 on the tensor cores; plus
   * `residual` ([m, n] float32) where given, added in the pass that sums the split-K parts.
   */
  matMul(x: tf.Tensor2D, residual?: tf.Tensor, opts: { trainer?: boolean } = {}): tf.Tensor2D {
    const [m, k] = x.shape;
    if (k !== this.k) throw new Error(`PackedMatrix: product of [${m}, ${k}] with a weight of ${this.k} rows`);
    const s: GemmShape = { batch: 1, m, n: this.n, k, transposeA: false, transposeB: this.transposed, batchA: 1, batchB: 1 };
    const backend = tf.backend() as unknown as Backend;
    // trainer: the trainer's products' rules, split-K where the product has few output tiles and a
    // long K (the split kernel pads as the unsplit one does, so the packed words serve it unchanged)
    // and x's packed copy shared with its other products (PackedWeightCache)
    const info = opts.trainer
      ? paddedMatMul(backend, x, this.words, s, [m, this.n], splitKernel(this.tile), { rounding: this.rounding, bPacked: true, weights: packedWeightCache(backend), residual: this.checkResidual(residual, m) })
      : directMatMul(backend, x, this.words, s, [m, this.n], { tile: this.tile, rounding: this.rounding, bPacked: true, residual: this.checkResidual(residual, m) });
    return tf.engine().makeTensorFromTensorInfo(info as tf.TensorInfo) as tf.Tensor2D;
  }

  private checkResidual(r: tf.Tensor | undefined, m: number): tf.Tensor | undefined {
    if (r && (r.dtype !== "float32" || r.size !== m * this.n)) throw new Error(`PackedMatrix: a residual of [${m}, ${this.n}] float32 expected, got [${r.shape}] ${r.dtype}`);
    return r;
  }

  /** The padded shape [mP, kP] a left operand of m rows must have to be multiplied by this weight pre-packed. */
  leftPadding(m: number): { mP: number; kP: number } {
    const { mP, kP } = directPadding({ batch: 1, m, n: this.n, k: this.k, transposeA: false, transposeB: this.transposed, batchA: 1, batchB: 1 }, this.tile);
    return { mP, kP };
  }

  /**
   * The product of m rows given as padded f16 words ([leftPadding(m).mP, kP / 2] int32, padding
   * columns zero, rounded as this weight is), e.g. written by the decoder's normalisation: float32 [m, n]
   * (plus `residual`, as in matMul).
   */
  matMulPacked(words: tf.Tensor, m: number, residual?: tf.Tensor): tf.Tensor2D {
    const { mP, kP } = this.leftPadding(m);
    if (words.dtype !== "int32" || words.size !== (mP * kP) / 2) throw new Error(`PackedMatrix: a packed left operand of ${m} rows needs ${(mP * kP) / 2} int32 words, got ${words.size} ${words.dtype}`);
    const s: GemmShape = { batch: 1, m, n: this.n, k: this.k, transposeA: false, transposeB: this.transposed, batchA: 1, batchB: 1 };
    const info = directMatMul(tf.backend() as unknown as Backend, words, this.words, s, [m, this.n], { tile: this.tile, rounding: this.rounding, bPacked: true, aPacked: true, residual: this.checkResidual(residual, m) });
    return tf.engine().makeTensorFromTensorInfo(info as tf.TensorInfo) as tf.Tensor2D;
  }

  dispose(): void { this.words.dispose(); }
}

// ---- the autotuned kernel choice (gemm_autotune.ts) ------------------------------------------

/** A tensor-core candidate: a padded-operand kernel with its name and parameters. */
export interface TensorCoreCandidate extends GemmCandidate { kernel: PaddedGemmKernel }

const directName = (t: DirectTile) => `direct_${t.sgM}x${t.sgN}_${t.tm}x${t.tn}${t.unroll > 1 ? `_u${t.unroll}` : ""}${t.prefetch ? "_pf" : ""}${t.baked ? "_baked" : ""}`;
const stagedName = (t: StagedTile) => `staged_${t.sgM}x${t.sgN}_${t.tm}x${t.tn}_k${t.kf}_b${t.buffers}${t.pad !== 16 ? `_p${t.pad}` : ""}`;

export function directCandidate(t: DirectTile): TensorCoreCandidate {
  return tensorCoreCandidate(directName(t), { kind: "direct", ...t }, directKernel(t));
}
export function stagedCandidate(t: StagedTile): TensorCoreCandidate {
  return tensorCoreCandidate(stagedName(t), { kind: "staged", ...t }, stagedKernel(t));
}
function tensorCoreCandidate(name: string, params: Record<string, unknown>, kernel: PaddedGemmKernel): TensorCoreCandidate {
  return {
    name, params, kernel,
    matMul(a, b, s) {
      const info = paddedMatMul(tf.backend() as unknown as Backend, a, b, s, [s.batch, s.m, s.n], kernel, { rounding: "f16" });
      return tf.engine().makeTensorFromTensorInfo(info as tf.TensorInfo);
    },
  };
}

const D = (sgM: number, sgN: number, tm: number, tn: number, unroll: 1 | 2 | 4, prefetch = false, baked = false): DirectTile => ({ sgM, sgN, tm, tn, unroll, prefetch, baked });
const S = (sgM: number, sgN: number, tm: number, tn: number, kf: number, buffers: 1 | 2, pad: 0 | 8 | 16 = 16): StagedTile => ({ sgM, sgN, tm, tn, kf, buffers, pad });
/**
 * What the tuner tries, in order (a tie keeps the earlier): the H200's best direct kernel first,
 * the issue's probe form (one subgroup of 4 x 4 fragments), 2 x 4 / 4 x 2 subgroups, K unrolled,
 * register prefetch, strides baked into the shader, and the aligned staged kernel.
 */
export const TENSOR_CORE_TILES: { direct: DirectTile[]; staged: StagedTile[] } = {
  direct: [
    D(2, 2, 4, 4, 1), D(1, 1, 4, 4, 1), D(1, 1, 4, 4, 1, false, true), D(2, 2, 4, 4, 1, false, true),
    D(2, 4, 4, 4, 1), D(4, 2, 4, 4, 1), D(2, 4, 4, 4, 1, false, true), D(4, 2, 4, 4, 1, false, true),
    D(2, 2, 4, 4, 2, false, true), D(2, 2, 4, 4, 4, false, true), D(2, 2, 4, 4, 1, true, true), D(1, 1, 4, 4, 1, true, true), D(1, 1, 4, 4, 2, true, true),
  ],
  staged: [S(2, 2, 4, 4, 2, 1), S(2, 2, 4, 4, 2, 2), S(2, 2, 4, 4, 2, 2, 0), S(2, 4, 4, 2, 2, 2), S(2, 2, 4, 4, 4, 1), S(4, 4, 2, 2, 2, 2, 0)],
};
/**
 * Every candidate, for the benchmark's sweep. The tuner takes the direct ones only: on the H200
 * (2026-12-04) the staged kernels passed the correctness check in one process and failed it in the
 * next (relative errors 0.3-1.4), which a one-time check cannot guard against.
 */
export const TENSOR_CORE_CANDIDATES: readonly TensorCoreCandidate[] = [...TENSOR_CORE_TILES.direct.map(directCandidate), ...TENSOR_CORE_TILES.staged.map(stagedCandidate)];
export const TUNED_CANDIDATES: readonly TensorCoreCandidate[] = TENSOR_CORE_TILES.direct.map(directCandidate);

type WebGpuBackendLike = Backend & {
  device: { pushErrorScope(f: string): void; popErrorScope(): Promise<{ message: string } | null>; queue: { onSubmittedWorkDone(): Promise<void> } };
  commandEncoder: unknown; endComputePassEncoder(): void; submitQueue(): void;
};

/** WebGPU error scopes around a candidate (validation: its shader; internal, out-of-memory). */
export const webGpuErrorCapture = (): ErrorCapture => ({
  begin() {
    const be = tf.backend() as unknown as WebGpuBackendLike;
    submitRecorded(be);
    for (const f of ["validation", "internal", "out-of-memory"]) be.device.pushErrorScope(f);
  },
  async end() {
    const be = tf.backend() as unknown as WebGpuBackendLike;
    submitRecorded(be);
    const errs: string[] = [];
    for (let i = 0; i < 3; i++) { const e = await be.device.popErrorScope(); if (e) errs.push(e.message); }
    return errs.length ? errs.join(" | ") : null;
  },
});

/** Wall time of products on the device: one warm-up, then enough repetitions for about 40 ms, to the queue's completion. */
export const webGpuTimer: GemmTimer = async (_c, run) => {
  const be = tf.backend() as unknown as WebGpuBackendLike;
  const done = async () => { submitRecorded(be); await be.device.queue.onSubmittedWorkDone(); };
  run(); await done();
  let t0 = performance.now();
  run(); await done();
  const once = performance.now() - t0;
  const reps = Math.max(3, Math.min(30, Math.ceil(40 / Math.max(once, 0.05))));
  t0 = performance.now();
  for (let i = 0; i < reps; i++) run();
  await done();
  return (performance.now() - t0) / reps;
};

/** tfjs's own float32 BatchMatMul, whether or not the override is installed. */
function f32Reference(a: tf.Tensor, b: tf.Tensor, s: GemmShape): tf.Tensor {
  if (!state.original) return tf.matMul(a as tf.Tensor3D, b as tf.Tensor3D, s.transposeA, s.transposeB);
  const info = state.original({ inputs: { a, b }, backend: tf.backend() as unknown as Backend, attrs: { transposeA: s.transposeA, transposeB: s.transposeB } });
  return tf.engine().makeTensorFromTensorInfo(info as tf.TensorInfo);
}

/**
 * a b (each 2-D, transposed as asked) on tfjs's float32 kernel whatever the products' precision: no
 * packing to 16 bits, so a float32 operand keeps its range (LoRA's merged path projects a weight
 * gradient onto its factors with it; src/models/lora_linear.ts). No gradient is recorded.
 */
export function float32MatMul(a: tf.Tensor2D, b: tf.Tensor2D, transposeA = false, transposeB = false): tf.Tensor2D {
  if (!state.installed) return tf.matMul(a, b, transposeA, transposeB);
  const [m, k] = transposeA ? [a.shape[1], a.shape[0]] : a.shape, n = transposeB ? b.shape[0] : b.shape[1];
  const s: GemmShape = { batch: 1, m, n, k, transposeA, transposeB, batchA: 1, batchB: 1 };
  return tf.tidy(() => f32Reference(a.reshape([1, ...a.shape]), b.reshape([1, ...b.shape]), s).reshape([m, n]) as tf.Tensor2D);
}

let tuner: GemmAutotuner | undefined;
/** Tuning runs when asked for (VERL_GEMM_AUTOTUNE=1) or to check a pinned kernel (VERL_GEMM_KERNEL). */
const autotuneOn = (): boolean => process.env.VERL_GEMM_AUTOTUNE === "1" || !!process.env.VERL_GEMM_KERNEL;
/** Classes a product needed before they were tuned (tuned at the next withMatmulPrecision boundary). */
const pendingClasses = new Set<string>();

/** This thread's tuner over the tensor-core candidates (VERL_GEMM_KERNEL read once). */
export function gemmAutotuner(): GemmAutotuner {
  tuner ??= new GemmAutotuner(TUNED_CANDIDATES, {
    timer: webGpuTimer, reference: f32Reference, errors: webGpuErrorCapture(), pin: process.env.VERL_GEMM_KERNEL,
    log: logger().child({ component: "gemm" }),
  });
  return tuner;
}

/**
 * Tunes product classes (default: those products have needed so far) on this thread's adapter.
 * Off unless VERL_GEMM_AUTOTUNE=1: every product then runs the default direct kernel. Tuning every
 * class at 4096^3 added more than 50 s to the start of a 0.5B GRPO run on the H200 (2026-12-04), and
 * the sweep's best kernel is the default (DEFAULT_DIRECT_TILE).
 */
export async function tuneTensorCores(classes: Iterable<string> = pendingClasses): Promise<GemmChoice[]> {
  if (!autotuneOn() || tf.getBackend() !== "webgpu" || !tensorCoreSupport.available) return [];
  const out: GemmChoice[] = [];
  for (const c of [...classes]) {
    out.push(await gemmAutotuner().tune(c));
    pendingClasses.delete(c);
  }
  return out;
}

/**
 * The kernel a product runs: its class's tuned choice (null: tfjs's float32 kernel), or, before
 * its class is tuned, the default direct kernel (the class is noted for tuning).
 */
function kernelFor(s: GemmShape): PaddedGemmKernel | null {
  if (thinProductOnF32(s, currentThinPolicy())) return null;
  const cls = productClass(s), choice = tuner?.chosen(cls);
  if (choice) {
    const c = choice.candidate as TensorCoreCandidate | null;
    if (!c) return null;
    return c.params.kind === "direct" ? splitKernel(c.params as unknown as DirectTile) : c.kernel;
  }
  if (autotuneOn()) pendingClasses.add(cls);
  // the default tile gives way to the thin one for thin products; a tile the caller set is kept
  return splitKernel(state.direct === DEFAULT_DIRECT_TILE && isThinProduct(s) ? THIN_DIRECT_TILE : state.direct);
}

/**
 * VERL_GEMM_THIN=f32: products with a thin side (m, n or K at most THIN_SIDE: LoRA's adapter
 * products) run on tfjs's float32 kernel, one dispatch with the transposes inside, instead of a
 * tensor-core product with its packs and split-K sums. Those with a long K as well (dA and dB over
 * the tokens) stay on the tensor cores, whose split-K spreads them over the GPU; tfjs's guarded kernel
 * (guardFloat32MatMul) would run them on its few small-output tiles.
 */
export function parseThinPolicy(v: string | undefined): "tc" | "f32" {
  if (v === undefined || v === "" || v === "tc") return "tc";
  if (v === "f32") return "f32";
  throw new Error(`VERL_GEMM_THIN=${v}: expected tc (tensor cores, the default) or f32`);
}
let thinPolicy: "tc" | "f32" | undefined;
/** The thin products' policy: set by setThinPolicy, else VERL_GEMM_THIN (read once). */
const currentThinPolicy = (): "tc" | "f32" => (thinPolicy ??= parseThinPolicy(process.env.VERL_GEMM_THIN));
/** Sets the thin products' policy (undefined: VERL_GEMM_THIN again); returns the previous one. Tests and benchmarks compare the two with it. */
export function setThinPolicy(p: "tc" | "f32" | undefined): "tc" | "f32" {
  const prev = currentThinPolicy();
  thinPolicy = p;
  return prev;
}
/** K from which a product with a thin side stays on the tensor cores under VERL_GEMM_THIN=f32 (tfjs's own bound for a long K). */
export const THIN_F32_MAX_K = 2000;
/** Whether a product runs on tfjs's float32 kernel under the thin policy `policy`. */
export function thinProductOnF32(s: GemmShape, policy: "tc" | "f32"): boolean {
  if (policy !== "f32") return false;
  return s.k <= THIN_SIDE || (Math.min(s.m, s.n) <= THIN_SIDE && s.k < THIN_F32_MAX_K);
}

/**
 * A direct tile's kernel for the trainer's products, with split-K where a product has few output
 * tiles and a long K (directSplits). Only here: the decoder's packed weights (PackedMatrix) and the
 * tuner's timings run unsplit.
 */
const splitKernels = new Map<DirectTile, PaddedGemmKernel>();
function splitKernel(t: DirectTile): PaddedGemmKernel {
  let k = splitKernels.get(t);
  if (!k) splitKernels.set(t, (k = directKernel({ ...t, splitK: true })));
  return k;
}

function batchMatMul(args: KernelArgs): TensorInfo {
  const { a, b } = args.inputs, ta = !!args.attrs.transposeA, tb = !!args.attrs.transposeB;
  const g = state.precision !== "f32" && a.dtype === "float32" && b.dtype === "float32" ? gemmShape(a.shape, b.shape, ta, tb) : null;
  const k = g ? kernelFor(g.shape) : null;
  if (!g || !k) { state.fallbacks++; return state.original!(args); }
  state.calls++;
  return paddedMatMul(args.backend, a, b, g.shape, g.outShape, k, { weights: packedWeightCache(args.backend) });
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
  // classes the previous products needed are tuned here, between steps (tuning needs awaits a kernel cannot make)
  if (ok) await tuneTensorCores();
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
