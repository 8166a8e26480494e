// The SFT objective: cross-entropy of each next token, weighted by loss_mask.
// loss_mask[t] weighs the prediction of token t+1 from position t (the logits at
// t), so with verl's mask exactly the response tokens and EOS carry loss. (verl's
// fsdp_sft_trainer slices the mask as loss_mask[:, 1:] against the same logits,
// which trains on the last prompt token and never on EOS; we align it with the
// logits instead.) The sum is returned: the caller divides by the token count of
// the whole global batch, so micro-batches and ranks add up to one big batch.
import * as tf from "@tensorflow/tfjs";
import type { LlamaModel } from "../../models/index.js";
import type { DataProto } from "../../protocol/index.js";
import { int32Columns, type TensorData } from "../../protocol/tensor.js";
import { logProbsFromLogits } from "../../rollout/index.js";

function col(data: DataProto, key: string): TensorData {
  const t = data.batch[key];
  if (!t) throw new Error(`SFT batch has no '${key}' (present: ${Object.keys(data.batch).join(", ") || "none"})`);
  return t;
}

/** Tokens that carry loss: Σ loss_mask[:, :-1]. */
export function countLossTokens(data: DataProto): number {
  if (data.length === 0) return 0;
  const m = col(data, "loss_mask");
  const [B, L] = m.shape as [number, number];
  let n = 0;
  for (let b = 0; b < B; b++) for (let t = 0; t < L - 1; t++) n += m.data[b * L + t]!;
  return n;
}

/** Columns worth computing: up to the last attended position of any row (right padding is dropped). */
function usedWidth(mask: TensorData): number {
  const [B, L] = mask.shape as [number, number];
  let w = 1;
  for (let b = 0; b < B; b++) for (let t = L - 1; t >= w; t--) if (mask.data[b * L + t]) { w = t + 1; break; }
  return w;
}

/**
 * Σ_t −log p(input_ids[t+1] | ≤t) · loss_mask[t] over a micro-batch (a tf scalar,
 * differentiable in the model's variables). Call inside tf.tidy / tf.variableGrads.
 */
export function sftLossSum(model: LlamaModel, micro: DataProto): tf.Scalar {
  const ids = col(micro, "input_ids"), attn = col(micro, "attention_mask"), lossMask = col(micro, "loss_mask");
  const B = ids.shape[0]!;
  const T = usedWidth(attn);
  if (T < 2) return tf.scalar(0);
  // columns cut on the host; mask and positions stay host arrays (the forward uses them there)
  const cut = (t: TensorData, start: number, width: number) => tf.tensor2d(int32Columns(t, start, width), [B, width], "int32");
  const pos = micro.batch.position_ids;
  const hidden = model.hiddenStates(cut(ids, 0, T), { attentionMask: int32Columns(attn, 0, T), positionIds: pos ? int32Columns(pos, 0, T) : undefined });
  const logits = model.lmHead(hidden.slice([0, 0, 0], [B, T - 1, -1]));
  const logProbs = logProbsFromLogits(logits, cut(ids, 1, T - 1));
  const weights = tf.cast(cut(lossMask, 0, T - 1), "float32");
  return tf.neg(tf.sum(tf.mul(logProbs, weights))) as tf.Scalar;
}
