// Forward passes the workers score with: per-token values under a value model
// (the value of the state before each response token, verl's values[:, -R-1:-1]),
// and the micro-batched no-grad driver shared with the actor's log-probs (which
// come from the rollout layer's responseLogProbs, the same function the update
// differentiates, so old and new log-probs agree bit for bit).
import * as tf from "@tensorflow/tfjs";
import type { DataProto } from "../protocol/index.js";
import { packResponses } from "../models/packing.js";
import { int32Values, tensor, type TensorData } from "../protocol/tensor.js";
import { heartbeat } from "../single_controller/heartbeat.js";
import { envSwitch } from "../utils/env_switch.js";
import { column, microBatches, toTf, type MicroBatchSpec } from "./batching.js";

export interface ForwardInputs {
  /** Host arrays [b*T]: the model uses them on the host (see LlamaModel's ForwardOptions). */
  attentionMask?: ArrayLike<number>;
  positionIds?: ArrayLike<number>;
  /** Sequence lengths of a packed [1, N] input (remove-padding). */
  segments?: ArrayLike<number>;
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

/**
 * Values [b, R] at the response positions (the value of the state before each response token).
 * With `removePadding` the forward runs on the packed real tokens (padded slots read 0).
 */
export function responseValues(model: ValueModel, micro: DataProto, removePadding = false): tf.Tensor2D {
  const R = column(micro, "responses").shape[1]!;
  if (removePadding) return packedResponseValues(model, micro, R);
  const { ids, opts } = modelInputs(micro);
  const [b, T] = ids.shape;
  const v = model.forward(ids, opts);
  return tf.slice(v, [0, T - R - 1], [b, R]);
}

function packedResponseValues(model: ValueModel, micro: DataProto, R: number): tf.Tensor2D {
  const ids = column(micro, "input_ids"), [B, L] = ids.shape as [number, number];
  const pk = packResponses(int32Values(ids), column(micro, "attention_mask").data, B, L, R, micro.batch.position_ids?.data);
  if (pk.source.length === 0) return tf.zeros([B, R]);
  return tf.tidy(() => {
    const v = model.forward(tf.tensor2d(pk.ids, [1, pk.ids.length], "int32"), { positionIds: pk.positions, segments: pk.lengths });
    const picked = tf.gather(v.reshape([-1]), tf.tensor1d(pk.source, "int32"));
    return tf.gather(tf.concat([picked, tf.zeros([1])]), tf.tensor1d(pk.slot, "int32")).reshape([B, R]) as tf.Tensor2D;
  });
}

/**
 * Runs `fn` over micro-batches without gradients and stitches each output (float or int32
 * tensors, one row per sequence: [b, R], or [b, L, S, K] for routed experts) back into row
 * order: the inference half of the workers (old / ref log-probs, values, reward-model scores).
 */
export async function inferInMicroBatches(
  data: DataProto, spec: MicroBatchSpec, fn: (micro: DataProto) => tf.Tensor[],
): Promise<TensorData[]> {
  const { batches, indices } = microBatches(data, spec);
  let outs: (Float32Array | Int32Array)[] | undefined;
  let shapes: number[][] = [], widths: number[] = [];
  const place = (k: number, results: tf.Tensor[], host: (Float32Array | Int32Array)[]) => {
    if (!outs) {
      shapes = results.map((t) => (t.rank === 1 ? [] : t.shape.slice(1)));
      widths = shapes.map((s) => s.reduce((a, b) => a * b, 1));
      outs = results.map((t, j) => (t.dtype === "int32" ? new Int32Array(data.length * widths[j]!) : new Float32Array(data.length * widths[j]!)));
    }
    indices[k]!.forEach((row, i) => {
      host.forEach((h, j) => outs![j]!.set(h.subarray(i * widths[j]!, (i + 1) * widths[j]!), row * widths[j]!));
    });
  };
  // A micro-batch's read is awaited after the next one is recorded, so the host records while the
  // device computes (a GPU backend reads only asynchronously; awaiting each read at once left the
  // device idle while the host recorded the next micro-batch). Two micro-batches' outputs are alive at most.
  let previous: { k: number; results: tf.Tensor[]; reads: Promise<(Float32Array | Int32Array)[]> } | undefined;
  const finish = async (p: NonNullable<typeof previous>) => {
    try {
      place(p.k, p.results, await p.reads);
    } finally {
      tf.dispose(p.results);
    }
  };
  try {
    for (const [k, micro] of batches.entries()) {
      heartbeat();
      const results = tf.tidy(() => fn(micro));
      // async reads: the only kind a GPU backend offers under Node (and as cheap on wasm)
      const reads = Promise.all(results.map((t) => t.data())) as Promise<(Float32Array | Int32Array)[]>;
      reads.catch(() => undefined); // awaited below; a rejection before then is not unhandled
      const done = previous;
      previous = { k, results, reads };
      if (done) await finish(done);
    }
    if (previous) {
      const last = previous;
      previous = undefined;
      await finish(last);
    }
  } finally {
    if (previous) tf.dispose(previous.results);
  }
  return (outs ?? []).map((o, j) => tensor(o, [data.length, ...(shapes[j]!.length ? shapes[j]! : [1])], o instanceof Int32Array ? "int32" : "float32"));
}

/**
 * VERL_READ_EACH_MICRO_BATCH=1: an update reads each micro-batch's scalars before it records the
 * next (the old order, for comparisons); by default they are read once, at the end of the mini-batch.
 */
export function readEachMicroBatch(env: string | undefined = process.env.VERL_READ_EACH_MICRO_BATCH): boolean {
  return envSwitch("VERL_READ_EACH_MICRO_BATCH", false, env);
}

/**
 * The scalars an update's micro-batches report (loss terms, metrics), kept on the device until the
 * mini-batch's last micro-batch is recorded and then read in one transfer. A read per micro-batch
 * made the host wait for the device before recording the next one, and the device wait for the
 * host after it. Each micro-batch's values are handed to its `settle` in recording order.
 */
export class MicroBatchScalars {
  private pending: { tensors: tf.Tensor[]; settle: (values: Float32Array) => void | Promise<void> }[] = [];

  /** One micro-batch's scalar tensors (disposed once read) and what to do with their values. */
  async add(tensors: tf.Tensor[], settle: (values: Float32Array) => void | Promise<void>): Promise<void> {
    this.pending.push({ tensors, settle });
    if (readEachMicroBatch()) await this.flush();
  }

  /** Reads every pending micro-batch's scalars in one transfer and settles them, in order. */
  async flush(): Promise<void> {
    const pending = this.pending, all = pending.flatMap((p) => p.tensors);
    this.pending = [];
    let values: Float32Array;
    try {
      values = await readScalars(all);
    } finally {
      tf.dispose([...new Set(all)]); // a tensor may be reported twice (the loss as a term and a metric)
    }
    let at = 0;
    for (const p of pending) {
      await p.settle(values.subarray(at, at + p.tensors.length));
      at += p.tensors.length;
    }
  }
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
