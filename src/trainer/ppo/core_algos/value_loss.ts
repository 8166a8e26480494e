// Clipped value-function loss for the critic (verl compute_value_loss).
import * as tf from "@tensorflow/tfjs";
import type { AggLossOptions } from "./types.js";
import { aggLoss } from "./agg_loss.js";
import { maskedMean, toFloatMask } from "./functional.js";
import { fusedLossFor } from "../../../engine/webgpu_fused_ppo.js";
import { fusedValueClipfrac, fusedValueTokenLosses } from "../../../engine/webgpu_fused_value.js";

export interface ValueLossArgs {
  /** [B,T] values predicted now. */
  vpreds: tf.Tensor;
  /** [B,T] targets (returns from the advantage estimator). */
  returns: tf.Tensor;
  /** [B,T] values at rollout time (the clip centre). */
  values: tf.Tensor;
  responseMask: tf.Tensor;
  /** critic.cliprange_value */
  cliprangeValue: number;
  lossAggMode?: string;
  globalBatchInfo?: AggLossOptions;
}

/**
 * vf_loss = ½·agg(max((v − R)², (clip(v, V − c, V + c) − R)²));
 * vf_clipfrac = masked mean of [(clipped − R)² > (v − R)²]. Both scalar tensors.
 */
export function computeValueLoss(args: ValueLossArgs): { vfLoss: tf.Scalar; vfClipfrac: tf.Scalar } {
  const c = args.cliprangeValue;
  if (typeof c !== "number" || !(c >= 0)) throw new Error(`critic.cliprange_value must be a non-negative number, got ${String(c)}`);
  for (const [name, t] of [["returns", args.returns], ["values", args.values], ["responseMask", args.responseMask]] as const) {
    if (t.shape.join() !== args.vpreds.shape.join()) {
      throw new Error(`computeValueLoss: ${name} has shape [${t.shape.join(", ")}] but vpreds has [${args.vpreds.shape.join(", ")}]`);
    }
  }
  return tf.tidy(() => {
    const mask = toFloatMask(args.responseMask);
    if (fusedLossFor(args.vpreds, args.returns, args.values, mask)) {
      // WebGPU: the same formulas, one kernel for the per-token loss and one for the clip fraction
      const losses = fusedValueTokenLosses(args.vpreds, args.returns, args.values, c);
      return {
        vfLoss: tf.mul(0.5, aggLoss(losses, mask, args.lossAggMode ?? "token-mean", args.globalBatchInfo)) as tf.Scalar,
        vfClipfrac: fusedValueClipfrac(args.vpreds, args.returns, args.values, mask, c),
      };
    }
    const vClipped = tf.minimum(tf.maximum(args.vpreds, tf.sub(args.values, c)), tf.add(args.values, c));
    const losses1 = tf.square(tf.sub(args.vpreds, args.returns));
    const losses2 = tf.square(tf.sub(vClipped, args.returns));
    const vfLoss = tf.mul(0.5, aggLoss(tf.maximum(losses1, losses2), mask, args.lossAggMode ?? "token-mean", args.globalBatchInfo)) as tf.Scalar;
    const vfClipfrac = maskedMean(tf.cast(tf.greater(losses2, losses1), "float32"), mask) as tf.Scalar;
    return { vfLoss, vfClipfrac };
  });
}
