// Masked full reductions in one dispatch each way (issue 23). The losses and their metrics reduce
// [B, T] matrices under the response mask: Σ v·m (token-mean's numerator) and Σ v·m / (Σ m + 1e-8)
// (clip fractions, ppo_kl, vf_clipfrac). The composites (functional.ts maskedSum/maskedMean) take a
// cast, a where over zeros, a multiply and a sum, plus two more for the mean: 5-8 dispatches each
// forward and about as many backward, ~60 per micro-batch of a PPO update that its host records one
// by one. One workgroup walks the elements in a fixed order and sums in a fixed tree, so the same
// inputs give the same bits; a masked-out element contributes nothing, even NaN, as in the composite.
import * as tf from "@tensorflow/tfjs";
import { FusedProgram, asScalar, fusedLayersFor, int, registerWebGPUKernels, run, type Kernel } from "./webgpu_fused.js";

/** Threads of the one workgroup of a reduction. */
export const WG = 256;
// Inputs are read through f32(): tfjs's cast from int32 to float32 keeps the int32 data (a float32
// mask may be bound as array<i32>), and the pipeline is keyed by the inputs' data types.

const tree = (names: string[]) => `
        workgroupBarrier();
        for (var s = ${WG / 2}; s > 0; s = s >> 1u) {
          if (tid < s) { ${names.map((n) => `${n}[tid] = ${n}[tid] + ${n}[tid + s];`).join(" ")} }
          workgroupBarrier();
        }`;

/**
 * The WGSL of a full masked reduction in one workgroup of WG threads: result[0] = Σ_{m[i] != 0}
 * value·m[i] (over Σ m + 1e-8 for the mean), `body` (statements) computing `value` for element i (names other than w, sumAcc, denAcc).
 * The elements are walked in a fixed order and summed in a fixed tree: the same bits every time.
 */
export function maskedReduceWgsl(body: string, value: string, mean: boolean): string {
  return `
      var<workgroup> acc : array<f32, ${WG}>;
      var<workgroup> den : array<f32, ${WG}>;
      fn main(index : i32) {
        let tid = i32(localIndex);
        var sumAcc = 0.0;
        var denAcc = 0.0;
        for (var i = tid; i < uniforms.total; i = i + ${WG}) {
          let w = f32(m[i]);
          if (w != 0.0) {${body}
            sumAcc = sumAcc + ${value} * w;
          }
          denAcc = denAcc + w;
        }
        acc[tid] = sumAcc;
        den[tid] = denAcc;${tree(["acc", "den"])}
        if (tid == 0) { result[0] = ${mean ? "acc[0] / (den[0] + 1e-8)" : "acc[0]"}; }
      }`;
}

/** Forward: result[0] = Σ_{m != 0} v m, divided by (Σ m + 1e-8) for the mean. */
class MaskedReduce extends FusedProgram {
  variableNames = ["v", "m"];
  uniforms = "total : i32,";
  constructor(private readonly mean: boolean) { super([1], `verlMaskedReduce_${mean ? "mean" : "sum"}`, WG, 1); }
  getUserCode(): string {
    return maskedReduceWgsl("", "f32(v[i])", this.mean);
  }
}

/** Backward: dv[i] = s m[i] where m[i] != 0, else 0; s = dy (sum) or dy / (Σ m + 1e-8) (mean, Σ m summed here first). */
class MaskedReduceGrad extends FusedProgram {
  variableNames = ["dy", "m"];
  uniforms = "total : i32,";
  constructor(n: number, private readonly mean: boolean) { super([n], `verlMaskedReduceGrad_${mean ? "mean" : "sum"}`, WG, 1); }
  getUserCode(): string {
    const scale = this.mean ? `
        var d = 0.0;
        for (var i = tid; i < uniforms.total; i = i + ${WG}) { d = d + f32(m[i]); }
        den[tid] = d;${tree(["den"])}
        let s = f32(dy[0]) / (den[0] + 1e-8);` : `
        let s = f32(dy[0]);`;
    return `
      var<workgroup> den : array<f32, ${WG}>;
      fn main(index : i32) {
        let tid = i32(localIndex);${scale}
        for (var i = tid; i < uniforms.total; i = i + ${WG}) {
          let w = f32(m[i]);
          result[i] = select(0.0, s * w, w != 0.0);
        }
      }`;
  }
}

const KERNELS: Record<string, Kernel> = {
  VerlMaskedReduce: ({ inputs: { v, m }, backend, attrs }) =>
    asScalar(backend.runWebGPUProgram(new MaskedReduce(attrs.mean as boolean), [v!, m!], "float32", [int(tf.util.sizeFromShape(v!.shape))])),
  VerlMaskedReduceGrad: ({ inputs: { dy, m }, backend, attrs }) => {
    const n = tf.util.sizeFromShape(m!.shape);
    const out = backend.runWebGPUProgram(new MaskedReduceGrad(n, attrs.mean as boolean), [dy!, m!], "float32", [int(n)]);
    return { dataId: out.dataId, shape: m!.shape, dtype: "float32" };
  },
};

let registered = false;

/**
 * Whether a full masked reduction of `values` under `mask` takes the fused kernels: the fused
 * switch is on (webgpu_fused.ts), both are float32 of the same shape, and
 * VERL_WEBGPU_FUSED_MASKED is not 0.
 */
export function fusedMaskedFor(values: tf.Tensor, mask: tf.Tensor): boolean {
  if (process.env.VERL_WEBGPU_FUSED_MASKED === "0") return false;
  if (!tf.util.arraysEqual(values.shape, mask.shape) || !fusedLayersFor(values, mask)) return false;
  if (!registered) {
    registerWebGPUKernels(KERNELS);
    registered = true;
  }
  return true;
}

/**
 * Σ_{mask != 0} values·mask (mean: divided by Σ mask + 1e-8) as a scalar, differentiable in
 * `values` (the mask is a constant): one dispatch forward, one backward.
 */
export function fusedMaskedReduce(values: tf.Tensor, mask: tf.Tensor, mean: boolean): tf.Scalar {
  const op = tf.customGrad((...args: (tf.Tensor | tf.GradSaveFunc)[]) => {
    const [v, save] = args as [tf.Tensor, tf.GradSaveFunc];
    save([mask]);
    return {
      value: run("VerlMaskedReduce", { v, m: mask }, { mean }) as tf.Scalar,
      gradFunc: (dy: tf.Tensor | tf.Tensor[], saved: tf.Tensor[]) => [run("VerlMaskedReduceGrad", { dy: dy as tf.Tensor, m: saved[0]! }, { mean })],
    };
  });
  return op(values) as tf.Scalar;
}
