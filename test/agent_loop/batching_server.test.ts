// The continuous-batching server on a real LlamaModel: greedy output equals
// src/rollout's generate, requests at different positions share decode steps,
// parked caches are reused across turns without changing results, and agent
// loops run concurrently against it.
import { test } from "node:test";
import assert from "node:assert/strict";
import * as tf from "@tensorflow/tfjs";
import { initBackend } from "../../src/engine/backend.js";
import { initModel, loadLlama2c, makeConfig, type LlamaModel } from "../../src/models/index.js";
import { Llama2cTokenizer } from "../../src/models/tokenizers/index.js";
import { defaultSamplingParams, generate, leftPadPrompts } from "../../src/rollout/index.js";
import { ContinuousBatchingServer } from "../../src/agent_loop/batching_server.js";
import { AgentLoopManager } from "../../src/agent_loop/manager.js";
import { DataProto } from "../../src/protocol/data_proto.js";
import { Rng } from "../../src/utils/rng.js";
import { sharedPath } from "../../src/utils/paths.js";
import { testConfig } from "./helpers.js";

const STORIES_MISSING = "../shared/models/stories260K absent";
const greedy = { temperature: 0, topP: 1, topK: -1 };

/** A random model whose weights are large enough for decisive greedy choices. */
function randomModel(): LlamaModel {
  const m = initModel(makeConfig({ vocabSize: 48, dim: 32, hiddenDim: 48, nLayers: 2, nHeads: 4, nKvHeads: 2, maxSeqLen: 96, attentionBias: true, tieWordEmbeddings: false }), new Rng(3));
  tf.tidy(() => { for (const v of m.params.values()) if (!v.name.includes("norm")) v.assign(v.mul(15)); });
  return m;
}

/** generate()'s greedy responses, cut after the first EOS. */
function referenceGreedy(model: LlamaModel, prompts: number[][], R: number, eos: number): number[][] {
  const out = generate(model, leftPadPrompts(prompts, 0), defaultSamplingParams({ temperature: 0, responseLength: R, eosTokenIds: [eos], padTokenId: 0 }), new Rng(0));
  const resp = out.batch.responses!, mask = out.batch.response_mask!;
  return prompts.map((_, b) => Array.from(resp.data.subarray(b * R, (b + 1) * R)).filter((_, j) => mask.data[b * R + j] === 1));
}

for (const kernels of ["auto", "js"] as const) {
  test(`greedy output equals rollout generate for concurrent prompts of different lengths (${kernels} kernels)`, async () => {
    await initBackend("wasm");
    const model = randomModel();
    try {
      const rng = new Rng(5);
      const prompts = Array.from({ length: 7 }, (_, i) => Array.from({ length: 3 + 5 * i }, () => 3 + rng.int(45)));
      const R = 24;
      const expected = referenceGreedy(model, prompts, R, 2);
      const server = new ContinuousBatchingServer(model, { maxNumSeqs: 4, maxModelLen: 96, eosTokenIds: [2], rng: new Rng(0), kernels });
      // Staggered arrivals: requests join while others are mid-decode.
      const outs = await Promise.all(prompts.map(async (p, i) => {
        for (let k = 0; k < i; k++) await new Promise((r) => setImmediate(r));
        return server.generate(`r${i}`, p, { ...greedy, maxTokens: R });
      }));
      assert.deepEqual(outs.map((o) => o.tokenIds), expected);
      const st = server.stats();
      assert.ok(st.maxBatch > 1 && st.maxBatch <= 4, `batched decode steps (max batch ${st.maxBatch})`);
      assert.ok(st.decodeSteps < st.decodeTokens, "decode steps shared between requests");
      await server.sleep();
    } finally {
      model.dispose();
    }
  });
}

test("a parked cache is reused by the next turn and changes nothing", async () => {
  await initBackend("wasm");
  const model = randomModel();
  try {
    const server = new ContinuousBatchingServer(model, { maxNumSeqs: 2, maxModelLen: 96, eosTokenIds: [], rng: new Rng(0) });
    const prompt = [5, 6, 7, 8, 9, 10];
    const t1 = await server.generate("conv", prompt, { ...greedy, maxTokens: 8, logprobs: true });
    const turn2 = [...prompt, ...t1.tokenIds, 11, 12, 13];
    const t2 = await server.generate("conv", turn2, { ...greedy, maxTokens: 8, logprobs: true });
    assert.equal(server.stats().reusedTokens, prompt.length + t1.tokenIds.length - 1, "everything but the last sampled token was cached");
    const fresh = new ContinuousBatchingServer(model, { maxNumSeqs: 2, maxModelLen: 96, eosTokenIds: [], rng: new Rng(0) });
    const f2 = await fresh.generate("other", turn2, { ...greedy, maxTokens: 8, logprobs: true });
    assert.deepEqual(t2.tokenIds, f2.tokenIds);
    t2.logProbs!.forEach((lp, i) => assert.ok(Math.abs(lp - f2.logProbs![i]!) < 1e-5));
    assert.equal(fresh.stats().reusedTokens, 0);
    // A custom stop id ends the request and is returned.
    const stopAt = f2.tokenIds[3]!;
    const stopped = await fresh.generate("stop", turn2, { ...greedy, maxTokens: 8, stopTokenIds: [stopAt] });
    assert.equal(stopped.finishReason, "stop");
    assert.deepEqual(stopped.tokenIds, f2.tokenIds.slice(0, f2.tokenIds.indexOf(stopAt) + 1));
    // Limits: the context bound clamps maxTokens; bad prompts are clear errors.
    const long = await server.generate("x", Array.from({ length: 90 }, () => 4), { ...greedy, maxTokens: 50 });
    assert.equal(long.tokenIds.length, 6);
    assert.equal(long.finishReason, "length");
    await assert.rejects(server.generate("y", Array(96).fill(4), greedy), /leaves no room under the model length 96/);
    await assert.rejects(server.generate("y", [4, 99], greedy), /token id 99 outside the vocabulary/);
    await assert.rejects(server.generate("y", [4], { ...greedy, topP: 0 }), /top_p must be in/);
    // sleep() drops the engine; the next request rebuilds it from the (possibly updated) weights.
    await server.sleep();
    await server.generate("z", [4, 5], { ...greedy, maxTokens: 2 });
    assert.equal(server.stats().enginesBuilt, 2);
  } finally {
    model.dispose();
  }
});

test("sampling is seeded per request: the same seed and arrival order give the same tokens", async () => {
  await initBackend("wasm");
  const model = randomModel();
  try {
    const run = async (seed: number) => {
      const server = new ContinuousBatchingServer(model, { maxNumSeqs: 3, maxModelLen: 96, eosTokenIds: [2], rng: new Rng(seed) });
      return Promise.all([0, 1, 2, 3].map((i) => server.generate(`s${i}`, [5 + i, 6, 7], { temperature: 1, topP: 0.9, topK: 20, maxTokens: 12 })));
    };
    const a = await run(1), b = await run(1), c = await run(2);
    assert.deepEqual(a.map((o) => o.tokenIds), b.map((o) => o.tokenIds));
    assert.notDeepEqual(a.map((o) => o.tokenIds), c.map((o) => o.tokenIds));
  } finally {
    model.dispose();
  }
});

test("stories260K: agent loops run concurrently on the batching server and match generate", async (t) => {
  const bin = sharedPath("models", "stories260K", "stories260K.bin");
  const tokPath = sharedPath("models", "stories260K", "tok512.bin");
  if (!bin || !tokPath) return t.skip(STORIES_MISSING);
  await initBackend("wasm");
  const model = loadLlama2c(bin);
  try {
    // A template with no markup: the prompt text is the user's words, BOS-less as the loop encodes it.
    const tok = Llama2cTokenizer.fromFile(tokPath, "{% for m in messages %}{{ m.content }}{% endfor %}");
    const stories = ["Once upon a time", "The cat", "Lily and Tom went to the park", "One day, a little bird", "Tim had a red ball", "The sun was"];
    const rows = stories.flatMap((s) => [s, s]).map((s) => ({ raw_prompt: [{ role: "user", content: s }] }));
    const R = 40;
    const config = testConfig({ promptLength: 32, responseLength: R, agent: { max_concurrent_loops: 8 }, rollout: { max_num_seqs: 8 } });
    const server = new ContinuousBatchingServer(model, { maxNumSeqs: 8, maxModelLen: 32 + R, eosTokenIds: tok.eosTokenIds, rng: new Rng(0) });
    const manager = new AgentLoopManager({ config, tokenizer: tok, server });
    const batch = DataProto.fromDict({}, { raw_prompt: rows.map((r) => r.raw_prompt) }, { validate: true });
    const out = await manager.generateSequences(batch);
    const st = server.stats();
    assert.ok(st.maxBatch >= 6, `loops shared decode steps (max batch ${st.maxBatch})`);
    const prompts = stories.flatMap((s) => [s, s]).map((s) => tok.encode(s, { addSpecialTokens: false }));
    const expected = referenceGreedy(model, prompts, R, tok.eosTokenId);
    const resp = out.batch.responses!, mask = out.batch.response_mask!;
    const got = prompts.map((_, b) => Array.from(resp.data.subarray(b * R, (b + 1) * R)).filter((_, j) => mask.data[b * R + j] === 1));
    assert.deepEqual(got, expected);
    assert.ok(tok.decode(got[0]!).length > 20, "a real continuation");
  } finally {
    model.dispose();
  }
});

test("AgentLoopManager.fromModel re-reads the weights for every batch", async () => {
  await initBackend("wasm");
  const model = randomModel();
  try {
    const { CharTokenizer } = await import("../../src/models/tokenizers/index.js");
    const tok = new CharTokenizer("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRS"); // 3 specials + 45 = 48 ids
    const config = testConfig({ promptLength: 16, responseLength: 12 });
    const manager = AgentLoopManager.fromModel({ config, model, tokenizer: tok, rng: new Rng(0) });
    const batch = () => DataProto.fromDict({}, { raw_prompt: [[{ role: "user", content: "hello" }], [{ role: "user", content: "abc" }]] }, { validate: true });
    const responses = (d: DataProto) => [0, 1].map((b) => Array.from(d.batch.responses!.data.subarray(b * 12, (b + 1) * 12)).filter((_, j) => d.batch.response_mask!.data[b * 12 + j] === 1));
    const prompts = ["hello", "abc"].map((s) => tok.encode(s, { addSpecialTokens: false }));
    const tensorsBefore = tf.memory().numTensors;
    const before = responses(await manager.generateSequences(batch()));
    assert.equal(tf.memory().numTensors, tensorsBefore, "the engine's buffers are released after the batch");
    assert.deepEqual(before, referenceGreedy(model, prompts, 12, tok.eosTokenId));
    tf.tidy(() => { for (const v of model.params.values()) if (v.name.includes("mlp")) v.assign(v.mul(-1)); });
    const after = responses(await manager.generateSequences(batch()));
    assert.deepEqual(after, referenceGreedy(model, prompts, 12, tok.eosTokenId), "the updated weights were used");
    assert.notDeepEqual(after, before);
  } finally {
    model.dispose();
  }
});

test("rows with rollout_seed sample exactly as generate does with that seed, however they are scheduled", async () => {
  await initBackend("wasm");
  const model = randomModel();
  try {
    const { CharTokenizer } = await import("../../src/models/tokenizers/index.js");
    const tok = new CharTokenizer("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRS");
    const R = 10;
    const config = testConfig({ promptLength: 16, responseLength: R, rollout: { temperature: 0.8, top_k: 10, top_p: 0.95 } });
    const texts = ["hello", "abc", "xyz", "hello"];
    const seeds = [11, 22, 33, 44];
    const batch = DataProto.fromDict({}, { raw_prompt: texts.map((t) => [{ role: "user", content: t }]), rollout_seed: seeds });
    const out = await AgentLoopManager.fromModel({ config, model, tokenizer: tok, rng: new Rng(0) }).generateSequences(batch);
    const params = defaultSamplingParams({ temperature: 0.8, topK: 10, topP: 0.95, responseLength: R, eosTokenIds: [tok.eosTokenId], padTokenId: 0 });
    texts.forEach((t, b) => {
      const ref = generate(model, leftPadPrompts([tok.encode(t, { addSpecialTokens: false })], 0), params, new Rng(seeds[b]!));
      assert.deepEqual(Array.from(out.batch.responses!.data.subarray(b * R, (b + 1) * R)), Array.from(ref.batch.responses!.data), `row ${b}`);
    });
  } finally {
    model.dispose();
  }
});

test("abort rejects every pending request; the server serves the next ones unchanged", async () => {
  await initBackend("wasm");
  const model = randomModel();
  try {
    const server = new ContinuousBatchingServer(model, { maxNumSeqs: 2, maxModelLen: 96, eosTokenIds: [], rng: new Rng(0) });
    const reqs = [[5, 6, 7], [8, 9], [10, 11, 12, 13]].map((p, i) => server.generate(`a${i}`, p, { ...greedy, maxTokens: 40 }));
    for (let k = 0; k < 3; k++) await new Promise((r) => setImmediate(r));
    server.abort();
    for (const r of reqs) await assert.rejects(r, { name: "RequestAbortedError" });
    const prompt = [5, 6, 7, 20, 21];
    const after = await server.generate("b", prompt, { ...greedy, maxTokens: 8, logprobs: true });
    const fresh = await new ContinuousBatchingServer(model, { maxNumSeqs: 2, maxModelLen: 96, eosTokenIds: [], rng: new Rng(0) }).generate("c", prompt, { ...greedy, maxTokens: 8, logprobs: true });
    assert.deepEqual(after.tokenIds, fresh.tokenIds);
    await server.sleep();
  } finally {
    model.dispose();
  }
});

test("cancel(id) rejects that request only (waiting or running); the others finish as if it had never come", async () => {
  await initBackend("wasm");
  const model = randomModel();
  try {
    const server = new ContinuousBatchingServer(model, { maxNumSeqs: 2, maxModelLen: 96, eosTokenIds: [], rng: new Rng(0) });
    const prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13]];
    const reqs = prompts.map((p, i) => server.generate(`a${i}`, p, { ...greedy, maxTokens: 30 }));
    for (let k = 0; k < 3; k++) await new Promise((r) => setImmediate(r));
    server.cancel("a0"); // running
    server.cancel("a2"); // waiting (two slots)
    server.cancel("nobody");
    await assert.rejects(reqs[0]!, { name: "RequestAbortedError" });
    await assert.rejects(reqs[2]!, { name: "RequestAbortedError" });
    const kept = await reqs[1]!;
    const alone = await new ContinuousBatchingServer(model, { maxNumSeqs: 2, maxModelLen: 96, eosTokenIds: [], rng: new Rng(0) }).generate("x", prompts[1]!, { ...greedy, maxTokens: 30 });
    assert.deepEqual(kept.tokenIds, alone.tokenIds);
    await server.sleep();
  } finally {
    model.dispose();
  }
});
