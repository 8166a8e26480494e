// Batched autoregressive generation in verl's layout: left-padded prompts in,
// prompts / responses / response_mask / input_ids / attention_mask /
// position_ids (+ rollout_log_probs) out, as a DataProto.
import { sparseLayerCount } from "../models/config.js";
import { DataProto } from "../protocol/data_proto.js";
import { int32Values, tensor, type TensorData } from "../protocol/tensor.js";
import type { LlamaModel } from "../models/llama.js";
import type { Rng } from "../utils/rng.js";
import { heartbeat } from "../single_controller/heartbeat.js";
import { FullForwardDecoder, KvCacheDecoder, type StepDecoder } from "./decoder.js";
import { TokenSampler, checkSamplingParams, type SamplingParams } from "./sampling.js";

export interface GenerateOptions {
  /** "kv-cache" (default): the fast engine; "no-cache": recompute the prefix with the tfjs forward each step (reference). */
  engine?: "kv-cache" | "no-cache";
  /** Bound on the KV cache; larger batches are generated in sub-batches (default 512 MiB). */
  maxCacheBytes?: number;
  /** Called after each decoding step (`step` of `responseLength`), synchronously: a progress line can advance. */
  onStep?: (step: number, responseLength: number) => void;
  /**
   * MoE: record the experts each token was routed to (verl's rollout routing replay) as
   * routed_experts [B, P+R, sparseLayers, topK], 0 on padding and on the last response token
   * (never forwarded). The KV-cache engine only.
   */
  recordRouting?: boolean;
}

function int32(t: TensorData | undefined, key: string): Int32Array {
  if (!t) throw new Error(`generate: the batch has no '${key}'`);
  if (t.shape.length !== 2) throw new Error(`generate: '${key}' must be 2-D [batch, prompt_length], got [${t.shape}]`);
  return int32Values(t);
}

/**
 * Generate up to `params.responseLength` tokens for each prompt row of `batch`
 * (input_ids, attention_mask, position_ids; prompts left-padded). With
 * `params.n > 1` every row is repeated n times (interleaved) first. Non-tensor
 * fields and meta info are carried through.
 */
export function generate(model: LlamaModel, batch: DataProto, params: SamplingParams, rng: Rng, opts: GenerateOptions = {}): DataProto {
  const { data, ids, mask, pos, B, P } = promptRows(batch, params, model.config.vocabSize);
  const R = params.responseLength, V = model.config.vocabSize;

  const c = model.config;
  const bytesPerRow = 2 * c.nLayers * c.nKvHeads * c.headDim * (P + R) * 4;
  const sub = Math.max(1, Math.min(B, Math.floor((opts.maxCacheBytes ?? 512 * 2 ** 20) / bytesPerRow)));
  const responses = new Int32Array(B * R).fill(params.padTokenId);
  const responseMask = new Int32Array(B * R);
  const logProbs = new Float32Array(B * R);
  const eos = new Set(params.ignoreEos ? [] : params.eosTokenIds);
  const sampler = new TokenSampler(V, params);
  if (opts.recordRouting && opts.engine === "no-cache") throw new Error("generate: recordRouting needs the kv-cache engine");
  const SK = sparseLayerCount(c) * (c.moe?.topK ?? 0);
  if (opts.recordRouting && !c.moe) throw new Error("generate: recordRouting: the model has no routed experts (rollout routing replay needs a MoE model such as qwen3_moe)");
  const routed = opts.recordRouting ? new Int32Array(B * (P + R) * SK) : undefined;

  for (let b0 = 0; b0 < B; b0 += sub) {
    const nb = Math.min(sub, B - b0), rowsOf = (a: Int32Array) => a.subarray(b0 * P, (b0 + nb) * P);
    const kv = opts.engine === "no-cache" ? undefined : new KvCacheDecoder(model, nb, P + R);
    const dec: StepDecoder = kv ?? new FullForwardDecoder(model, nb, P + R);
    const record = routed ? kv!.recordRouting() : undefined;
    try {
      let logits = dec.prefill(rowsOf(ids), rowsOf(pos), rowsOf(mask), P);
      let active = Int32Array.from({ length: nb }, (_, i) => i);
      for (let t = 0; t < R; t++) {
        heartbeat();
        const next: number[] = [], tokens: number[] = [];
        for (let i = 0; i < active.length; i++) {
          const b = active[i]!, row = (b0 + b) * R + t;
          const { token, logProb } = sampler.sample(logits, i * V, rng);
          responses[row] = token;
          responseMask[row] = 1;
          logProbs[row] = logProb;
          if (!eos.has(token)) { next.push(b); tokens.push(token); }
        }
        opts.onStep?.(t + 1, R);
        if (t === R - 1 || next.length === 0) break;
        active = Int32Array.from(next);
        const positions = Int32Array.from(active, (b) => pos[(b0 + b) * P + P - 1]! + 1 + t);
        logits = dec.step(active, Int32Array.from(tokens), positions, P + t);
      }
    } finally {
      dec.dispose();
    }
    if (record) { // the decoder's rows are this sub-batch's; prompt padding was computed but is not a token
      routed!.set(record, b0 * (P + R) * SK);
      for (let b = 0; b < nb; b++) for (let s = 0; s < P; s++) if (mask[(b0 + b) * P + s] === 0) routed!.fill(0, ((b0 + b) * (P + R) + s) * SK, ((b0 + b) * (P + R) + s + 1) * SK);
    }
  }
  const out = assembleRollout(data, { ids, mask, pos, B, P, R, responses, responseMask, logProbs: params.calculateLogProbs ? logProbs : undefined });
  if (routed) out.batch.routed_experts = tensor(routed, [B, P + R, sparseLayerCount(c), c.moe!.topK], "int32");
  return out;
}

/** The prompt rows of a generation batch (each repeated n times first), checked against the vocabulary, and the sampling parameters checked: every engine starts here. */
export function promptRows(batch: DataProto, params: SamplingParams, vocabSize: number): { data: DataProto; ids: Int32Array; mask: Int32Array; pos: Int32Array; B: number; P: number } {
  checkSamplingParams(params);
  const data = (params.n ?? 1) > 1 ? batch.repeat(params.n!, true) : batch;
  const ids = int32(data.batch["input_ids"], "input_ids");
  const [B, P] = data.batch["input_ids"]!.shape as [number, number];
  const mask = int32(data.batch["attention_mask"], "attention_mask");
  const pos = data.batch["position_ids"] ? int32(data.batch["position_ids"], "position_ids") : positionsOf(mask, B, P);
  if (mask.length !== B * P || pos.length !== B * P) throw new Error(`generate: attention_mask and position_ids must match input_ids [${B}, ${P}]`);
  for (const id of ids) if (id < 0 || id >= vocabSize) throw new Error(`generate: input_ids holds token id ${id}, outside the model's vocabulary [0, ${vocabSize})`);
  return { data, ids, mask, pos, B, P };
}


/** verl's positions for a left-padded prompt: cumsum(mask) - 1, clipped at 0. */
function positionsOf(mask: Int32Array, B: number, P: number): Int32Array {
  const pos = new Int32Array(B * P);
  for (let b = 0; b < B; b++) {
    let c = 0;
    for (let s = 0; s < P; s++) { c += mask[b * P + s]!; pos[b * P + s] = Math.max(c - 1, 0); }
  }
  return pos;
}

export interface GeneratedRows {
  ids: Int32Array; mask: Int32Array; pos: Int32Array; B: number; P: number; R: number;
  responses: Int32Array; responseMask: Int32Array; logProbs?: Float32Array;
}

/** verl's rollout output (prompts, responses, response_mask, input_ids, attention_mask, position_ids, rollout_log_probs) from generated rows. */
export function assembleRollout(data: DataProto, g: GeneratedRows): DataProto {
  const { B, P, R } = g, L = P + R;
  const inputIds = new Int32Array(B * L), attn = new Int32Array(B * L), position = new Int32Array(B * L);
  for (let b = 0; b < B; b++) {
    inputIds.set(g.ids.subarray(b * P, b * P + P), b * L);
    inputIds.set(g.responses.subarray(b * R, b * R + R), b * L + P);
    attn.set(g.mask.subarray(b * P, b * P + P), b * L);
    attn.set(g.responseMask.subarray(b * R, b * R + R), b * L + P);
    position.set(g.pos.subarray(b * P, b * P + P), b * L);
    // verl continues positions through the response slots, padded or not
    const last = g.pos[b * P + P - 1]!;
    for (let t = 0; t < R; t++) position[b * L + P + t] = last + 1 + t;
  }
  const batch: Record<string, TensorData> = {
    prompts: tensor(g.ids.slice(), [B, P], "int32"),
    responses: tensor(g.responses, [B, R], "int32"),
    response_mask: tensor(g.responseMask, [B, R], "int32"),
    input_ids: tensor(inputIds, [B, L], "int32"),
    attention_mask: tensor(attn, [B, L], "int32"),
    position_ids: tensor(position, [B, L], "int32"),
  };
  if (g.logProbs) batch["rollout_log_probs"] = tensor(g.logProbs, [B, R], "float32");
  return new DataProto(batch, { ...data.nonTensorBatch }, { ...data.metaInfo });
}
