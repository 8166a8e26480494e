// Shared fixtures for the worker tests: a tiny Llama config, and a synthetic rollout
// batch in verl's layout (left-padded prompts, right-padded responses).
import * as tf from "@tensorflow/tfjs";
import { DataProto } from "../../src/protocol/index.js";
import { tensor } from "../../src/protocol/tensor.js";
import { makeConfig, type ModelConfig } from "../../src/models/config.js";
import { Rng } from "../../src/utils/rng.js";

export function tinyConfig(vocabSize = 32): ModelConfig {
  return makeConfig({ vocabSize, dim: 16, hiddenDim: 32, nLayers: 2, nHeads: 2, nKvHeads: 1, maxSeqLen: 64 });
}

/** B rows with prompts of width P (left-padded) and responses of width R (right-padded). */
export function syntheticBatch(B: number, P: number, R: number, vocab: number, seed: number): DataProto {
  const rng = new Rng(seed);
  const T = P + R;
  const inputIds = new Int32Array(B * T), attention = new Int32Array(B * T), position = new Int32Array(B * T);
  const responses = new Int32Array(B * R), responseMask = new Int32Array(B * R), prompts = new Int32Array(B * P);
  const advantages = new Float32Array(B * R);
  for (let b = 0; b < B; b++) {
    const pLen = 1 + rng.int(P), rLen = 1 + rng.int(R);
    let pos = 0;
    for (let j = 0; j < T; j++) {
      const inPrompt = j < P;
      const valid = inPrompt ? j >= P - pLen : j - P < rLen;
      const id = valid ? 1 + rng.int(vocab - 1) : 0;
      inputIds[b * T + j] = id;
      attention[b * T + j] = valid ? 1 : 0;
      position[b * T + j] = valid ? pos++ : 0;
      if (inPrompt) prompts[b * P + j] = id;
      else {
        responses[b * R + j - P] = id;
        responseMask[b * R + j - P] = valid ? 1 : 0;
      }
    }
    const a = rng.normal();
    for (let t = 0; t < R; t++) advantages[b * R + t] = responseMask[b * R + t] ? a : 0;
  }
  return DataProto.fromDict({
    prompts: tensor(prompts, [B, P], "int32"),
    responses: tensor(responses, [B, R], "int32"),
    response_mask: tensor(responseMask, [B, R], "int32"),
    input_ids: tensor(inputIds, [B, T], "int32"),
    attention_mask: tensor(attention, [B, T], "int32"),
    position_ids: tensor(position, [B, T], "int32"),
    advantages: tensor(advantages, [B, R], "float32"),
  }, {}, { temperature: 1.0 });
}

export function maxAbsDiff(a: ArrayLike<number>, b: ArrayLike<number>): number {
  let m = 0;
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i]! - b[i]!));
  return m;
}

/**
 * Runs `fn` with VERL_READ_EACH_MICRO_BATCH set to `each` and counts the async reads (`data()`)
 * it makes after it calls `startCounting` (the env and data() restored after).
 */
export async function countingReads<T>(each: boolean, fn: (startCounting: () => void) => Promise<T>): Promise<{ out: T; reads: number }> {
  const proto = Object.getPrototypeOf(tf.scalar(0)) as { data(): Promise<unknown> };
  const data0 = proto.data, prev = process.env.VERL_READ_EACH_MICRO_BATCH;
  process.env.VERL_READ_EACH_MICRO_BATCH = each ? "1" : "0";
  let reads = 0, counting = false;
  proto.data = function (this: tf.Tensor) { if (counting) reads++; return data0.call(this); };
  try {
    const out = await fn(() => { counting = true; });
    return { out, reads };
  } finally {
    proto.data = data0;
    if (prev === undefined) delete process.env.VERL_READ_EACH_MICRO_BATCH; else process.env.VERL_READ_EACH_MICRO_BATCH = prev;
  }
}
