// Speculative decoding with the MTP layer as the draft against plain decoding, on a tiny random
// MiMo (2 trunk layers, hidden 32, 1 MTP layer), greedy, median of 5 runs, 1 and 3 drafts a step:
//   single-turn: generate vs generateSpeculative, 8 rows x 64 tokens;
//   agent loops: the continuous-batching server with and without the draft, 8 conversations of
//   2 turns (a 3-token tool reply between) x 32 tokens, 8 slots.
// Prints one JSON line per path and vocabulary size: wall ms (and tokens/s) of each and the draft
// acceptance rate. Random weights rarely agree across 320 tokens; over 4 they often do.
// Run: node dist/bench/mtp_speculative.js
import * as tf from "@tensorflow/tfjs";
import { initBackend } from "../src/engine/backend.js";
import { fromHfConfig } from "../src/models/config.js";
import { LlamaModel, parameterShapes, toVariables } from "../src/models/llama.js";
import { ContinuousBatchingServer } from "../src/agent_loop/batching_server.js";
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

/** 8 two-turn conversations on a fresh server; returns the tokens generated. */
async function conversations(m: LlamaModel, mtpDraft?: { drafted: number; accepted: number }, mtpDraftTokens = 1): Promise<number> {
  const server = new ContinuousBatchingServer(m, { maxNumSeqs: 8, maxModelLen: 96, eosTokenIds: [], rng: new Rng(0), ...(mtpDraft ? { mtpDraft, mtpDraftTokens } : {}) });
  const V = m.config.vocabSize;
  const counts = await Promise.all(Array.from({ length: 8 }, async (_, c) => {
    let prompt = [1, 2, 3, c % V], n = 0;
    for (let turn = 0; turn < 2; turn++) {
      const o = await server.generate(`c${c}`, prompt, { temperature: 0, topP: 1, topK: -1, maxTokens: 32 });
      n += o.tokenIds.length;
      prompt = [...prompt, ...o.tokenIds, 3 % V, 1, 2 % V];
    }
    return n;
  }));
  await server.sleep();
  return counts.reduce((a, b) => a + b, 0);
}

await initBackend(process.argv.includes("--cpu") ? "cpu" : "wasm");
for (const vocab of [320, 4]) {
  const m = tinyMimo(vocab);
  const prompts = leftPadPrompts(Array.from({ length: 8 }, (_, i) => [1, 2, 3, i % vocab]), 0);
  const params = defaultSamplingParams({ temperature: 0, doSample: false, responseLength: 64, padTokenId: 0 });
  const time = (f: () => void) => {
    f();
    return median(Array.from({ length: 5 }, () => { const t0 = performance.now(); f(); return performance.now() - t0; }));
  };
  const timeAsync = async (f: () => Promise<number>) => {
    await f();
    const runs: { ms: number; tokens: number }[] = [];
    for (let i = 0; i < 5; i++) { const t0 = performance.now(); const tokens = await f(); runs.push({ ms: performance.now() - t0, tokens }); }
    const ms = median(runs.map((r) => r.ms));
    return { ms: Math.round(ms), tokensPerS: Math.round((runs[0]!.tokens / ms) * 1000) };
  };
  const plainMs = time(() => generate(m, prompts, params, new Rng(1)));
  const plain = await timeAsync(() => conversations(m));
  const rate = (s: { drafted: number; accepted: number }) => Number((s.accepted / s.drafted).toFixed(3));
  for (const draftTokens of [1, 3]) {
    const stats = { drafted: 0, accepted: 0 };
    const speculativeMs = time(() => generateSpeculative(m, prompts, params, new Rng(1), { stats, draftTokens }));
    console.log(JSON.stringify({ path: "single-turn", vocab, draftTokens, plainMs: Math.round(plainMs), speculativeMs: Math.round(speculativeMs), acceptance: rate(stats) }));
    const serverStats = { drafted: 0, accepted: 0 };
    const spec = await timeAsync(() => conversations(m, serverStats, draftTokens));
    console.log(JSON.stringify({ path: "agent-loop server", vocab, draftTokens, plainMs: plain.ms, plainTokensPerS: plain.tokensPerS, speculativeMs: spec.ms, speculativeTokensPerS: spec.tokensPerS, acceptance: rate(serverStats) }));
  }
  m.dispose();
}
