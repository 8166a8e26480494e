// Shared by the speculative-decoding tests: a tiny MiMo in memory, and the chi-square test of
// 3-token responses against the trunk's own distribution.
import assert from "node:assert/strict";
import * as tf from "@tensorflow/tfjs";
import { fromHfConfig } from "../../src/models/config.js";
import { LlamaModel, toVariables } from "../../src/models/llama.js";
import { mimoConfigJson, mimoWeights } from "../models/mimo_fixture.js";

/** The MiMo fixture (one MTP layer) with vocabulary `vocab` and weights drawn from `seed`. */
export function tinyMimo(vocab: number, seed: number): LlamaModel {
  const j = { ...mimoConfigJson(1), vocab_size: vocab };
  const t = new Map([...mimoWeights(j, seed)].map(([n, a]) => [n, tf.tensor(a.data, a.shape)]));
  try {
    return new LlamaModel(fromHfConfig(j), toVariables(t));
  } finally {
    tf.dispose([...t.values()]);
  }
}

/**
 * Asserts that 3-token responses to `prompt` follow plain sampling at `temperature`: the exact
 * distribution is softmax(logits / T) at each step of every 2-token prefix, from the tfjs forward;
 * cells expected below 5 are pooled into one; the critical value is p = 0.001 (Wilson-Hilferty).
 */
export function assertThreeTokenDistribution(m: LlamaModel, prompt: number[], temperature: number, responses: ArrayLike<number>[]): void {
  const V = m.config.vocabSize, N = responses.length, counts = new Float64Array(V * V * V);
  for (const r of responses) counts[(r[0]! * V + r[1]!) * V + r[2]!]!++;
  const ids: number[][] = [];
  for (let y1 = 0; y1 < V; y1++) for (let y2 = 0; y2 < V; y2++) ids.push([...prompt, y1, y2]);
  const T = prompt.length + 2, probs = tf.tidy(() => tf.softmax(tf.div(m.forward(tf.tensor2d(ids, [ids.length, T], "int32")), temperature)).arraySync() as number[][][]);
  const at = prompt.length - 1;
  let chi = 0, cells = 0, poolE = 0, poolO = 0;
  for (let y1 = 0; y1 < V; y1++) for (let y2 = 0; y2 < V; y2++) for (let y3 = 0; y3 < V; y3++) {
    const row = probs[y1 * V + y2]!, e = N * row[at]![y1]! * row[at + 1]![y2]! * row[at + 2]![y3]!, o = counts[(y1 * V + y2) * V + y3]!;
    if (e < 5) { poolE += e; poolO += o; continue; }
    chi += (o - e) ** 2 / e; cells++;
  }
  if (poolE > 0) { chi += (poolO - poolE) ** 2 / poolE; cells++; }
  const df = cells - 1, z = 3.09;
  const critical = df * (1 - 2 / (9 * df) + z * Math.sqrt(2 / (9 * df))) ** 3;
  assert.ok(chi < critical, `chi-square ${chi.toFixed(1)} over ${df} degrees of freedom (critical ${critical.toFixed(1)})`);
}
