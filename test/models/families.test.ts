// Every model family against transformers 5's own numbers (committed fixtures): logits of the
// whole sequence and per-token log-probs within 1e-4 through the tfjs forward and through the
// host KV-cache decoder, and greedy decoding equal on 5 prompts x 32 tokens.
import { test } from "node:test";
import assert from "node:assert/strict";
import * as tf from "@tensorflow/tfjs";
import { initBackend } from "../../src/engine/backend.js";
import { loadHfModel } from "../../src/models/hf.js";
import type { LlamaModel } from "../../src/models/llama.js";
import { computeLogProb, defaultSamplingParams, generate, KvCacheDecoder, leftPadPrompts } from "../../src/rollout/index.js";
import { Rng } from "../../src/utils/rng.js";
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

for (const name of FAMILY_FIXTURES) {
  test(`${name}: the host KV-cache decoder gives transformers' logits, log-probs and greedy tokens`, async () => {
    await initBackend("wasm");
    const ref = reference(name), model = await loadHfModel(fixtureDir(name));
    try {
      const V = model.config.vocabSize, R = 32;
      // teacher-forced through the cache: prefill the prompt, then one step per reference token
      for (let i = 0; i < ref.prompts.length; i++) {
        const prompt = ref.prompts[i]!, P = prompt.length, greedy = ref.greedy[i]!, want = ref.tensors.get(`logits_${i}`)!.data;
        const dec = new KvCacheDecoder(model, 1, P + R);
        try {
          let logits = dec.prefill(Int32Array.from(prompt), Int32Array.from(prompt, (_, j) => j), new Int32Array(P).fill(1), P);
          for (let j = 0; j < R; j++) {
            const row = want.subarray((P - 1 + j) * V, (P + j) * V);
            assert.ok(maxDiff(logits, row) < TOL, `${name} prompt ${i} step ${j}: decoder logits differ by ${maxDiff(logits, row)}`);
            let arg = 0;
            for (let v = 1; v < V; v++) if (logits[v]! > logits[arg]!) arg = v;
            assert.equal(arg, greedy[j], `${name} prompt ${i} step ${j}: greedy token`);
            if (j + 1 < R) logits = dec.step(Int32Array.of(0), Int32Array.of(greedy[j]!), Int32Array.of(P + j), P + j);
          }
        } finally {
          dec.dispose();
        }
      }
      // the rollout path: 5 left-padded prompts in one batch, greedy, with log-probs
      const params = defaultSamplingParams({ temperature: 0, responseLength: R, eosTokenIds: [], padTokenId: 0, calculateLogProbs: true });
      const out = generate(model, leftPadPrompts(ref.prompts, 0), params, new Rng(0));
      const resp = out.batch["responses"]!.data, roll = out.batch["rollout_log_probs"]!.data;
      for (let i = 0; i < ref.prompts.length; i++) {
        assert.deepEqual(Array.from(resp.subarray(i * R, (i + 1) * R)), ref.greedy[i], `${name} prompt ${i}: batched greedy tokens`);
        const wantLp = ref.tensors.get(`logprobs_${i}`)!.data;
        assert.ok(maxDiff(roll.subarray(i * R, (i + 1) * R), wantLp) < TOL, `${name} prompt ${i}: rollout log-probs differ by ${maxDiff(roll.subarray(i * R, (i + 1) * R), wantLp)}`);
      }
      // and the training path's log-probs of the same left-padded batch
      const lp = await computeLogProb(model, out, { microBatchSize: 5, temperature: 0 });
      for (let i = 0; i < ref.prompts.length; i++) {
        const wantLp = ref.tensors.get(`logprobs_${i}`)!.data, got = lp.logProbs.data.subarray(i * R, (i + 1) * R);
        assert.ok(maxDiff(got, wantLp) < TOL, `${name} prompt ${i}: computeLogProb differs by ${maxDiff(got, wantLp)}`);
      }
    } finally {
      model.dispose();
    }
  });
}
