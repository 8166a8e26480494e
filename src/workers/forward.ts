// The differentiable forward passes the workers train and score with: per-token
// log-probs (and entropy) of the response under a causal LM, and per-token values
// under a value model. Both read only the response positions: the logits of the
// token before each response token, as verl's dp_actor slices
// logits[:, -R-1:-1], so the lm head runs on R positions instead of P+R.
import * as tf from "@tensorflow/tfjs";
import type { DataProto } from "../protocol/index.js";
import { tensor, type TensorData } from "../protocol/tensor.js";
import { entropyFromLogits } from "../trainer/ppo/core_algos/index.js";
import { column, microBatches, toTf, type MicroBatchSpec } from "./batching.js";

export interface ForwardInputs {
  attentionMask?: tf.Tensor2D;
  positionIds?: tf.Tensor2D;
}

/** What the actor needs of a causal LM (LlamaModel has it). */
export interface CausalLm {
  hiddenStates(inputIds: tf.Tensor2D, opts?: ForwardInputs): tf.Tensor3D;
  lmHead(hidden: tf.Tensor): tf.Tensor;
}

/** What the critic and the reward model need of a value model (ValueHeadModel has it). */
export interface ValueModel {
  forward(inputIds: tf.Tensor2D, opts?: ForwardInputs): tf.Tensor2D;
}

function modelInputs(micro: DataProto): { ids: tf.Tensor2D; opts: ForwardInputs } {
  const ids = toTf(column(micro, "input_ids"), "int32") as tf.Tensor2D;
  const opts: ForwardInputs = { attentionMask: toTf(column(micro, "attention_mask"), "int32") as tf.Tensor2D };
  if (micro.batch.position_ids) opts.positionIds = toTf(micro.batch.position_ids, "int32") as tf.Tensor2D;
  return { ids, opts };
}

/** log p(label) from logits, with a one-hot product (its gradient needs no scatter kernel). */
export function logProbsOfLabels(logits: tf.Tensor, labels: tf.Tensor): tf.Tensor {
  return tf.tidy(() => {
    const vocab = logits.shape[logits.rank - 1]!;
    const logp = tf.logSoftmax(logits);
    return tf.sum(tf.mul(logp, tf.oneHot(tf.cast(labels, "int32"), vocab)), -1);
  });
}

/**
 * Response log-probs [b, R] of `responses` under `model` at `temperature`, and the
 * entropy [b, R] of the same distributions when asked. Differentiable; call inside a tape or tidy.
 */
export function responseLogProbs(
  model: CausalLm, micro: DataProto, temperature: number, withEntropy: boolean,
): { logProb: tf.Tensor2D; entropy?: tf.Tensor2D } {
  if (!(temperature > 0)) throw new Error(`log-prob temperature must be > 0, got ${temperature}`);
  const responses = column(micro, "responses");
  const R = responses.shape[1]!;
  const { ids, opts } = modelInputs(micro);
  const [b, T] = ids.shape;
  if (R >= T) throw new Error(`responses width ${R} must be smaller than input_ids width ${T} (prompts come first)`);
  const hidden = model.hiddenStates(ids, opts);
  const h = tf.slice(hidden, [0, T - R - 1, 0], [b, R, hidden.shape[2]!]);
  let logits = model.lmHead(h);
  if (temperature !== 1) logits = tf.div(logits, temperature);
  const logProb = logProbsOfLabels(logits, toTf(responses, "int32")) as tf.Tensor2D;
  return withEntropy ? { logProb, entropy: entropyFromLogits(logits) as tf.Tensor2D } : { logProb };
}

/** Values [b, R] at the response positions (the value of the state before each response token). */
export function responseValues(model: ValueModel, micro: DataProto): tf.Tensor2D {
  const R = column(micro, "responses").shape[1]!;
  const { ids, opts } = modelInputs(micro);
  const [b, T] = ids.shape;
  const v = model.forward(ids, opts);
  return tf.slice(v, [0, T - R - 1], [b, R]);
}

/**
 * Runs `fn` over micro-batches without gradients and stitches each output ([b, R]
 * float tensors) back into row order: the inference half of the workers
 * (old / ref log-probs, values, reward-model scores).
 */
export function inferInMicroBatches(
  data: DataProto, spec: MicroBatchSpec, fn: (micro: DataProto) => tf.Tensor[],
): TensorData[] {
  const { batches, indices } = microBatches(data, spec);
  let outs: Float32Array[] | undefined;
  let widths: number[] = [];
  batches.forEach((micro, k) => {
    const results = tf.tidy(() => fn(micro));
    const host = results.map((t) => t.dataSync() as Float32Array);
    if (!outs) {
      widths = results.map((t) => t.shape[1] ?? 1);
      outs = widths.map((w) => new Float32Array(data.length * w));
    }
    tf.dispose(results);
    indices[k]!.forEach((row, i) => {
      host.forEach((h, j) => outs![j]!.set(h.subarray(i * widths[j]!, (i + 1) * widths[j]!), row * widths[j]!));
    });
  });
  return (outs ?? []).map((o, j) => tensor(o, [data.length, widths[j]!], "float32"));
}

/** Read scalar tensors in one transfer (the tensors stay alive; the caller disposes them). */
export function readScalars(xs: tf.Tensor[]): Float32Array {
  const stacked = tf.stack(xs);
  const vals = stacked.dataSync() as Float32Array;
  stacked.dispose();
  return vals;
}
