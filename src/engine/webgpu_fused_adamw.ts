// Fused WGSL kernels for the optimizer step on WebGPU (issue 23). The composite AdamW update
// (optim/adamw.ts) runs about a dozen element-wise tfjs ops over the flat parameter vector, each a
// new full-size buffer (1.43 GB at the 0.5B shape), and the one-rank step's gradient norm squares
// the whole gradient into another. Here one kernel runs three programs (new first moment, new
// second moment, new parameters) and the norm is a two-pass sum of squares: per-workgroup partial
// sums in a fixed order, then one workgroup over the partials (no atomics: the same bits every
// time). Registered by name on the "webgpu" backend; the switch is webgpu_fused.ts's.
import * as tf from "@tensorflow/tfjs";
import { FusedProgram, int, registerWebGPUKernels, run, type Kernel, type TensorInfo } from "./webgpu_fused.js";
import type { UniformValue } from "../rollout/webgpu_programs.js";

const f32 = (x: number): UniformValue => ({ type: "float32", data: [x] });
const WG = 256;

/** The scaled gradient, as the composite forms it: (raw * gradScale) * clip. */
const GRAD = "(g[index] * uniforms.gradScale) * clip";

/** Whether the step applies: always with the norm on the host; with it on the device, unless it is not finite. */
const applyStep = (deviceClip: boolean) =>
  deviceClip ? "let apply = (bitcast<u32>(norm[0]) & 0x7f800000u) != 0x7f800000u;" : "let apply = true;";

/**
 * The clip factor and whether the step applies. With the norm on the host, both come as uniforms
 * (clip, and a step that is skipped is not recorded). With the norm on the device (`deviceClip`:
 * the norm tensor bound as `norm`, `maxNorm` the clip threshold, 0 for none), each thread derives
 * them from it, so the step is recorded before the norm is read back: clip = maxNorm / (norm +
 * 1e-6) where that is below 1, as the host computes it (in f32 here, f64 there: at most an ulp
 * apart), and a non-finite norm (its exponent bits all ones) leaves moments and parameters as they were.
 */
function clipAndApply(deviceClip: boolean): string {
  if (!deviceClip) return "let clip = uniforms.clip; let apply = true;";
  return `${applyStep(true)}
          let clip = select(1.0, min(1.0, uniforms.maxNorm / (norm[0] + 1e-6)), uniforms.maxNorm > 0.0);`;
}


/** One element-wise program over `total` values: `body` assigns result[index]. */
class ElementWise extends FusedProgram {
  constructor(total: number, key: string, public variableNames: string[], public uniforms: string, private readonly body: string) {
    super([total], key, WG, Math.ceil(total / WG));
  }
  getUserCode(): string {
    return `
      fn main(index : i32) {
        if (index < uniforms.total) {
          ${this.body}
        }
      }`;
  }
}

const SCALE = (deviceClip: boolean) => `total : i32, gradScale : f32, ${deviceClip ? "maxNorm" : "clip"} : f32,`;
const suffix = (deviceClip: boolean) => (deviceClip ? "DeviceClip" : "");
const inputs = (names: string[], deviceClip: boolean) => (deviceClip ? [...names, "norm"] : names);
// the composite's order: m b1 + g (1 - b1); v b2 + g^2 (1 - b2); p decay - (m / (sqrt(v) / sqrt(bc2) + eps)) stepSize
const moment1 = (n: number, dc: boolean) => new ElementWise(n, `verlAdamWMoment1${suffix(dc)}`, inputs(["m", "g"], dc), `${SCALE(dc)} b : f32, oneMinusB : f32,`,
  `${clipAndApply(dc)}
          let gi = ${GRAD};
          result[index] = select(m[index], m[index] * uniforms.b + gi * uniforms.oneMinusB, apply);`);
const moment2 = (n: number, dc: boolean) => new ElementWise(n, `verlAdamWMoment2${suffix(dc)}`, inputs(["v", "g"], dc), `${SCALE(dc)} b : f32, oneMinusB : f32,`,
  `${clipAndApply(dc)}
          let gi = ${GRAD};
          result[index] = select(v[index], v[index] * uniforms.b + (gi * gi) * uniforms.oneMinusB, apply);`);
const params = (n: number, dc: boolean) => new ElementWise(n, `verlAdamWParams${suffix(dc)}`, inputs(["p", "m", "v"], dc), "total : i32, decay : f32, sqrtBc2 : f32, eps : f32, stepSize : f32,",
  `let denom = sqrt(v[index]) / uniforms.sqrtBc2 + uniforms.eps;
          ${applyStep(dc)}
          result[index] = select(p[index], p[index] * uniforms.decay - (m[index] / denom) * uniforms.stepSize, apply);`);

/** Values a workgroup of the norm's first pass sums (16 per thread, strided). */
const NORM_CHUNK = 16 * WG;

/**
 * A tree sum over workgroup memory `acc` of what each thread accumulated in `a`; thread 0 writes
 * `out` (a WGSL expression of s, the sum) to result[group].
 */
const treeSum = (out: string) => `
        acc[tid] = a;
        workgroupBarrier();
        for (var s = ${WG / 2}; s > 0; s = s >> 1u) {
          if (tid < s) { acc[tid] = acc[tid] + acc[tid + s]; }
          workgroupBarrier();
        }
        if (tid == 0) { let s = acc[0]; result[group] = ${out}; }`;

/** Pass 1: partial[w] = sum of (x gradScale)^2 over [w NORM_CHUNK, (w + 1) NORM_CHUNK), in a fixed order. */
class SumSquaresPartial extends FusedProgram {
  variableNames = ["g"];
  uniforms = "total : i32, gradScale : f32,";
  constructor(groups: number) { super([groups], "verlSumSquaresPartial", WG, groups); }
  getUserCode(): string {
    return `
      var<workgroup> acc : array<f32, ${WG}>;
      fn main(index : i32) {
        let group = index / ${WG};
        let tid = i32(localIndex);
        var a = 0.0;
        for (var k = 0; k < ${NORM_CHUNK / WG}; k = k + 1) {
          let i = group * ${NORM_CHUNK} + k * ${WG} + tid;
          if (i < uniforms.total) { let x = g[i] * uniforms.gradScale; a = a + x * x; }
        }${treeSum("s")}
      }`;
  }
}

/** Pass 2: one workgroup sums the partials (strided, then a tree) and writes the square root (`root`) or the sum. */
class SqrtSum extends FusedProgram {
  variableNames = ["p"];
  uniforms = "total : i32,";
  constructor(private readonly root = true) { super([1], root ? "verlSqrtSum" : "verlSumOfPartials", WG, 1); }
  getUserCode(): string {
    return `
      var<workgroup> acc : array<f32, ${WG}>;
      fn main(index : i32) {
        let group = 0;
        let tid = i32(localIndex);
        var a = 0.0;
        for (var i = tid; i < uniforms.total; i = i + ${WG}) { a = a + p[i]; }${treeSum(this.root ? "sqrt(s)" : "s")}
      }`;
  }
}

const KERNELS: Record<string, Kernel> = {
  // three outputs: [m', v', p'] (tfjs kernels may return several)
  VerlAdamW: (({ inputs: { p, m, v, g, norm }, backend, attrs: a }: Parameters<Kernel>[0]) => {
    const n = p!.shape[0]!, num = (k: string) => a[k] as number, dc = norm !== undefined;
    const scale = [int(n), f32(num("gradScale")), f32(dc ? num("maxNorm") : num("clip"))];
    const m2 = backend.runWebGPUProgram(moment1(n, dc), dc ? [m!, g!, norm] : [m!, g!], "float32", [...scale, f32(num("beta1")), f32(1 - num("beta1"))]);
    const v2 = backend.runWebGPUProgram(moment2(n, dc), dc ? [v!, g!, norm] : [v!, g!], "float32", [...scale, f32(num("beta2")), f32(1 - num("beta2"))]);
    const p2 = backend.runWebGPUProgram(params(n, dc), dc ? [p!, m2, v2, norm] : [p!, m2, v2], "float32",
      [int(n), f32(num("decay")), f32(num("sqrtBc2")), f32(num("eps")), f32(num("stepSize"))]);
    return [m2, v2, p2];
  }) as unknown as Kernel,
  VerlGradNorm: ({ inputs: { g }, backend, attrs }) => {
    const n = g!.shape[0]!, groups = Math.ceil(n / NORM_CHUNK);
    const part = backend.runWebGPUProgram(new SumSquaresPartial(groups), [g!], "float32", [int(n), f32(attrs.gradScale as number)]);
    const out = backend.runWebGPUProgram(new SqrtSum(attrs.root !== false), [part], "float32", [int(groups)]);
    backend.disposeData(part.dataId);
    return out;
  },
};

let registered = false;
function ensureRegistered(): void {
  if (!registered) registerWebGPUKernels(KERNELS);
  registered = true;
}

export interface AdamWScalars {
  beta1: number; beta2: number; eps: number;
  /** lr / (1 - beta1^t). */
  stepSize: number;
  /** sqrt(1 - beta2^t). */
  sqrtBc2: number;
  /** 1 - lr weightDecay. */
  decay: number;
  /** The gradient used is (g gradScale) clip. */
  gradScale: number;
  clip: number;
}

/**
 * The clip decided on the device: `norm` ([1], ||g gradScale||) gives clip = maxNorm / (norm + 1e-6)
 * where below 1 (maxNorm 0: no clip), and a non-finite norm makes the step leave everything unchanged.
 */
export interface DeviceClip { norm: tf.Tensor1D; maxNorm: number }

/**
 * [m', v', p'] of one AdamW step over flat float32 vectors: three dispatches, three new buffers.
 * With `deviceClip`, s.clip is ignored: the clip and the skip come from the norm on the device.
 */
export function fusedAdamW(p: tf.Tensor1D, m: tf.Tensor1D, v: tf.Tensor1D, g: tf.Tensor1D, s: AdamWScalars, deviceClip?: DeviceClip): [tf.Tensor1D, tf.Tensor1D, tf.Tensor1D] {
  ensureRegistered();
  const inputs: tf.NamedTensorMap = deviceClip ? { p, m, v, g, norm: deviceClip.norm } : { p, m, v, g };
  const maxNorm = deviceClip ? deviceClip.maxNorm : 0;
  if (!(maxNorm >= 0)) throw new Error(`fusedAdamW: maxNorm must be >= 0 (0: no clip), got ${maxNorm}`);
  return tf.engine().runKernel("VerlAdamW", inputs, { ...s, maxNorm }) as unknown as [tf.Tensor1D, tf.Tensor1D, tf.Tensor1D];
}

/** ||g gradScale||_2 as a [1] tensor: two dispatches, a partial-sum buffer of n / 4096 values. */
export function fusedGradNorm(g: tf.Tensor1D, gradScale = 1): tf.Tensor1D {
  ensureRegistered();
  return run("VerlGradNorm", { g }, { gradScale }) as tf.Tensor1D;
}

/** The sum of squares of (g gradScale), fusedGradNorm's before its square root: [1], the same two passes. */
export function fusedSumSquares(g: tf.Tensor1D, gradScale = 1): tf.Tensor1D {
  ensureRegistered();
  return run("VerlGradNorm", { g }, { gradScale, root: false }) as tf.Tensor1D;
}
