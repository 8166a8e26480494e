// Shared by the speculative-decoding tests: a tiny MiMo in memory, stories260K with a seeded MTP
// layer, and the chi-square test of 3-token responses against the trunk's own distribution.
import assert from "node:assert/strict";
import * as tf from "@tensorflow/tfjs";
import { fromHfConfig } from "../../src/models/config.js";
import { LlamaModel, toVariables } from "../../src/models/llama.js";
import { loadLlama2c } from "../../src/models/llama2c.js";
import { layerPrefix, parameterShapes } from "../../src/models/shapes.js";
import { Rng } from "../../src/utils/rng.js";
import { mimoConfigJson, mimoWeights } from "../models/mimo_fixture.js";

/** The MiMo fixture (one MTP layer) with vocabulary `vocab` and weights drawn from `seed`; `config` overrides its config.json keys (sizes). */
export function tinyMimo(vocab: number, seed: number, config: Record<string, unknown> = {}): LlamaModel {
  const j = { ...mimoConfigJson(1), vocab_size: vocab, ...config };
  const t = new Map([...mimoWeights(j, seed)].map(([n, a]) => [n, tf.tensor(a.data, a.shape)]));
  try {
    return new LlamaModel(fromHfConfig(j), toVariables(t));
  } finally {
    tf.dispose([...t.values()]);
  }
}

/**
 * stories260K (a llama2.c checkpoint, no MTP layer) as a MiMo with one MTP layer: the trunk as it
 * is; the MTP layer's decoder layer a copy of the trunk's last, unit norms but final_layernorm (the
 * trunk's final norm), a seeded random input_proj. Its drafts are often but not always the trunk's.
 */
export function storiesWithMtp(bin: string, seed: number): LlamaModel {
  const trunk = loadLlama2c(bin), c = trunk.config, config = { ...c, modelType: "mimo" as const, mtpLayers: 1 };
  const P = layerPrefix(config, c.nLayers), last = layerPrefix(c, c.nLayers - 1), rng = new Rng(seed);
  const params = new Map(trunk.params);
  for (const [name, shape] of parameterShapes(config)) {
    if (params.has(name)) continue;
    if (!name.startsWith(P)) throw new Error(`storiesWithMtp: unexpected parameter ${name}`);
    const rest = name.slice(P.length), n = shape.reduce((a, b) => a * b, 1);
    const init = rest === "final_layernorm.weight" ? tf.clone(trunk.p("model.norm.weight"))
      : rest.endsWith("_layernorm.weight") && !trunk.params.has(last + rest) ? tf.ones(shape)
      : rest === "input_proj.weight" ? tf.tensor(Float32Array.from({ length: n }, () => rng.normal() / Math.sqrt(shape[1]!)), shape)
      : tf.clone(trunk.p(last + rest));
    params.set(name, tf.variable(init, true));
    init.dispose();
  }
  return new LlamaModel(config, params);
}

/** 32 prompts of 8 to 64 stories260K tokens (BOS first), the same for a seed. */
export function storiesPrompts(seed: number): number[][] {
  const rng = new Rng(seed);
  return Array.from({ length: 32 }, () => [1, ...Array.from({ length: 7 + rng.int(57) }, () => 3 + rng.int(509))]);
}

/** FNV-1a (32 bits) over int32 words: a run's tokens, then its log-probs' float32 bits. */
export function fingerprint(tokens: ArrayLike<number>, logProbs: Float32Array): string {
  let h = 0x811c9dc5;
  for (const w of [...Array.from(tokens), ...new Int32Array(logProbs.buffer, logProbs.byteOffset, logProbs.length)]) {
    for (let b = 0; b < 32; b += 8) h = Math.imul(h ^ ((w >>> b) & 0xff), 0x01000193);
  }
  return (h >>> 0).toString(16).padStart(8, "0");
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
