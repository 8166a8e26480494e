// Speculative decoding with the MTP layer as the draft against plain decoding, on a tiny random
// MiMo (2 trunk layers, hidden 32, 1 MTP layer): greedy, 8 rows x 64 tokens, median of 5 runs.
// Prints one JSON line per vocabulary size: wall ms of each and the draft acceptance rate.
// Random weights rarely agree across 320 tokens; over 4 they often do.
// Run: node dist/bench/mtp_speculative.js
import * as tf from "@tensorflow/tfjs";
import { initBackend } from "../src/engine/backend.js";
import { fromHfConfig } from "../src/models/config.js";
import { LlamaModel, parameterShapes, toVariables } from "../src/models/llama.js";
import { defaultSamplingParams, generate, leftPadPrompts } from "../src/rollout/index.js";
import { generateSpeculative } from "../src/rollout/speculative.js";
import { Rng } from "../src/utils/rng.js";

function tinyMimo(vocab: number): LlamaModel {
  const config = fromHfConfig({
    model_type: "mimo", architectures: ["MiMoForCausalLM"], vocab_size: vocab, hidden_size: 32, intermediate_size: 48, num_hidden_layers: 2,
    num_attention_heads: 4, num_key_value_heads: 2, num_nextn_predict_layers: 1, rms_norm_eps: 1e-6, rope_theta: 10000, tie_word_embeddings: false,
  });
  const rng = new Rng(11), t = new Map<string, tf.Tensor>();
  for (const [name, shape] of parameterShapes(config)) {
    const n = shape.reduce((a, b) => a * b, 1), z = Float32Array.from({ length: n }, () => rng.normal());
    t.set(name, tf.tensor(z.map((v) => (name.endsWith("norm.weight") ? 1 + 0.2 * v : name.endsWith(".bias") ? 0.1 * v : 0.15 * v)), shape));
  }
  try {
    return new LlamaModel(config, toVariables(t));
  } finally {
    tf.dispose([...t.values()]);
  }
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

await initBackend("cpu");
for (const vocab of [320, 4]) {
  const m = tinyMimo(vocab);
  const prompts = leftPadPrompts(Array.from({ length: 8 }, (_, i) => [1, 2, 3, i % vocab]), 0);
  const params = defaultSamplingParams({ temperature: 0, doSample: false, responseLength: 64, padTokenId: 0 });
  const stats = { drafted: 0, accepted: 0 };
  const time = (f: () => void) => {
    f();
    return median(Array.from({ length: 5 }, () => { const t0 = performance.now(); f(); return performance.now() - t0; }));
  };
  const plainMs = time(() => generate(m, prompts, params, new Rng(1)));
  const speculativeMs = time(() => generateSpeculative(m, prompts, params, new Rng(1), { stats }));
  console.log(JSON.stringify({ vocab, plainMs: Math.round(plainMs), speculativeMs: Math.round(speculativeMs), acceptance: Number((stats.accepted / stats.drafted).toFixed(3)) }));
  m.dispose();
}
