// Log-probs and entropy of given responses under a model, with the tfjs forward
// (differentiable: the actor update calls `responseLogProbs` inside
// tf.variableGrads), and a micro-batched, no-grad `computeLogProb` for old/ref
// log-probs.
import { sparseLayerCount } from "../models/config.js";
import * as tf from "@tensorflow/tfjs";
import { routerLoss } from "../models/moe_loss.js";
import { DataProto } from "../protocol/data_proto.js";
import { int32Columns, int32Values, tensor, type TensorData } from "../protocol/tensor.js";
import type { LlamaModel, MtpInputs } from "../models/llama.js";
import { packResponses } from "../models/packing.js";
import { fusedLogProbsFor, fusedTokenLogProbs } from "../engine/webgpu_fused_logprob.js";

// Both go through tf.logSoftmax, whose gradient is written by hand in tfjs
// (logSumExp's autograd compares every logit with the row maximum: slow on wasm).

/**
 * tf.sum(x, -1) whose gradient broadcasts dy with a tile: tfjs's own multiplies dy by a ones tensor
 * of x's size made on the host, an upload of [..., V] floats every backward pass on WebGPU. Same bits.
 */
function sumLast(x: tf.Tensor): tf.Tensor {
  const op = tf.customGrad((...args: (tf.Tensor | tf.GradSaveFunc)[]) => {
    const xs = args[0] as tf.Tensor;
    return { value: tf.sum(xs, -1), gradFunc: (dy: tf.Tensor | tf.Tensor[]) => [tf.broadcastTo(tf.expandDims(dy as tf.Tensor, -1), xs.shape)] };
  });
  return op(x) as tf.Tensor;
}

/** log softmax(logits)[label] from log-softmax values [..., V]. */
function pick(logSm: tf.Tensor, labels: tf.Tensor): tf.Tensor {
  // a one-hot product rather than a gather: its gradient is one multiply on every backend
  return sumLast(tf.mul(logSm, tf.oneHot(labels.toInt(), logSm.shape[logSm.shape.length - 1]!)));
}

/** Entropy from log-softmax values: -sum(p log p). */
function entropyOf(logSm: tf.Tensor): tf.Tensor {
  return tf.neg(sumLast(tf.mul(tf.exp(logSm), logSm)));
}

/** Σ_v π(v)² from log-softmax values (verl's sum_pi_squared: exp(logsumexp(2·z) − 2·logsumexp(z))). */
function sumPiSquaredOf(logSm: tf.Tensor): tf.Tensor {
  return sumLast(tf.exp(tf.mul(logSm, 2)));
}

/** log softmax(logits)[label] along the last axis: logits [..., V], labels [...] -> [...] (SFT's loss). */
export function logProbsFromLogits(logits: tf.Tensor, labels: tf.Tensor): tf.Tensor {
  return tf.tidy(() => tokenTerms(logits, labels, 1, {}).logProbs);
}

type TokenTerms = { logProbs: tf.Tensor; entropy?: tf.Tensor; sumPiSquared?: tf.Tensor };

/**
 * The per-token terms of `logits` ([..., V], before the temperature) at `labels` ([...]), shaped as
 * labels: log-probs, and entropy and Σπ² when asked. On WebGPU two fused kernels
 * (engine/webgpu_fused_logprob.ts: no [N, V] temporary but the gradient); other backends take the
 * log-softmax composite.
 */
function tokenTerms(logits: tf.Tensor, labels: tf.Tensor, temperature: number, opts: LogProbOptions): TokenTerms {
  const V = logits.shape[logits.shape.length - 1]!, lead = logits.shape.slice(0, -1);
  const flat = logits.reshape([-1, V]) as tf.Tensor2D;
  if (fusedLogProbsFor(flat)) {
    const { logProbs, entropy, sumPiSquared } = fusedTokenLogProbs(flat, labels.reshape([-1]).toInt() as tf.Tensor1D, temperature);
    return {
      logProbs: logProbs.reshape(lead),
      ...(opts.calculateEntropy ? { entropy: entropy.reshape(lead) } : {}),
      ...(opts.calculateSumPiSquared ? { sumPiSquared: sumPiSquared.reshape(lead) } : {}),
    };
  }
  const logSm = tf.logSoftmax(temperature !== 1 ? logits.div(temperature) : logits);
  return {
    logProbs: pick(logSm, labels),
    ...(opts.calculateEntropy ? { entropy: entropyOf(logSm) } : {}),
    ...(opts.calculateSumPiSquared ? { sumPiSquared: sumPiSquaredOf(logSm) } : {}),
  };
}

/** tokenTerms' outputs through `place` (pad or unpack to [B, R]). */
function placed(t: TokenTerms, place: (t: tf.Tensor) => tf.Tensor2D): Pick<ResponseLogProbs, "logProbs" | "entropy" | "sumPiSquared"> {
  return {
    logProbs: place(t.logProbs),
    ...(t.entropy ? { entropy: place(t.entropy) } : {}),
    ...(t.sumPiSquared ? { sumPiSquared: place(t.sumPiSquared) } : {}),
  };
}

/** Entropy of softmax(logits) along the last axis. */
export function entropyFromLogits(logits: tf.Tensor): tf.Tensor {
  return tf.tidy(() => entropyOf(tf.logSoftmax(logits)));
}

export interface LogProbOptions {
  /** Logits are divided by this first (the rollout temperature); 0 is read as 1 (greedy). */
  temperature?: number;
  calculateEntropy?: boolean;
  /** Also Σ_v π(v)² of the (temperature-scaled) distribution at each response position. */
  calculateSumPiSquared?: boolean;
  /** Pack the real tokens into one row (verl's use_remove_padding); padded slots then read 0. */
  removePadding?: boolean;
  /** MoE: also return the router's aux loss and load over the forward's real tokens (models/moe_loss.ts). */
  routerLoss?: boolean;
  /** MoE routing replay: the batch's routed_experts [B, L, sparseLayers, topK] (int32) force each token's experts. */
  replayExperts?: TensorData;
  /**
   * MoE: also return the experts each token was routed to (routed_experts [B, L, sparseLayers, topK]); 0 where the
   * forward did not run: padding, and without removePadding the batch's last column (it predicts nothing).
   */
  recordExperts?: boolean;
  /**
   * MiMo multi-token prediction (model.mtp.enable_train): also the MTP head's log-prob of each response
   * token, predicted two positions ahead (Megatron's MTP loss: input_ids, labels and loss mask rolled by one).
   */
  mtp?: { detachEncoder?: boolean };
}

/** What responseLogProbs returns: [B, R] log-probs, entropy when asked, the router's loss terms when asked. */
export type ResponseLogProbs = {
  logProbs: tf.Tensor2D; entropy?: tf.Tensor2D; sumPiSquared?: tf.Tensor2D; router?: { aux: tf.Scalar; load: tf.Scalar };
  /** recordExperts: [B, L, sparseLayers, topK] int32 */
  routedExperts?: tf.Tensor4D;
  /**
   * mtp: [B, R] log p_MTP(response j | trunk state at P+j-2, token P+j-1), no temperature (the MTP loss is
   * plain cross entropy), and the mask of the response tokens that have such a position (0 for padding and
   * for a response token right after a one-token prompt).
   */
  mtp?: { logProbs: tf.Tensor2D; mask: tf.Tensor2D };
};

/** Sparse layers and top-k of a MoE model: the trailing dimensions of routed_experts. */
export function routedExpertsShape(model: LlamaModel): [number, number] {
  const c = model.config;
  if (!c.moe) throw new Error("routed experts: the model has no routed experts (router replay needs a MoE model such as qwen3_moe)");
  return [sparseLayerCount(c), c.moe.topK];
}

/** routed_experts [B, L, S, K] checked against the input [B, L] and the model. */
function checkRoutedExperts(t: TensorData, model: LlamaModel, B: number, L: number): number {
  const [S, K] = routedExpertsShape(model);
  if (t.shape.join(",") !== [B, L, S, K].join(",")) {
    throw new Error(`log-probs: routed_experts has shape [${t.shape}], input_ids [${B}, ${L}] with ${S} sparse layers and top-${K} routing need [${B}, ${L}, ${S}, ${K}]`);
  }
  return S * K;
}

/**
 * The MTP head's log-probs at response slots: `source` [B*R] is each slot's row of `hidden` [rows, dim]
 * (-1: none), `labels` [B*R] the response tokens. Slots without a source read 0 and are masked.
 */
function mtpResponseTerms(model: LlamaModel, hidden: tf.Tensor, source: Int32Array, labels: ArrayLike<number>, B: number, R: number): { logProbs: tf.Tensor2D; mask: tf.Tensor2D } {
  const rows: number[] = [], picked: number[] = [], slot = new Int32Array(B * R), mask = new Float32Array(B * R);
  source.forEach((src, i) => {
    slot[i] = src < 0 ? -1 : rows.length;
    if (src >= 0) { rows.push(src); picked.push(labels[i]!); mask[i] = 1; }
  });
  const n = rows.length;
  for (let i = 0; i < slot.length; i++) if (slot[i]! < 0) slot[i] = n;
  const maskT = tf.tensor2d(mask, [B, R]);
  if (n === 0) return { logProbs: tf.zeros([B, R]) as tf.Tensor2D, mask: maskT };
  const logits = model.lmHead(tf.gather(hidden.reshape([-1, model.config.dim]), tf.tensor1d(Int32Array.from(rows), "int32")));
  const lp = tokenTerms(logits, tf.tensor1d(Int32Array.from(picked), "int32"), 1, {}).logProbs;
  return { logProbs: tf.gather(tf.concat([lp, tf.zeros([1])]), tf.tensor1d(slot, "int32")).reshape([B, R]) as tf.Tensor2D, mask: maskT };
}

/**
 * The response tokens the MTP loss covers [B, R]: real (attention_mask) and with a real token two
 * columns back to predict them from (Megatron's loss mask rolled by one: every response token after
 * a prompt of two or more tokens). The same mask responseLogProbs' `mtp.mask` holds.
 */
export function mtpTokenMask(micro: DataProto): TensorData {
  const mask = tdata(micro, "attention_mask"), R = tdata(micro, "responses").shape[1]!;
  const [B, L] = mask.shape as [number, number], P = L - R, out = new Float32Array(B * R);
  for (let b = 0; b < B; b++) for (let j = 0; j < R; j++) {
    if (P + j - 2 >= 0 && mask.data[b * L + P + j] && mask.data[b * L + P + j - 2]) out[b * R + j] = 1;
  }
  return tensor(out, [B, R], "float32");
}

/** The router's loss terms from the logits a forward collected (disposed here). */
function routerTerms(model: LlamaModel, collected: tf.Tensor[], tokenMask?: ArrayLike<number>): { aux: tf.Scalar; load: tf.Scalar } {
  try {
    return routerLoss(collected, model.config.moe!.topK, tokenMask);
  } finally {
    tf.dispose(collected);
  }
}

function tdata(data: DataProto, key: string): TensorData {
  const t = data.batch[key];
  if (!t) throw new Error(`log-probs: the batch has no '${key}'`);
  return t;
}

/**
 * Response log-probs [B, R] (and entropy) under `model` for a micro-batch with
 * input_ids, attention_mask, position_ids [B, P+R] and responses [B, R], as tf
 * tensors with gradients. Columns that are padding in every row (left of the
 * prompts, right of the longest response) are trimmed before the forward; the
 * trimmed response slots get log-prob 0 (they are masked everywhere).
 */
export function responseLogProbs(model: LlamaModel, micro: DataProto, opts: LogProbOptions = {}): ResponseLogProbs {
  if (opts.routerLoss && !model.config.moe) throw new Error("log-probs: routerLoss asked of a model without experts");
  if ((opts.replayExperts || opts.recordExperts) && !model.config.moe) routedExpertsShape(model);
  if (opts.removePadding) return packedResponseLogProbs(model, micro, opts);
  const ids = tdata(micro, "input_ids"), mask = tdata(micro, "attention_mask"), responses = tdata(micro, "responses");
  const [B, L] = ids.shape as [number, number], R = responses.shape[1]!, P = L - R;
  if (P < 1) throw new Error(`log-probs: input_ids [${ids.shape}] leaves no prompt before responses [${responses.shape}]`);
  const pos = micro.batch["position_ids"];
  // trim: first column any row uses, last response column any row uses
  let first = P - 1, lastR = 0;
  for (let b = 0; b < B; b++) {
    for (let s = 0; s < first; s++) if (mask.data[b * L + s]) { first = s; break; }
    for (let t = R - 1; t >= lastR; t--) if (mask.data[b * L + P + t]) { lastR = t + 1; break; }
  }
  lastR = Math.max(lastR, 1);
  // the MTP head predicts the first response token from column P-2: keep it in the forward
  if (opts.mtp && P >= 2) first = Math.min(first, P - 2);
  const temperature = opts.temperature && opts.temperature > 0 ? opts.temperature : 1;
  return tf.tidy(() => {
    // Columns are cut on the host, and mask and positions go to the forward as host arrays:
    // it uses them on the host, and WebGPU cannot read a device tensor synchronously.
    const W = P + lastR - 1 - first;
    const cols = (t: TensorData) => int32Columns(t, first, W);
    const collected: tf.Tensor[] | undefined = opts.routerLoss ? [] : undefined;
    const chosen: tf.Tensor[] | undefined = opts.recordExperts ? [] : undefined;
    // routed_experts [B, L, S, K] read as rows of L*S*K values: the same columns as the tokens
    const SK = opts.replayExperts ? checkRoutedExperts(opts.replayExperts, model, B, L) : 0;
    const replay = opts.replayExperts ? int32Columns({ ...opts.replayExperts, shape: [B, L * SK] }, first * SK, W * SK) : undefined;
    const mtp = opts.mtp ? { nextIds: int32Columns(ids, first + 1, W), detachEncoder: opts.mtp.detachEncoder, hidden: [] as tf.Tensor[] } : undefined;
    const hidden = model.hiddenStates(tf.tensor2d(cols(ids), [B, W], "int32"), {
      attentionMask: cols(mask), positionIds: pos ? cols(pos) : undefined, routerLogits: collected, replayExperts: replay, routedExperts: chosen, mtp,
    });
    let mtpOut: ResponseLogProbs["mtp"];
    if (mtp) { // response j from column P+j-2 (a real token of the forward's columns), else no term
      const source = new Int32Array(B * R).fill(-1);
      for (let b = 0; b < B; b++) for (let j = 0; j < R; j++) {
        const c = P + j - 2;
        if (c >= first && mask.data[b * L + c] && mask.data[b * L + P + j]) source[b * R + j] = b * W + c - first;
      }
      mtpOut = mtpResponseTerms(model, mtp.hidden[0]!, source, int32Values(responses), B, R);
      tf.dispose(mtp.hidden);
    }
    const router = collected ? routerTerms(model, collected, cols(mask)) : undefined;
    const routedExperts = chosen ? widenRouted(model, chosen, B, W, first, L) : undefined;
    // the logits at column j predict token j+1: the responses are predicted from columns P-1 .. P+lastR-2
    const h = hidden.slice([0, P - 1 - first, 0], [B, lastR, -1]);
    const logits = model.lmHead(h);
    const labels = tf.tensor2d(int32Values(responses), [B, R], "int32").slice([0, 0], [B, lastR]);
    const pad = (t: tf.Tensor) => (lastR < R ? tf.concat([t, tf.zeros([B, R - lastR])], 1) : t) as tf.Tensor2D;
    return { ...placed(tokenTerms(logits, labels, temperature, opts), pad), ...(router ? { router } : {}), ...(routedExperts ? { routedExperts } : {}), ...(mtpOut ? { mtp: mtpOut } : {}) };
  });
}

/** The per-layer chosen experts [B*W, K] of a forward over columns [first, first+W) as routed_experts [B, L, S, K] (0 elsewhere); disposes them. */
function widenRouted(model: LlamaModel, chosen: tf.Tensor[], B: number, W: number, first: number, L: number): tf.Tensor4D {
  const [S, K] = routedExpertsShape(model);
  try {
    const r = tf.stack(chosen, 1).reshape([B, W, S, K]).toInt();
    const parts = [...(first > 0 ? [tf.zeros([B, first, S, K], "int32")] : []), r, ...(first + W < L ? [tf.zeros([B, L - first - W, S, K], "int32")] : [])];
    return (parts.length === 1 ? r : tf.concat(parts, 1)) as tf.Tensor4D;
  } finally {
    tf.dispose(chosen);
  }
}

/**
 * responseLogProbs over packed rows: the forward runs on the micro-batch's real
 * tokens only, and the vocabulary head only on the positions that predict a real
 * response token. Equal to the padded result on real slots (within float error).
 */
function packedResponseLogProbs(model: LlamaModel, micro: DataProto, opts: LogProbOptions): ResponseLogProbs {
  const ids = tdata(micro, "input_ids"), mask = tdata(micro, "attention_mask"), responses = tdata(micro, "responses");
  const [B, L] = ids.shape as [number, number], R = responses.shape[1]!;
  if (L - R < 1) throw new Error(`log-probs: input_ids [${ids.shape}] leaves no prompt before responses [${responses.shape}]`);
  const pk = packResponses(int32Values(ids), mask.data, B, L, R, micro.batch["position_ids"]?.data);
  const temperature = opts.temperature && opts.temperature > 0 ? opts.temperature : 1;
  const SK = opts.replayExperts ? checkRoutedExperts(opts.replayExperts, model, B, L) : 0;
  if (pk.source.length === 0) {
    const zeros = () => tf.zeros([B, R]) as tf.Tensor2D;
    const routed = opts.recordExperts ? { routedExperts: tf.zeros([B, L, ...routedExpertsShape(model)], "int32") as tf.Tensor4D } : {};
    const mtp = opts.mtp ? { mtp: { logProbs: zeros(), mask: zeros() } } : {};
    return { logProbs: zeros(), ...(opts.calculateEntropy ? { entropy: zeros() } : {}), ...(opts.calculateSumPiSquared ? { sumPiSquared: zeros() } : {}), ...routed, ...mtp };
  }
  return tf.tidy(() => {
    const N = pk.ids.length;
    const collected: tf.Tensor[] | undefined = opts.routerLoss ? [] : undefined;
    const chosen: tf.Tensor[] | undefined = opts.recordExperts ? [] : undefined;
    let replay: Int32Array | undefined;
    if (opts.replayExperts) { // the packed tokens' rows of routed_experts, in packed order
      const src = int32Values(opts.replayExperts);
      replay = new Int32Array(N * SK);
      pk.packedIndex.forEach((at, i) => { if (at >= 0) replay!.set(src.subarray(i * SK, (i + 1) * SK), at * SK); });
    }
    let mtp: (MtpInputs & { hidden: tf.Tensor[] }) | undefined;
    if (opts.mtp) { // the next token within the same sequence (0 after its last: that position is never a source)
      const nextIds = new Int32Array(N);
      for (let i = 0; i + 1 < B * L; i++) if (pk.packedIndex[i]! >= 0 && pk.packedIndex[i + 1]! >= 0 && (i + 1) % L !== 0) nextIds[pk.packedIndex[i]!] = pk.ids[pk.packedIndex[i + 1]!]!;
      mtp = { nextIds, detachEncoder: opts.mtp.detachEncoder, hidden: [] };
    }
    const hidden = model.hiddenStates(tf.tensor2d(pk.ids, [1, N], "int32"), { positionIds: pk.positions, segments: pk.lengths, routerLogits: collected, replayExperts: replay, routedExperts: chosen, mtp });
    let mtpOut: ResponseLogProbs["mtp"];
    if (mtp) {
      const P = L - R, source = new Int32Array(B * R).fill(-1);
      for (let b = 0; b < B; b++) for (let j = 0; j < R; j++) {
        const c = P + j - 2;
        if (c >= 0 && pk.packedIndex[b * L + P + j]! >= 0) source[b * R + j] = pk.packedIndex[b * L + c]!;
      }
      mtpOut = mtpResponseTerms(model, mtp.hidden[0]!, source, int32Values(responses), B, R);
      tf.dispose(mtp.hidden);
    }
    const router = collected ? routerTerms(model, collected) : undefined;
    let routedExperts: tf.Tensor4D | undefined;
    if (chosen) { // back to [B, L, S, K]: padding reads an appended row of zeros
      const [S, K] = routedExpertsShape(model);
      const packed = tf.concat([tf.stack(chosen, 1).reshape([N, S * K]).toInt(), tf.zeros([1, S * K], "int32")]);
      tf.dispose(chosen);
      routedExperts = tf.gather(packed, tf.tensor1d(Int32Array.from(pk.packedIndex, (at) => (at < 0 ? N : at)), "int32")).reshape([B, L, S, K]) as tf.Tensor4D;
    }
    const logits = model.lmHead(tf.gather(hidden.reshape([N, -1]), tf.tensor1d(pk.source, "int32")));
    const slots = tf.tensor1d(pk.slot, "int32");
    const unpack = (t: tf.Tensor) => tf.gather(tf.concat([t, tf.zeros([1])]), slots).reshape([B, R]) as tf.Tensor2D;
    return { ...placed(tokenTerms(logits, tf.tensor1d(pk.labels, "int32"), temperature, opts), unpack), ...(router ? { router } : {}), ...(routedExperts ? { routedExperts } : {}), ...(mtpOut ? { mtp: mtpOut } : {}) };
  });
}

export interface ComputeLogProbOptions extends LogProbOptions {
  /** Rows per forward (verl's log_prob_micro_batch_size_per_gpu). */
  microBatchSize: number;
}

/** No-grad response log-probs [B, R] (and entropy) in micro-batches, as plain TensorData. */
export async function computeLogProb(model: LlamaModel, data: DataProto, opts: ComputeLogProbOptions): Promise<{ logProbs: TensorData; entropy?: TensorData }> {
  if (!Number.isInteger(opts.microBatchSize) || opts.microBatchSize < 1) {
    throw new Error(`computeLogProb: microBatchSize must be a positive integer, got ${opts.microBatchSize}`);
  }
  const B = data.length, R = tdata(data, "responses").shape[1]!;
  const lp = new Float32Array(B * R), ent = opts.calculateEntropy ? new Float32Array(B * R) : undefined;
  const keys = ["input_ids", "attention_mask", "responses", ...(data.batch["position_ids"] ? ["position_ids"] : [])];
  const slim = data.select(keys, [], []);
  for (let b0 = 0; b0 < B; b0 += opts.microBatchSize) {
    const micro = slim.slice(b0, Math.min(B, b0 + opts.microBatchSize));
    const out = responseLogProbs(model, micro, opts);
    lp.set(await out.logProbs.data(), b0 * R);
    if (ent && out.entropy) ent.set(await out.entropy.data(), b0 * R);
    tf.dispose([out.logProbs, out.entropy]);
  }
  return { logProbs: tensor(lp, [B, R], "float32"), ...(ent ? { entropy: tensor(ent, [B, R], "float32") } : {}) };
}
