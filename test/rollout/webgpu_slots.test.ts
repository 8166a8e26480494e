// The WebGPU decoder's per-request entry point (WebGpuSlotDecoder) behind the continuous-batching
// server of agent loops, against the host decoder's server: same greedy tokens and log-probs for
// staggered requests of different lengths, and a conversation's cache reused at its next turn.
// Runs where a WebGPU adapter exists (the H200, or Dawn's OpenGL backend on llvmpipe here:
// docs/gpu.md, "Testing WebGPU code without a GPU"); skips with the reason elsewhere.
import { test } from "node:test";
import assert from "node:assert/strict";
import * as tf from "@tensorflow/tfjs";
import { initBackend } from "../../src/engine/backend.js";
import { initModel, makeConfig, type LlamaModel } from "../../src/models/index.js";
import { ContinuousBatchingServer } from "../../src/agent_loop/batching_server.js";
import type { TokenOutput } from "../../src/agent_loop/server.js";
import { webGpuSlotDecoder, WebGpuSlotDecoder } from "../../src/rollout/webgpu_decoder.js";
import { Rng } from "../../src/utils/rng.js";

let reason: string | undefined;
async function webgpu(): Promise<boolean> {
  if (reason !== undefined) return reason === "";
  try {
    await initBackend("webgpu");
    reason = "";
  } catch (e) {
    reason = `no WebGPU adapter here (${(e as Error).message.split("\n")[0]})`;
  }
  return reason === "";
}

const greedy = { temperature: 0, topP: 1, topK: -1, logprobs: true };

function randomModel(): LlamaModel {
  const m = initModel(makeConfig({ vocabSize: 48, dim: 32, hiddenDim: 48, nLayers: 2, nHeads: 4, nKvHeads: 2, maxSeqLen: 96, attentionBias: true, tieWordEmbeddings: false }), new Rng(3));
  tf.tidy(() => { for (const v of m.params.values()) if (!v.name.includes("norm")) v.assign(v.mul(15)); });
  return m;
}

/** Staggered requests (each joins a few steps after the previous), then a second turn of the last one. */
async function conversation(server: ContinuousBatchingServer, prompts: number[][]): Promise<TokenOutput[]> {
  const outs = await Promise.all(prompts.map(async (p, i) => {
    for (let k = 0; k < i; k++) await new Promise((r) => setImmediate(r));
    return server.generate(`r${i}`, p, { ...greedy, maxTokens: 16 });
  }));
  const last = prompts.length - 1;
  const turn2 = [...prompts[last]!, ...outs[last]!.tokenIds, 7, 8, 9];
  outs.push(await server.generate(`r${last}`, turn2, { ...greedy, maxTokens: 16 }));
  return outs;
}

test("off the WebGPU backend the slot decoder says which backend it needs", async () => {
  await initBackend("cpu");
  const m = randomModel();
  try {
    assert.throws(() => new WebGpuSlotDecoder(m, 2, 32), /rollout engine 'webgpu' decodes on the WebGPU backend \(trainer\.device=webgpu\); this thread's backend is 'cpu'/);
  } finally {
    m.dispose();
  }
});

test("the batching server on WebGPU slots gives the host server's greedy tokens and log-probs, and reuses a turn's cache", async (t) => {
  if (!(await webgpu())) return t.skip(reason);
  const model = randomModel();
  try {
    const rng = new Rng(5);
    const prompts = Array.from({ length: 5 }, (_, i) => Array.from({ length: 3 + 4 * i }, () => 3 + rng.int(45)));
    const opts = { maxNumSeqs: 3, maxModelLen: 96, eosTokenIds: [2], rng: new Rng(0) };
    const gpuServer = new ContinuousBatchingServer(model, { ...opts, decoder: webGpuSlotDecoder, prefillChunk: 5 });
    const gpu = await conversation(gpuServer, prompts);
    const st = gpuServer.stats();
    await gpuServer.sleep();
    const hostServer = new ContinuousBatchingServer(model, opts);
    await hostServer.wakeUp();
    const host = await conversation(hostServer, prompts);
    await hostServer.sleep();
    assert.deepEqual(gpu.map((o) => o.tokenIds), host.map((o) => o.tokenIds));
    let d = 0;
    gpu.forEach((o, i) => o.logProbs!.forEach((lp, j) => { d = Math.max(d, Math.abs(lp - host[i]!.logProbs![j]!)); }));
    assert.ok(d < 1e-3, `log-prob disagreement ${d}`);
    assert.ok(st.maxBatch > 1, `requests shared decode steps (max batch ${st.maxBatch})`);
    assert.ok(st.reusedTokens >= prompts.at(-1)!.length, `the second turn reused the first turn's cache (${st.reusedTokens} tokens)`);
  } finally {
    model.dispose();
  }
});
