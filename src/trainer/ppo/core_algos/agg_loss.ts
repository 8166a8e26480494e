// Reduce a [B,T] loss matrix to the scalar that is differentiated (verl agg_loss, §4.3).
//
// Global normalisation, so that gradient accumulation over micro-batches and ranks
// equals one big batch: for each micro-batch a worker calls the loss with
//   dpSize          = number of data-parallel ranks whose gradients are AVERAGED
//                     (1 when the ranks' gradients are summed instead),
//   batchNumTokens  = Σ response_mask over the whole mini-batch, all ranks (token-mean),
//   globalBatchSize = number of non-empty responses in the mini-batch, all ranks
//                     (seq-mean-*; verl passes ppo_mini_batch_size·n, the same when none is empty),
//   lossScaleFactor = a constant divisor for seq-mean-token-sum-norm (default T),
// and SUMS the micro-batch gradients (no 1/num_micro_batches). Without these options
// each call normalises by its own micro-batch (verl's local behaviour).
import * as tf from "@tensorflow/tfjs";
import type { ActorLossConfig, AggLossOptions } from "./types.js";
import { LOSS_AGG_MODES } from "../../../config/validate.js";
import { maskedSum, toFloatMask } from "./functional.js";

// The modes are listed once, by the config checks.
export { LOSS_AGG_MODES };
export type LossAggMode = (typeof LOSS_AGG_MODES)[number];

export function checkLossAggMode(mode: string): LossAggMode {
  if (!(LOSS_AGG_MODES as readonly string[]).includes(mode)) {
    throw new Error(`invalid loss_agg_mode '${mode}'; choose one of ${LOSS_AGG_MODES.join(", ")}`);
  }
  return mode as LossAggMode;
}

function positiveOrUndefined(v: number | null | undefined, name: string): number | undefined {
  if (v === null || v === undefined) return undefined;
  if (typeof v !== "number" || !Number.isFinite(v) || v < 0) throw new Error(`aggLoss: ${name} must be a non-negative number, got ${String(v)}`);
  return v;
}

/** A count used as a denominator: 0 becomes 1 so an all-empty micro-batch contributes 0, not NaN. */
function safeCount(t: tf.Tensor): tf.Tensor {
  return tf.where(tf.equal(t, 0), tf.onesLike(t), t);
}

/**
 * token-mean:              Σ(L·m) / batchNumTokens · dpSize
 * seq-mean-token-sum:      Σ_seq Σ_t(L·m) / globalBatchSize · dpSize
 * seq-mean-token-mean:     Σ_seq [Σ_t(L·m)/(Σ_t m + 1e-8)] / globalBatchSize · dpSize
 * seq-mean-token-sum-norm: Σ_seq Σ_t(L·m) / lossScaleFactor · dpSize
 * (local defaults: batchNumTokens = Σm, globalBatchSize = #non-empty rows, lossScaleFactor = T).
 * Fully masked rows never count. Unlike verl, an empty mask gives 0 instead of NaN,
 * and seq-mean-token-sum-norm also scales by dpSize so every mode obeys the rule above.
 */
export function aggLoss(lossMat: tf.Tensor, lossMask: tf.Tensor, lossAggMode: string, opts: AggLossOptions = {}): tf.Scalar {
  const mode = checkLossAggMode(lossAggMode);
  if (lossMat.shape.join() !== lossMask.shape.join()) {
    throw new Error(`aggLoss: loss matrix shape [${lossMat.shape.join(", ")}] differs from mask shape [${lossMask.shape.join(", ")}]`);
  }
  const dpSize = positiveOrUndefined(opts.dpSize, "dpSize") ?? 1;
  const batchNumTokens = positiveOrUndefined(opts.batchNumTokens, "batchNumTokens");
  const globalBatchSize = positiveOrUndefined(opts.globalBatchSize, "globalBatchSize");
  const lossScaleFactor = positiveOrUndefined(opts.lossScaleFactor, "lossScaleFactor");
  const last = lossMat.rank - 1;
  return tf.tidy(() => {
    const m = toFloatMask(lossMask);
    if (mode === "token-mean") {
      const den = batchNumTokens !== undefined ? batchNumTokens || 1 : safeCount(tf.sum(m));
      const mean = tf.div(maskedSum(lossMat, m), den);
      return (dpSize === 1 ? mean : tf.mul(mean, dpSize)) as tf.Scalar; // ×1 is exact: one dispatch fewer
    }
    const tokenCount = tf.sum(m, last);
    if (mode === "seq-mean-token-sum-norm") {
      const den = lossScaleFactor ?? lossMat.shape[last]!;
      return tf.mul(tf.div(tf.sum(maskedSum(lossMat, m, last)), den), dpSize) as tf.Scalar;
    }
    let seqLoss = maskedSum(lossMat, m, last);
    if (mode === "seq-mean-token-mean") seqLoss = tf.div(seqLoss, tf.add(tokenCount, 1e-8));
    const seqMask = tf.cast(tf.greater(tokenCount, 0), "float32");
    const den = globalBatchSize !== undefined ? globalBatchSize || 1 : safeCount(tf.sum(seqMask));
    return tf.mul(tf.div(maskedSum(seqLoss, seqMask), den), dpSize) as tf.Scalar;
  });
}

/** Global options from verl's runtime field `config.global_batch_info` (+ `loss_scale_factor`). */
export function aggLossOptionsFromConfig(config: ActorLossConfig | undefined): AggLossOptions {
  const info = config?.global_batch_info ?? {};
  return {
    dpSize: info.dp_size ?? 1,
    batchNumTokens: info.batch_num_tokens ?? undefined,
    globalBatchSize: info.global_batch_size ?? undefined,
    lossScaleFactor: info.loss_scale_factor ?? config?.loss_scale_factor ?? undefined,
  };
}
