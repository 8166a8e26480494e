// Speculative decoding with the MTP layer as the draft: greedy gives plain decoding's tokens and
// log-probs; sampling draws exactly plain decoding's distribution (a chi-square test against the
// distribution computed from the tfjs forward, on a 4-token vocabulary where drafts are often
// accepted and often rejected).
import { test } from "node:test";
import assert from "node:assert/strict";
import * as tf from "@tensorflow/tfjs";
import { initBackend } from "../../src/engine/backend.js";
import { fromHfConfig } from "../../src/models/config.js";
import { LlamaModel, toVariables } from "../../src/models/llama.js";
import { defaultSamplingParams, generate, leftPadPrompts } from "../../src/rollout/index.js";
import { generateSpeculative, type SpeculativeStats } from "../../src/rollout/speculative.js";
import { Rng } from "../../src/utils/rng.js";
import { mimoConfigJson, mimoWeights } from "../models/mimo_fixture.js";

function tinyMimo(vocab: number, seed: number): LlamaModel {
  const j = { ...mimoConfigJson(1), vocab_size: vocab };
  const t = new Map([...mimoWeights(j, seed)].map(([n, a]) => [n, tf.tensor(a.data, a.shape)]));
  try {
    return new LlamaModel(fromHfConfig(j), toVariables(t));
  } finally {
    tf.dispose([...t.values()]);
  }
}

for (const vocab of [320, 4]) {
  test(`speculative greedy decoding gives plain greedy decoding's tokens and log-probs (vocabulary ${vocab})`, async () => {
    await initBackend("cpu");
    const m = tinyMimo(vocab, 11);
    try {
      const prompts = leftPadPrompts([[1, 2, 3], [3, 1], [2], [0, 1, 2, 3, 1, 0]].map((p) => p.map((x) => x % vocab)), 0);
      const params = defaultSamplingParams({ temperature: 0, doSample: false, responseLength: 12, eosTokenIds: vocab > 4 ? [7] : [], padTokenId: 0, calculateLogProbs: true });
      const plain = generate(m, prompts, params, new Rng(1));
      const stats: SpeculativeStats = { drafted: 0, accepted: 0 };
      const spec = generateSpeculative(m, prompts, params, new Rng(1), { stats });
      for (const k of ["responses", "response_mask", "input_ids", "attention_mask", "position_ids"]) assert.deepEqual(spec.batch[k]!.data, plain.batch[k]!.data, k);
      const a = spec.batch["rollout_log_probs"]!.data, b = plain.batch["rollout_log_probs"]!.data;
      for (let i = 0; i < a.length; i++) assert.ok(Math.abs(Number(a[i]) - Number(b[i])) < 1e-4, `log-prob ${i}: ${a[i]} vs ${b[i]}`);
      assert.ok(stats.drafted > 0);
      if (vocab === 4) assert.ok(stats.accepted > 0 && stats.accepted < stats.drafted, `accepted ${stats.accepted} of ${stats.drafted}`);
    } finally {
      m.dispose();
    }
  });
}

test("speculative sampling draws plain decoding's distribution (chi-square over 3-token responses)", async () => {
  await initBackend("cpu");
  const V = 4, N = 6000, temperature = 0.8, prompt = [1, 2, 3];
  const m = tinyMimo(V, 5);
  try {
    const stats: SpeculativeStats = { drafted: 0, accepted: 0 };
    const params = defaultSamplingParams({ temperature, responseLength: 3, eosTokenIds: [], padTokenId: 0 });
    const out = generateSpeculative(m, leftPadPrompts(Array.from({ length: N }, () => prompt), 0), params, new Rng(2024), { stats });
    const counts = new Float64Array(V * V * V), r = out.batch["responses"]!.data;
    for (let i = 0; i < N; i++) counts[(Number(r[3 * i]) * V + Number(r[3 * i + 1])) * V + Number(r[3 * i + 2])]!++;
    // the exact distribution: softmax(logits / T) at each step of every 2-token prefix, from the tfjs forward
    const ids: number[][] = [];
    for (let y1 = 0; y1 < V; y1++) for (let y2 = 0; y2 < V; y2++) ids.push([...prompt, y1, y2]);
    const probs = tf.tidy(() => tf.softmax(tf.div(m.forward(tf.tensor2d(ids, [ids.length, 5], "int32")), temperature)).arraySync() as number[][][]);
    const expected = new Float64Array(V * V * V);
    for (let y1 = 0; y1 < V; y1++) for (let y2 = 0; y2 < V; y2++) for (let y3 = 0; y3 < V; y3++) {
      const row = probs[y1 * V + y2]!;
      expected[(y1 * V + y2) * V + y3] = N * row[2]![y1]! * row[3]![y2]! * row[4]![y3]!;
    }
    // cells expected below 5 pooled into one
    let chi = 0, cells = 0, poolE = 0, poolO = 0;
    expected.forEach((e, i) => {
      if (e < 5) { poolE += e; poolO += counts[i]!; return; }
      chi += (counts[i]! - e) ** 2 / e; cells++;
    });
    if (poolE > 0) { chi += (poolO - poolE) ** 2 / poolE; cells++; }
    const df = cells - 1, z = 3.09; // p = 0.001, Wilson-Hilferty
    const critical = df * (1 - 2 / (9 * df) + z * Math.sqrt(2 / (9 * df))) ** 3;
    assert.ok(chi < critical, `chi-square ${chi.toFixed(1)} over ${df} degrees of freedom (critical ${critical.toFixed(1)})`);
    assert.ok(stats.accepted > 0.1 * stats.drafted && stats.accepted < 0.95 * stats.drafted, `accepted ${stats.accepted} of ${stats.drafted}`);
  } finally {
    m.dispose();
  }
});
