// Forward passes the workers score with: per-token values under a value model
// (the value of the state before each response token, verl's values[:, -R-1:-1]),
// and the micro-batched no-grad driver shared with the actor's log-probs (which
// come from the rollout layer's responseLogProbs, the same function the update
// differentiates, so old and new log-probs agree bit for bit).
import * as tf from "@tensorflow/tfjs";
import type { DataProto } from "../protocol/index.js";
import { tensor, type TensorData } from "../protocol/tensor.js";
import { heartbeat } from "../single_controller/heartbeat.js";
import { column, microBatches, toTf, type MicroBatchSpec } from "./batching.js";

export interface ForwardInputs {
  /** Host arrays [b*T]: the model uses them on the host (see LlamaModel's ForwardOptions). */
  attentionMask?: ArrayLike<number>;
  positionIds?: ArrayLike<number>;
}

/** What the critic and the reward model need of a value model (ValueHeadModel has it). */
export interface ValueModel {
  forward(inputIds: tf.Tensor2D, opts?: ForwardInputs): tf.Tensor2D;
}

function modelInputs(micro: DataProto): { ids: tf.Tensor2D; opts: ForwardInputs } {
  const ids = toTf(column(micro, "input_ids"), "int32") as tf.Tensor2D;
  const opts: ForwardInputs = { attentionMask: column(micro, "attention_mask").data };
  if (micro.batch.position_ids) opts.positionIds = micro.batch.position_ids.data;
  return { ids, opts };
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
export async function inferInMicroBatches(
  data: DataProto, spec: MicroBatchSpec, fn: (micro: DataProto) => tf.Tensor[],
): Promise<TensorData[]> {
  const { batches, indices } = microBatches(data, spec);
  let outs: Float32Array[] | undefined;
  let widths: number[] = [];
  for (const [k, micro] of batches.entries()) {
    heartbeat();
    const results = tf.tidy(() => fn(micro));
    // async reads: the only kind a GPU backend offers under Node (and as cheap on wasm)
    const host = (await Promise.all(results.map((t) => t.data()))) as Float32Array[];
    if (!outs) {
      widths = results.map((t) => t.shape[1] ?? 1);
      outs = widths.map((w) => new Float32Array(data.length * w));
    }
    tf.dispose(results);
    indices[k]!.forEach((row, i) => {
      host.forEach((h, j) => outs![j]!.set(h.subarray(i * widths[j]!, (i + 1) * widths[j]!), row * widths[j]!));
    });
  }
  return (outs ?? []).map((o, j) => tensor(o, [data.length, widths[j]!], "float32"));
}

/** Read scalar tensors in one async transfer (the tensors stay alive; the caller disposes them). */
export async function readScalars(xs: tf.Tensor[]): Promise<Float32Array> {
  if (xs.length === 0) return new Float32Array(0);
  const stacked = tf.stack(xs);
  try {
    return (await stacked.data()) as Float32Array;
  } finally {
    stacked.dispose();
  }
}
