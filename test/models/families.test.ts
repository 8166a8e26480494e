// Every model family against transformers 5's own numbers (committed fixtures): logits of the
// whole sequence and per-token log-probs within 1e-4 through the tfjs forward and through the
// host KV-cache decoder, and greedy decoding equal on 5 prompts x 32 tokens.
import { test } from "node:test";
import assert from "node:assert/strict";
import * as tf from "@tensorflow/tfjs";
import { initBackend } from "../../src/engine/backend.js";
import { loadHfModel } from "../../src/models/hf.js";
import { routerLoss } from "../../src/models/moe_loss.js";
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

test("qwen3_moe: router logits, aux loss and loss + coef * aux as transformers computes them; the aux loss trains the router", async () => {
  await initBackend("wasm");
  const ref = reference("qwen3_moe"), model = await loadHfModel(fixtureDir("qwen3_moe"));
  try {
    const seq = ref.moe_sequence!, ids = [...ref.prompts[seq]!, ...ref.greedy[seq]!], T = ids.length, moe = model.config.moe!;
    assert.deepEqual(moe.sparseLayers, [true, false, true], "mlp_only_layers [1]");
    const collected: tf.Tensor[] = [];
    const { loss, aux } = tf.tidy(() => {
      const logits = model.forward(tf.tensor2d(ids, [1, T], "int32"), { routerLogits: collected }).reshape([T, -1]);
      const lsm = tf.logSoftmax(logits.slice([0, 0], [T - 1, -1]));
      const ce = tf.neg(tf.mean(tf.sum(tf.mul(lsm, tf.oneHot(tf.tensor1d(ids.slice(1), "int32"), model.config.vocabSize)), -1)));
      const r = routerLoss(collected, moe.topK);
      return { loss: tf.add(ce, tf.mul(r.aux, moe.routerAuxLossCoef)).dataSync()[0]!, aux: r.aux.dataSync()[0]! };
    });
    assert.equal(collected.length, 2, "one router per sparse layer");
    collected.forEach((t, l) => {
      const d = maxDiff(t.dataSync(), ref.tensors.get(`router_logits_${l}`)!.data);
      assert.ok(d < TOL, `router_logits_${l} differ by ${d}`);
    });
    tf.dispose(collected);
    assert.equal(moe.routerAuxLossCoef, ref.router_aux_loss_coef);
    assert.ok(Math.abs(aux - ref.aux_loss!) < TOL, `aux loss ${aux} vs ${ref.aux_loss}`);
    assert.ok(Math.abs(loss - ref.loss_with_aux!) < TOL, `loss ${loss} vs ${ref.loss_with_aux}`);
    // the aux loss has a gradient into the routers (through the softmax over all experts)
    const gate = model.params.get("model.layers.0.mlp.gate.weight")!;
    const g = tf.tidy(() => {
      const { grads } = tf.variableGrads(() => {
        const c: tf.Tensor[] = [];
        model.hiddenStates(tf.tensor2d(ids, [1, T], "int32"), { routerLogits: c });
        const r = routerLoss(c, moe.topK).aux;
        tf.dispose(c);
        return r;
      }, [gate]);
      return tf.abs(grads[gate.name]!).max().dataSync()[0]!;
    });
    assert.ok(g > 0, "router gradient");
  } finally {
    model.dispose();
  }
});
