// The llama_cpp engine's per-request server (agent loops) against the host batching server:
// concurrent greedy requests and a conversation's second turn give the same tokens and log-probs.
// Skips with the reason where node-llama-cpp's prebuilt CPU binary or stories260K is absent.
import { test } from "node:test";
import assert from "node:assert/strict";
import { tmpdir } from "node:os";
import { initBackend } from "../../src/engine/backend.js";
import { loadLlama2c } from "../../src/models/llama2c.js";
import { loadTokenizer } from "../../src/models/tokenizers/index.js";
import { ContinuousBatchingServer } from "../../src/agent_loop/batching_server.js";
import type { AsyncRolloutServer, TokenOutput } from "../../src/agent_loop/server.js";
import { LlamaCppRolloutEngine } from "../../src/rollout/llama_cpp/engine.js";
import { loadLlama } from "../../src/rollout/llama_cpp/binding.js";
import { Rng } from "../../src/utils/rng.js";
import { storiesBin, tok512Bin, STORIES_MISSING } from "../models/stories.js";

async function turns(server: AsyncRolloutServer, prompts: number[][]): Promise<TokenOutput[]> {
  const p = { temperature: 0, topP: 1, topK: -1, logprobs: true, maxTokens: 12 };
  await server.wakeUp?.();
  const first = await Promise.all(prompts.map((q, i) => server.generate(`r${i}`, q, p)));
  const second = await server.generate("r0", [...prompts[0]!, ...first[0]!.tokenIds, 403, 261], p);
  await server.sleep?.();
  return [...first, second];
}

test("llama_cpp request server: the host server's greedy tokens and log-probs, concurrent requests and a second turn", async (t) => {
  const bin = storiesBin(), tokPath = tok512Bin();
  if (!bin || !tokPath) return t.skip(STORIES_MISSING);
  try {
    await loadLlama("cpu");
  } catch (e) {
    return t.skip((e as Error).message);
  }
  await initBackend("cpu");
  const model = loadLlama2c(bin), tokenizer = await loadTokenizer(tokPath);
  const engine = new LlamaCppRolloutEngine({ weightType: "f32", kvCacheType: "f32", gpu: "cpu", ggufDir: tmpdir(), threads: 1, flashAttention: false, maxNumSeqs: 4 }, "server-test");
  try {
    const prompts = [[1, 403, 261, 378], [1, 378], [1, 261, 403, 407, 378, 261]];
    const ctx = { model, tokenizer, maxNumSeqs: 2, maxModelLen: 64, rng: new Rng(0) };
    const llama = await turns(engine.requestServer(ctx), prompts);
    const host = await turns(new ContinuousBatchingServer(model, { maxNumSeqs: 2, maxModelLen: 64, eosTokenIds: [...tokenizer.eosTokenIds], rng: new Rng(0) }), prompts);
    assert.deepEqual(llama.map((o) => o.tokenIds), host.map((o) => o.tokenIds));
    let d = 0;
    llama.forEach((o, i) => o.logProbs!.forEach((lp, j) => { d = Math.max(d, Math.abs(lp - host[i]!.logProbs![j]!)); }));
    assert.ok(d < 1e-3, `log-prob difference ${d}`);
  } finally {
    await engine.dispose();
    model.dispose();
  }
});
