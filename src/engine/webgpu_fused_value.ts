// The critic's clipped value loss per token in one dispatch each way (issue 23, as the actor's PPO
// loss in webgpu_fused_ppo.ts). value_loss.ts builds clip(v, V - c, V + c), two squared errors and
// their maximum from about ten tfjs ops, each a dispatch forward and one to three backward, plus
// vf_clipfrac's comparison, cast and masked mean. Here max((v - R)^2, (clip(v) - R)^2) is one
// element-wise kernel, its gradient in v another, vf_clipfrac one masked-mean reduction. The tie
// rules are tfjs's (maximum sends ties to its first operand, minimum to its first; square's
// gradient is dy (x 2)), so the gradient is zero exactly where the composite's is.
import * as tf from "@tensorflow/tfjs";
import { FusedProgram, asScalar, elementwiseMain, int, registerWebGPUKernels, run, type Kernel } from "./webgpu_fused.js";
import type { UniformValue } from "../rollout/webgpu_programs.js";
import { WG, maskedReduceWgsl } from "./webgpu_fused_masked.js";

const sizeOf = tf.util.sizeFromShape;

/** The composite's intermediate values for one token (v, R, V read through f32(): a cast input may hold int32 data). */
const TERMS = `
        let lo = vv - uniforms.c;
        let hi = vv + uniforms.c;
        let up = max(v, lo);
        let vc = min(up, hi);
        let d1 = v - r;
        let d2 = vc - r;
        let l1 = d1 * d1;
        let l2 = d2 * d2;`;

/** max(l1, l2) per token (forward), or its gradient in v given g (backward). */
class ValueTokenProgram extends FusedProgram {
  variableNames: string[];
  uniforms = "total : i32, c : f32,";
  constructor(shape: number[], private readonly backward: boolean) {
    super(shape, `verlValueToken_${backward ? "grad" : "fwd"}`, WG, Math.ceil(sizeOf(shape) / WG));
    this.variableNames = [...(backward ? ["g0"] : []), "v0", "r0", "vv0"];
  }
  getUserCode(): string {
    const body = this.backward ? `
          let g1 = select(0.0, g, l1 >= l2);
          let g2 = select(0.0, g, l1 < l2);
          // through min(up, hi) (ties to up), then max(v, lo) (ties to v)
          let gc = select(0.0, g2 * (d2 * 2.0), up <= hi && v >= lo);
          result[index] = g1 * (d1 * 2.0) + gc;` : `
          result[index] = max(l1, l2);`;
    return elementwiseMain({ v: "v0", r: "r0", vv: "vv0", ...(this.backward ? { g: "g0" } : {}) }, TERMS + body);
  }
}

/** vf_clipfrac: the masked mean of [l2 > l1]. */
class ValueClipfracProgram extends FusedProgram {
  variableNames = ["v0", "r0", "vv0", "m"];
  uniforms = "total : i32, c : f32,";
  constructor() { super([1], "verlValueClipfrac", WG, 1); }
  getUserCode(): string {
    return maskedReduceWgsl(`
            let v = f32(v0[i]);
            let r = f32(r0[i]);
            let vv = f32(vv0[i]);${TERMS}`, "select(0.0, 1.0, l2 > l1)", true);
  }
}

const uniformsOf = (shape: number[], c: number): UniformValue[] => [int(sizeOf(shape)), { type: "float32", data: [c] }];

const KERNELS: Record<string, Kernel> = {
  VerlValueToken: ({ inputs: { v, r, vv }, backend, attrs }) =>
    backend.runWebGPUProgram(new ValueTokenProgram(v!.shape, false), [v!, r!, vv!], "float32", uniformsOf(v!.shape, attrs.c as number)),
  VerlValueTokenGrad: ({ inputs: { g, v, r, vv }, backend, attrs }) =>
    backend.runWebGPUProgram(new ValueTokenProgram(v!.shape, true), [g!, v!, r!, vv!], "float32", uniformsOf(v!.shape, attrs.c as number)),
  VerlValueClipfrac: ({ inputs: { v, r, vv, m }, backend, attrs }) =>
    asScalar(backend.runWebGPUProgram(new ValueClipfracProgram(), [v!, r!, vv!, m!], "float32", uniformsOf(v!.shape, attrs.c as number))),
};

let registered = false;
function ensureRegistered(): void {
  if (!registered) registerWebGPUKernels(KERNELS);
  registered = true;
}

/**
 * max((v - R)^2, (clip(v, V - c, V + c) - R)^2) per token, differentiable in `vpreds` only (the
 * returns and the rollout's values are constants): one dispatch forward, one backward. Callers
 * check fusedLossFor (webgpu_fused_ppo.ts) first.
 */
export function fusedValueTokenLosses(vpreds: tf.Tensor, returns: tf.Tensor, values: tf.Tensor, c: number): tf.Tensor {
  ensureRegistered();
  const op = tf.customGrad((...args: (tf.Tensor | tf.GradSaveFunc)[]) => {
    const [v, save] = args as [tf.Tensor, tf.GradSaveFunc];
    save([v, returns, values]);
    return {
      value: run("VerlValueToken", { v, r: returns, vv: values }, { c }),
      gradFunc: (dy: tf.Tensor | tf.Tensor[], saved: tf.Tensor[]) => [run("VerlValueTokenGrad", { g: dy as tf.Tensor, v: saved[0]!, r: saved[1]!, vv: saved[2]! }, { c })],
    };
  });
  return op(vpreds);
}

/** vf_clipfrac as a scalar over `mask` (float32, vpreds' shape): one dispatch, no gradient. */
export function fusedValueClipfrac(vpreds: tf.Tensor, returns: tf.Tensor, values: tf.Tensor, mask: tf.Tensor, c: number): tf.Scalar {
  ensureRegistered();
  return run("VerlValueClipfrac", { v: vpreds, r: returns, vv: values, m: mask }, { c }) as tf.Scalar;
}
