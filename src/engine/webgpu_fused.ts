// Fused WGSL kernels for RMSNorm, SwiGLU and GeGLU (issue 23). On WebGPU the actor update is
// host-bound on tfjs's dispatches (~75 us each on the H200); the composites in models/layers.ts
// take 5-15 dispatches per call, these one to three. They are tfjs kernels registered by name on
// the "webgpu" backend and run through tf.engine().runKernel, so layers.ts keeps its customGrad
// structure and the model files their math. Float32 throughout; every reduction runs in a fixed
// order (no atomics), so the same inputs give the same bits.
import * as tf from "@tensorflow/tfjs";
import { grid, type GpuProgram, type UniformValue } from "../rollout/webgpu_programs.js";

export interface TensorInfo { dataId: object; shape: number[]; dtype: string }
export interface Backend {
  runWebGPUProgram(p: GpuProgram, inputs: TensorInfo[], dtype: string, uniforms?: UniformValue[]): TensorInfo;
  disposeData(id: object): boolean;
}
export type Kernel = (args: { inputs: Record<string, TensorInfo>; backend: Backend; attrs: Record<string, unknown> }) => TensorInfo;

/** A WGSL f32 literal. */
const lit = (x: number): string => (Number.isInteger(x) ? x.toFixed(1) : x.toExponential(9));
export const rowsOf = (shape: number[]) => shape.slice(0, -1).reduce((a, b) => a * b, 1);

/** Threads of a row's workgroup: a power of two up to 256, no wider than the row needs. */
function rowThreads(D: number): number {
  let t = 32;
  while (t < 256 && t < D) t *= 2;
  return t;
}

/**
 * The reduction phase of a row kernel: each thread accumulates `sums` (WGSL terms of v = x[i],
 * i = row * D + d) over its columns of row `row` (when `live`), then tree sums them in
 * workgroup arrays of the same names; every thread reads name[0] after it.
 */
function rowSums(wg: number, D: number, sums: Record<string, string>): string {
  const names = Object.keys(sums);
  return `
        ${names.map((n) => `var ${n}Acc = 0.0;`).join(" ")}
        if (live) {
          for (var d = tid; d < ${D}; d = d + ${wg}) {
            let i = row * ${D} + d;
            let v = x[i];
            ${names.map((n) => `${n}Acc = ${n}Acc + ${sums[n]};`).join(" ")}
          }
        }
        ${names.map((n) => `${n}[tid] = ${n}Acc;`).join(" ")}
        workgroupBarrier();
        for (var s = ${wg / 2}; s > 0; s = s >> 1u) {
          if (tid < s) { ${names.map((n) => `${n}[tid] = ${n}[tid] + ${n}[tid + s];`).join(" ")} }
          workgroupBarrier();
        }`;
}

/** What the programs share: a flat dispatch layout of `groups` workgroups of `wg` threads. */
export abstract class FusedProgram implements GpuProgram {
  abstract variableNames: string[];
  abstract uniforms: string;
  dispatchLayout = { x: [0] };
  workgroupSize: [number, number, number];
  dispatch: [number, number, number];
  constructor(public outputShape: number[], public shaderKey: string, wg: number, groups: number) {
    this.workgroupSize = [wg, 1, 1];
    this.dispatch = grid(groups);
  }
  abstract getUserCode(): string;
}

/** rsqrt(mean(x^2) + eps) from the row's sum of squares `ss`. */
const invRms = (D: number, eps: number) => `inverseSqrt(ss[0] / ${lit(D)} + ${lit(eps)})`;

/** y = (x * rsqrt(mean(x^2) + eps)) * w, one workgroup a row of D. */
class RmsNormForward extends FusedProgram {
  variableNames = ["x", "w"];
  uniforms = "nRows : i32,";
  constructor(outputShape: number[], private readonly D: number, private readonly eps: number) {
    super(outputShape, `verlFusedRmsNorm_${D}_${eps}`, rowThreads(D), rowsOf(outputShape));
  }
  getUserCode(): string {
    const D = this.D, wg = this.workgroupSize[0];
    return `
      var<workgroup> ss : array<f32, ${wg}>;
      fn main(index : i32) {
        let row = index / ${wg};
        let tid = i32(localIndex);
        let live = row < uniforms.nRows;${rowSums(wg, D, { ss: "v * v" })}
        let r = ${invRms(D, this.eps)};
        if (live) {
          for (var d = tid; d < ${D}; d = d + ${wg}) { result[row * ${D} + d] = x[row * ${D} + d] * r * w[d]; }
        }
      }`;
  }
}

/** dx = r (g - x r^2 mean(g x)) with g = dy w, one workgroup a row (r recomputed). */
class RmsNormGradX extends FusedProgram {
  variableNames = ["dy", "x", "w"];
  uniforms = "nRows : i32,";
  constructor(outputShape: number[], private readonly D: number, private readonly eps: number) {
    super(outputShape, `verlFusedRmsNormGradX_${D}_${eps}`, rowThreads(D), rowsOf(outputShape));
  }
  getUserCode(): string {
    const D = this.D, wg = this.workgroupSize[0];
    return `
      var<workgroup> ss : array<f32, ${wg}>;
      var<workgroup> gx : array<f32, ${wg}>;
      fn main(index : i32) {
        let row = index / ${wg};
        let tid = i32(localIndex);
        let live = row < uniforms.nRows;${rowSums(wg, D, { ss: "v * v", gx: "dy[i] * w[d] * v" })}
        let r = ${invRms(D, this.eps)};
        let c = r * r * (gx[0] / ${lit(D)});
        if (live) {
          for (var d = tid; d < ${D}; d = d + ${wg}) {
            let i = row * ${D} + d;
            result[i] = r * (dy[i] * w[d] - x[i] * c);
          }
        }
      }`;
  }
}

/** Rows a dw chunk holds at most (workgroup memory for their r). */
const DW_CHUNK_MAX = 64;

/**
 * dw's first pass: chunk c of `rows` rows (uniform) gives partial[c, d] = sum over its rows of
 * dy x r, in row order. Each row's r is recomputed by a tree sum and kept in workgroup memory.
 */
class RmsNormGradWPartial extends FusedProgram {
  variableNames = ["dy", "x"];
  uniforms = "nRows : i32, rows : i32,";
  constructor(chunks: number, private readonly D: number, private readonly eps: number) {
    super([chunks, D], `verlFusedRmsNormGradWPartial_${D}_${eps}`, rowThreads(D), chunks);
  }
  getUserCode(): string {
    const D = this.D, wg = this.workgroupSize[0];
    return `
      var<workgroup> ss : array<f32, ${wg}>;
      var<workgroup> rs : array<f32, ${DW_CHUNK_MAX}>;
      fn main(index : i32) {
        let chunk = index / ${wg};
        let tid = i32(localIndex);
        let row0 = chunk * uniforms.rows;
        let n = clamp(uniforms.nRows - row0, 0, uniforms.rows);
        for (var j = 0; j < uniforms.rows; j = j + 1) {
          let row = row0 + j;
          let live = j < n;${rowSums(wg, D, { ss: "v * v" })}
          if (tid == 0) { rs[j] = ${invRms(D, this.eps)}; }
          workgroupBarrier();
        }
        if (n > 0) {
          for (var d = tid; d < ${D}; d = d + ${wg}) {
            var acc = 0.0;
            for (var j = 0; j < n; j = j + 1) {
              let i = (row0 + j) * ${D} + d;
              acc = acc + dy[i] * x[i] * rs[j];
            }
            result[chunk * ${D} + d] = acc;
          }
        }
      }`;
  }
}

/** dw's second pass: result[d] = sum over chunks of partial[c, d], in chunk order. */
class ColumnSum extends FusedProgram {
  variableNames = ["p"];
  uniforms = "nChunks : i32,";
  constructor(private readonly D: number) {
    super([D], `verlFusedColumnSum_${D}`, 64, Math.ceil(D / 64));
  }
  getUserCode(): string {
    const D = this.D;
    return `
      fn main(index : i32) {
        if (index < ${D}) {
          var acc = 0.0;
          for (var c = 0; c < uniforms.nChunks; c = c + 1) { acc = acc + p[c * ${D} + index]; }
          result[index] = acc;
        }
      }`;
  }
}

/** sqrt(2/pi) and the cubic term of gelu_pytorch_tanh (as layers.ts). */
const GELU_BETA = Math.sqrt(2 / Math.PI), GELU_KAPPA = 0.044715;

/** The gate's activation and, for the backward pass, its derivative, in WGSL (g: the gate value). */
const ACT = {
  // tfjs's sigmoid and tanh kernels' formulas, so the fused values track the composite's
  silu: {
    value: "let s = 1.0 / (1.0 + exp(-1.0 * g));\n          let act = g * s;",
    grad: "let dAct = s * (1.0 + g * (1.0 - s));",
  },
  gelu: {
    value: `let z = ${lit(GELU_BETA)} * (g + ${lit(GELU_KAPPA)} * (g * (g * g)));
          let e2z = exp(-2.0 * abs(z));
          let t = sign(z) * (1.0 - e2z) / (1.0 + e2z);
          let act = (0.5 * g) * (1.0 + t);`,
    grad: `let dAct = 0.5 * (1.0 + t) + ((0.5 * g) * (1.0 - t * t)) * (${lit(GELU_BETA)} * (1.0 + ${lit(3 * GELU_KAPPA)} * (g * g)));`,
  },
} as const;
export type GatedActivation = keyof typeof ACT;

/**
 * Forward: act(gate) * up on rows [gate (F) | up (F)]. Backward: d[gate | up] = [dy up act'(gate) |
 * dy act(gate)]. One invocation a (row, column of F); backward writes both halves.
 */
class GluProgram extends FusedProgram {
  variableNames: string[];
  uniforms = "total : i32,";
  constructor(outputShape: number[], private readonly F: number, private readonly act: GatedActivation, private readonly backward: boolean) {
    super(outputShape, `verlFusedGlu_${act}_${F}_${backward ? "grad" : "fwd"}`, 256, Math.ceil((rowsOf(outputShape) * F) / 256));
    this.variableNames = backward ? ["dy", "gu"] : ["gu"];
  }
  getUserCode(): string {
    const F = this.F, a = ACT[this.act];
    const body = this.backward ? `
          let d = dy[index];
          ${a.grad}
          result[i] = (d * u) * dAct;
          result[i + ${F}] = d * act;` : `
          result[index] = act * u;`;
    return `
      fn main(index : i32) {
        if (index < uniforms.total) {
          let n = index / ${F};
          let i = n * ${2 * F} + index - n * ${F};
          let g = gu[i];
          let u = gu[i + ${F}];
          ${a.value}${body}
        }
      }`;
  }
}

export const int = (x: number): UniformValue => ({ type: "int32", data: [x] });

/**
 * The WGSL main of an element-wise program over uniforms.total elements: each name of `reads` is
 * bound to f32(<buffer>[index]) (read through f32(): tfjs's int32-to-float32 cast keeps the int32
 * data, so a float32 input may be bound as array<i32>), then `body` runs.
 */
export const elementwiseMain = (reads: Record<string, string>, body: string): string => `
      fn main(index : i32) {
        if (index < uniforms.total) {${Object.entries(reads).map(([name, buf]) => `
          let ${name} = f32(${buf}[index]);`).join("")}${body}
        }
      }`;

/** A program's [1] output handed back as the scalar it stands for. */
export const asScalar = (out: TensorInfo): TensorInfo => ({ dataId: out.dataId, shape: [], dtype: "float32" });

/** Rows per dw chunk: about 256 chunks, at most DW_CHUNK_MAX rows each (fixed by N, so the sum order is too). */
export function dwChunkRows(N: number): number {
  return Math.min(DW_CHUNK_MAX, Math.max(1, Math.ceil(N / 256)));
}

const KERNELS: Record<string, Kernel> = {
  VerlRmsNorm: ({ inputs: { x, w }, backend, attrs }) => {
    const D = x.shape.at(-1)!;
    return backend.runWebGPUProgram(new RmsNormForward(x.shape, D, attrs.eps as number), [x, w!], "float32", [int(rowsOf(x.shape))]);
  },
  VerlRmsNormGradX: ({ inputs: { dy, x, w }, backend, attrs }) => {
    const D = x!.shape.at(-1)!;
    return backend.runWebGPUProgram(new RmsNormGradX(x!.shape, D, attrs.eps as number), [dy!, x!, w!], "float32", [int(rowsOf(x!.shape))]);
  },
  VerlRmsNormGradW: ({ inputs: { dy, x }, backend, attrs }) => {
    const D = x!.shape.at(-1)!, N = rowsOf(x!.shape), rows = dwChunkRows(N), chunks = Math.ceil(N / rows);
    const part = backend.runWebGPUProgram(new RmsNormGradWPartial(chunks, D, attrs.eps as number), [dy!, x!], "float32", [int(N), int(rows)]);
    if (chunks === 1) return { dataId: part.dataId, shape: [D], dtype: "float32" };
    const out = backend.runWebGPUProgram(new ColumnSum(D), [part], "float32", [int(chunks)]);
    backend.disposeData(part.dataId);
    return out;
  },
  VerlGlu: ({ inputs: { gu }, backend, attrs }) => {
    const F = gu!.shape.at(-1)! / 2, shape = [...gu!.shape.slice(0, -1), F];
    return backend.runWebGPUProgram(new GluProgram(shape, F, attrs.act as GatedActivation, false), [gu!], "float32", [int(rowsOf(shape) * F)]);
  },
  VerlGluGrad: ({ inputs: { dy, gu }, backend, attrs }) => {
    const F = gu!.shape.at(-1)! / 2;
    return backend.runWebGPUProgram(new GluProgram(gu!.shape, F, attrs.act as GatedActivation, true), [dy!, gu!], "float32", [int(rowsOf(gu!.shape) * F)]);
  },
};

let registered = false;
// On by default since their tests passed on an NVIDIA H100 (2026-12-05: values and gradients of the
// norm, GLU, attention and RoPE kernels against the composites, same bits twice); VERL_WEBGPU_FUSED=0
// starts with the composites (llvmpipe has been wrong about workgroup-barrier kernels before).
let enabled = process.env.VERL_WEBGPU_FUSED !== "0";

/** Turns the fused kernels off or on for this thread (the composites run when off; VERL_WEBGPU_FUSED=0 starts off). */
export function setFusedLayers(on: boolean): void { enabled = on; }

/** Whether layers.ts should take the fused path for these float32 inputs: on the webgpu backend, when enabled. */
export function fusedLayersFor(...xs: tf.Tensor[]): boolean {
  if (!enabled || tf.getBackend() !== "webgpu" || xs.some((x) => x.dtype !== "float32" || x.size === 0)) return false;
  if (!registered) {
    registerWebGPUKernels(KERNELS);
    registered = true;
  }
  return true;
}

/** Registers `kernels` by name on the webgpu backend (those not registered yet). */
export function registerWebGPUKernels(kernels: Record<string, Kernel>): void {
  for (const [kernelName, kernelFunc] of Object.entries(kernels)) {
    if (!tf.getKernel(kernelName, "webgpu")) tf.registerKernel({ kernelName, backendName: "webgpu", kernelFunc: kernelFunc as unknown as tf.KernelFunc });
  }
}

/** Runs the kernel registered as `name` through the engine (so it is taped and counted like any tfjs op). */
export const run = (name: string, inputs: Record<string, tf.Tensor>, attrs: Record<string, unknown> = {}): tf.Tensor =>
  tf.engine().runKernel(name, inputs as tf.NamedTensorMap, attrs as tf.NamedAttrMap) as tf.Tensor;

/** (x * rsqrt(mean(x^2) + eps)) * w over the last axis: one dispatch. */
export const fusedRmsNorm = (x: tf.Tensor, w: tf.Tensor, eps: number): tf.Tensor => run("VerlRmsNorm", { x, w }, { eps });

/** RMSNorm's [dx, dw]: dx one dispatch, dw two (one where the rows fit one chunk). */
export function fusedRmsNormGrad(dy: tf.Tensor, x: tf.Tensor, w: tf.Tensor, eps: number): [tf.Tensor, tf.Tensor] {
  return [run("VerlRmsNormGradX", { dy, x, w }, { eps }), run("VerlRmsNormGradW", { dy, x }, { eps })];
}

/** act(gate) * up for gu = [gate | up] on the last axis: one dispatch. */
export const fusedGlu = (gu: tf.Tensor, act: GatedActivation): tf.Tensor => run("VerlGlu", { gu }, { act });

/** The gradient with respect to gu = [gate | up]: one dispatch. */
export const fusedGluGrad = (dy: tf.Tensor, gu: tf.Tensor, act: GatedActivation): tf.Tensor => run("VerlGluGrad", { dy, gu }, { act });
