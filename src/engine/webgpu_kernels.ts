// Kernels verl-ts registers behind tfjs's WebGPU backend (issue 23), so model code keeps
// calling tf.matMul. Today one: BatchMatMul on the tensor cores (webgpu_gemm.ts) when the
// adapter has subgroup matrices and f16 and 16-bit matrix products were asked for
// (setMatmulPrecision, driven by verl's fsdp_config.mixed_precision.param_dtype). Anything
// else (float32 asked, a shape the kernel does not take, another backend) goes to tfjs's own
// kernel, which stays the reference and the fallback.
import * as tf from "@tensorflow/tfjs";
import {
  DEFAULT_TILE, GemmProgram, PackF16Program, fitTile, operandFormat, type GemmShape, type GemmTile, type Rounding,
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
  precision: MatmulPrecision; installed: boolean; original?: KernelFunc; tile: GemmTile;
  /** pack the operands to f16 first when both output extents reach this (0: always, Infinity: never) */
  packMin: number; calls: number; fallbacks: number;
} = { precision: "f32", installed: false, tile: DEFAULT_TILE, packMin: 256, calls: 0, fallbacks: 0 };

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
export function setMatmulPrecision(p: MatmulPrecision, opts: { tile?: GemmTile; packMin?: number } = {}): boolean {
  state.precision = p;
  if (opts.tile) state.tile = opts.tile;
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

/** Runs one product on the tensor cores (also used by the benchmark with a chosen tile and format). */
export function tensorCoreMatMul(backend: Backend, a: TensorInfo, b: TensorInfo, s: GemmShape, outShape: number[],
  opts: { tile?: GemmTile; packed?: boolean; rounding?: Rounding; strictUniformity?: boolean } = {}): TensorInfo {
  const rounding = opts.rounding ?? (state.precision === "bf16" ? "bf16" : "f16");
  const packed = opts.packed ?? (s.m >= state.packMin && s.n >= state.packMin);
  const fa = operandFormat(s, "a", packed), fb = operandFormat(s, "b", packed);
  const pa = fa.packed ? pack(backend, a, rounding) : a, pb = fb.packed ? pack(backend, b, rounding) : b;
  const prog = new GemmProgram(s, fitTile(opts.tile ?? state.tile, s), fa, fb, rounding, !opts.strictUniformity);
  const out = backend.runWebGPUProgram(prog, [pa, pb], "float32", prog.uniformValues());
  if (pa !== a) backend.disposeData(pa.dataId);
  if (pb !== b) backend.disposeData(pb.dataId);
  if (outShape.length === 3 && outShape.every((d, i) => d === out.shape[i])) return out;
  return { dataId: out.dataId, shape: outShape, dtype: "float32" };
}

function batchMatMul(args: KernelArgs): TensorInfo {
  const { a, b } = args.inputs, ta = !!args.attrs.transposeA, tb = !!args.attrs.transposeB;
  const g = state.precision !== "f32" && a.dtype === "float32" && b.dtype === "float32" ? gemmShape(a.shape, b.shape, ta, tb) : null;
  if (!g) { state.fallbacks++; return state.original!(args); }
  state.calls++;
  return tensorCoreMatMul(args.backend, a, b, g.shape, g.outShape);
}
