// PPO's clipped objective per token in one dispatch each way (issue 23). The vanilla loss
// (policy_loss.ts) builds ratio = exp(clip(logp - old, -20, 20)), the two clipped products, the
// dual clip and the select from about twenty tfjs ops, each a dispatch forward and one to three
// backward; at the 0.5B shape that is ~4% of an update's dispatches, and most of a small model's.
// Here the per-token loss is one element-wise kernel, its gradient with respect to logp another,
// and each metric (clip fraction, ppo_kl, lower clip fraction) one masked-mean reduction. The
// formulas and the gradient's tie rules are tfjs's own (clipByValue passes the bounds, maximum
// sends ties to its first operand, minimum to its first), so the values match the composite's.
import * as tf from "@tensorflow/tfjs";
import { FusedProgram, asScalar, elementwiseMain, fusedLayersFor, int, registerWebGPUKernels, run, type Kernel } from "./webgpu_fused.js";
import type { UniformValue } from "../rollout/webgpu_programs.js";
import { WG, maskedReduceWgsl } from "./webgpu_fused_masked.js";

const f32 = (x: number): UniformValue => ({ type: "float32", data: [x] });
const sizeOf = tf.util.sizeFromShape;

/** The clip bounds: ratio in [1 - low, 1 + high], the dual clip c. */
export interface PpoClip { low: number; high: number; clipC: number }

/** WGSL shared by the programs: the composite's intermediate values for one token. */
const TERMS = `
        let d = lp - ol;
        let negKl = clamp(d, -20.0, 20.0);
        let ratio = exp(negKl);
        let na = -a;
        let l1 = na * ratio;
        let l2 = na * clamp(ratio, uniforms.lo, uniforms.hi);
        let c1 = max(l1, l2);
        let l3 = na * uniforms.clipC;
        let c2 = min(l3, c1);`;
const CLIP_UNIFORMS = "lo : f32, hi : f32, clipC : f32,";

/** pg_losses (times the importance weights when given), or their gradient with respect to logp given dL/dpg. */
class PpoTokenProgram extends FusedProgram {
  variableNames: string[];
  uniforms = `total : i32, ${CLIP_UNIFORMS}`;
  constructor(shape: number[], private readonly backward: boolean, private readonly weighted: boolean) {
    super(shape, `verlPpoToken_${backward ? "grad" : "fwd"}_${weighted ? "w" : "1"}`, WG, Math.ceil(sizeOf(shape) / WG));
    this.variableNames = [...(backward ? ["g"] : []), "lp0", "ol0", "a0", ...(weighted ? ["w0"] : [])];
  }
  getUserCode(): string {
    const w = this.weighted;
    const body = this.backward ? `
          let gp = f32(g[index])${w ? " * f32(w0[index])" : ""};
          let neg = a < 0.0;
          var gc1 = select(gp, 0.0, neg);
          let gc2 = select(0.0, gp, neg);
          gc1 = gc1 + select(0.0, gc2, l3 > c1);
          let gl1 = select(0.0, gc1, l1 >= l2);
          let gl2 = select(0.0, gc1, l1 < l2);
          let gr = gl1 * na + select(0.0, gl2 * na, ratio >= uniforms.lo && ratio <= uniforms.hi);
          result[index] = select(0.0, gr * ratio, d >= -20.0 && d <= 20.0);` : `
          result[index] = select(c1, c2, a < 0.0)${w ? " * f32(w0[index])" : ""};`;
    return elementwiseMain({ lp: "lp0", ol: "ol0", a: "a0" }, TERMS + body);
  }
}

/** The metrics, each a masked mean: clipfrac (l2 > l1), ppo_kl (-negKl), clipfrac_lower (c1 > l3 where A < 0). */
export const PPO_METRICS = ["clipfrac", "ppo_kl", "clipfrac_lower"] as const;
const METRIC_TERM: Record<(typeof PPO_METRICS)[number], string> = {
  clipfrac: "select(0.0, 1.0, l2 > l1)",
  ppo_kl: "-negKl",
  clipfrac_lower: "select(0.0, 1.0, c1 > l3 && a < 0.0)",
};

class PpoMetricProgram extends FusedProgram {
  variableNames = ["lp0", "ol0", "a0", "m"];
  uniforms = `total : i32, ${CLIP_UNIFORMS}`;
  constructor(private readonly which: (typeof PPO_METRICS)[number]) { super([1], `verlPpoMetric_${which}`, WG, 1); }
  getUserCode(): string {
    return maskedReduceWgsl(`
            let lp = f32(lp0[i]);
            let ol = f32(ol0[i]);
            let a = f32(a0[i]);${TERMS}`, METRIC_TERM[this.which], true);
  }
}

/**
 * k3 = clamp(exp(k) - k - 1, ±10) with k = clamp(ref - logp, ±20) = clamp(-d, ±20); its gradient in
 * logp is -(g e^k - g) inside both clamps (k3 before its clamp, v, decides the second).
 */
const K3 = {
  terms: "\n          let k = clamp(-d, -20.0, 20.0);\n          let e = exp(k);\n          let v = e - k - 1.0;",
  value: "clamp(v, -10.0, 10.0)",
  grad: "select(0.0, -(g * e - g), -d >= -20.0 && -d <= 20.0 && v >= -10.0 && v <= 10.0)",
};
/**
 * The KL estimators fused (kl.ts klPenaltyForward's kinds). k1 keeps its one subtraction, whose
 * gradient takes no dispatch; the "+" straight-through kinds keep the composite.
 */
export const FUSED_KL_KINDS = ["abs", "mse", "k2", "low_var_kl", "k3"] as const;
export type FusedKlKind = (typeof FUSED_KL_KINDS)[number];

/** Per kind: the value of d = logp - ref, and dvalue/dlogp times g, with tfjs's gradient rules (abs: step(d, -1); clips pass their bounds). */
const K2 = { value: "0.5 * (d * d)", grad: "(g * 0.5) * (d * 2.0)" };
const KL_WGSL: Record<FusedKlKind, { terms?: string; value: string; grad: string }> = {
  mse: K2, k2: K2, low_var_kl: K3, k3: K3,
  abs: { value: "abs(d)", grad: "g * select(-1.0, 1.0, d > 0.0)" },
};

/** The KL penalty per token (forward), or its gradient in logp given g = dL/dkl (backward). */
class KlTokenProgram extends FusedProgram {
  variableNames: string[];
  uniforms = "total : i32,";
  constructor(shape: number[], private readonly kind: FusedKlKind, private readonly backward: boolean) {
    super(shape, `verlKlToken_${kind}_${backward ? "grad" : "fwd"}`, WG, Math.ceil(sizeOf(shape) / WG));
    this.variableNames = [...(backward ? ["g0"] : []), "lp0", "ref0"];
  }
  getUserCode(): string {
    const f = KL_WGSL[this.kind];
    const reads: Record<string, string> = { lp: "lp0", rlp: "ref0", ...(this.backward ? { g: "g0" } : {}) };
    return elementwiseMain(reads, `
          let d = lp - rlp;${f.terms ?? ""}
          result[index] = ${this.backward ? f.grad : f.value};`);
  }
}

const clipUniforms = (a: Record<string, unknown>): UniformValue[] =>
  [f32(1 - (a.low as number)), f32(1 + (a.high as number)), f32(a.clipC as number)];

const KERNELS: Record<string, Kernel> = {
  VerlPpoToken: ({ inputs: { lp, ol, a, w }, backend, attrs }) =>
    backend.runWebGPUProgram(new PpoTokenProgram(lp!.shape, false, !!w), [lp!, ol!, a!, ...(w ? [w] : [])], "float32", [int(sizeOf(lp!.shape)), ...clipUniforms(attrs)]),
  VerlPpoTokenGrad: ({ inputs: { g, lp, ol, a, w }, backend, attrs }) =>
    backend.runWebGPUProgram(new PpoTokenProgram(lp!.shape, true, !!w), [g!, lp!, ol!, a!, ...(w ? [w] : [])], "float32", [int(sizeOf(lp!.shape)), ...clipUniforms(attrs)]),
  VerlKlToken: ({ inputs: { lp, ref }, backend, attrs }) =>
    backend.runWebGPUProgram(new KlTokenProgram(lp!.shape, attrs.kind as FusedKlKind, false), [lp!, ref!], "float32", [int(sizeOf(lp!.shape))]),
  VerlKlTokenGrad: ({ inputs: { g, lp, ref }, backend, attrs }) =>
    backend.runWebGPUProgram(new KlTokenProgram(lp!.shape, attrs.kind as FusedKlKind, true), [g!, lp!, ref!], "float32", [int(sizeOf(lp!.shape))]),
  VerlPpoMetric: ({ inputs: { lp, ol, a, m }, backend, attrs }) =>
    asScalar(backend.runWebGPUProgram(new PpoMetricProgram(attrs.which as (typeof PPO_METRICS)[number]), [lp!, ol!, a!, m!], "float32", [int(sizeOf(lp!.shape)), ...clipUniforms(attrs)])),
};

let registered = false;
function ensureRegistered(): void {
  if (!registered) registerWebGPUKernels(KERNELS);
  registered = true;
}

/**
 * Whether the fused loss kernels (the PPO and KL losses here, the value loss in
 * webgpu_fused_value.ts) take these tensors: the fused switch is on (webgpu_fused.ts), all are
 * float32 of one shape, and VERL_WEBGPU_FUSED_PPO is not 0.
 */
export function fusedLossFor(...xs: tf.Tensor[]): boolean {
  if (process.env.VERL_WEBGPU_FUSED_PPO === "0") return false;
  return xs.every((x) => tf.util.arraysEqual(x.shape, xs[0]!.shape)) && fusedLayersFor(...xs);
}

/**
 * The dual-clip PPO loss per token, max(-A r, -A clip(r, 1 - low, 1 + high)) and for A < 0 its
 * min with -A c (times `weights` when given), differentiable in `logProb` only: `oldLogProb`,
 * `advantages` and `weights` are constants (the old log-probs of an on-policy step are a stopped
 * copy of logProb, which has no gradient either way). One dispatch forward, one backward.
 */
export function fusedPpoTokenLosses(logProb: tf.Tensor, oldLogProb: tf.Tensor, advantages: tf.Tensor, weights: tf.Tensor | null, clip: PpoClip): tf.Tensor {
  ensureRegistered();
  const attrs = { ...clip };
  const consts = { ol: oldLogProb, a: advantages, ...(weights ? { w: weights } : {}) };
  const op = tf.customGrad((...args: (tf.Tensor | tf.GradSaveFunc)[]) => {
    const [lp, save] = args as [tf.Tensor, tf.GradSaveFunc];
    save([lp, oldLogProb, advantages, ...(weights ? [weights] : [])]);
    return {
      value: run("VerlPpoToken", { lp, ...consts }, attrs),
      gradFunc: (dy: tf.Tensor | tf.Tensor[], saved: tf.Tensor[]) =>
        [run("VerlPpoTokenGrad", { g: dy as tf.Tensor, lp: saved[0]!, ol: saved[1]!, a: saved[2]!, ...(weights ? { w: saved[3]! } : {}) }, attrs)],
    };
  });
  return op(logProb);
}

/** One of the loss's metrics as a scalar, a masked mean over `mask` (float32, logProb's shape): one dispatch, no gradient. */
export function fusedPpoMetric(which: (typeof PPO_METRICS)[number], logProb: tf.Tensor, oldLogProb: tf.Tensor, advantages: tf.Tensor, mask: tf.Tensor, clip: PpoClip): tf.Scalar {
  ensureRegistered();
  return run("VerlPpoMetric", { lp: logProb, ol: oldLogProb, a: advantages, m: mask }, { ...clip, which }) as tf.Scalar;
}

/**
 * The KL penalty per token of `kind` (one of FUSED_KL_KINDS), differentiable in `logProb` only
 * (the reference's log-probs are a constant): one dispatch forward, one backward.
 */
export function fusedKlPenalty(logProb: tf.Tensor, refLogProb: tf.Tensor, kind: FusedKlKind): tf.Tensor {
  ensureRegistered();
  const op = tf.customGrad((...args: (tf.Tensor | tf.GradSaveFunc)[]) => {
    const [lp, save] = args as [tf.Tensor, tf.GradSaveFunc];
    save([lp, refLogProb]);
    return {
      value: run("VerlKlToken", { lp, ref: refLogProb }, { kind }),
      gradFunc: (dy: tf.Tensor | tf.Tensor[], saved: tf.Tensor[]) => [run("VerlKlTokenGrad", { g: dy as tf.Tensor, lp: saved[0]!, ref: saved[1]! }, { kind })],
    };
  });
  return op(logProb);
}
