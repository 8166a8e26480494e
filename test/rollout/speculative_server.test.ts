// Speculative decoding with the MTP draft on the continuous-batching server (agent loops): greedy
// conversations give the tokens and log-probs of the server without a draft, turn after turn on
// reused (and rolled back) caches; sampling draws plain decoding's distribution (chi-square); a
// request's tokens depend on its seed alone.
import { test } from "node:test";
import assert from "node:assert/strict";
import * as tf from "@tensorflow/tfjs";
import { initBackend } from "../../src/engine/backend.js";
import type { LlamaModel } from "../../src/models/llama.js";
import { ContinuousBatchingServer } from "../../src/agent_loop/batching_server.js";
import type { GenerationParams, TokenOutput } from "../../src/agent_loop/server.js";
import type { SpeculativeStats } from "../../src/rollout/speculative.js";
import { hostKernels } from "../../src/engine/host_kernels.js";
import { KvCacheDecoder } from "../../src/rollout/decoder.js";
import { defaultSamplingParams, TokenSampler } from "../../src/rollout/sampling.js";
import { SpeculativeSlots } from "../../src/rollout/speculative_slots.js";
import { Rng } from "../../src/utils/rng.js";
import { assertThreeTokenDistribution, tinyMimo } from "./speculative_helpers.js";

const greedy = { temperature: 0, topP: 1, topK: -1, logprobs: true };

function server(model: LlamaModel, maxNumSeqs: number, stats?: SpeculativeStats, opts: { eos?: number[]; seed?: number; maxModelLen?: number; draftTokens?: number } = {}): ContinuousBatchingServer {
  return new ContinuousBatchingServer(model, {
    maxNumSeqs, maxModelLen: opts.maxModelLen ?? 128, eosTokenIds: opts.eos ?? [], rng: new Rng(opts.seed ?? 0),
    ...(stats ? { mtpDraft: stats, mtpDraftTokens: opts.draftTokens ?? 1 } : {}),
  });
}

/** Conversations of `turns` turns: each next prompt is the last prompt, its response and a "tool" reply. */
async function conversations(s: ContinuousBatchingServer, prompts: number[][], turns: number, maxTokens: number, vocab: number, params: GenerationParams = greedy): Promise<TokenOutput[][]> {
  return Promise.all(prompts.map(async (p, c) => {
    const outs: TokenOutput[] = [];
    let prompt = p;
    for (let t = 0; t < turns; t++) {
      for (let k = 0; k < c; k++) await new Promise((r) => setImmediate(r)); // staggered arrivals
      const o = await s.generate(`c${c}t${t}`, prompt, { ...params, maxTokens });
      outs.push(o);
      prompt = [...prompt, ...o.tokenIds, ...[3, 1, 2].map((x) => (x + c + t) % vocab)];
    }
    return outs;
  }));
}

function assertSame(a: TokenOutput[][], b: TokenOutput[][], what: string): void {
  assert.deepEqual(a.map((c) => c.map((o) => o.tokenIds)), b.map((c) => c.map((o) => o.tokenIds)), `${what}: tokens`);
  a.forEach((c, i) => c.forEach((o, t) => o.logProbs!.forEach((lp, k) => {
    const other = b[i]![t]!.logProbs![k]!;
    assert.ok(Math.abs(lp - other) < 1e-4, `${what}: conversation ${i} turn ${t} log-prob ${k}: ${lp} vs ${other}`);
  })));
}

for (const [vocab, draftTokens] of [[320, 1], [4, 1], [4, 3]] as const) {
  test(`server: greedy multi-turn conversations with the MTP draft give the tokens and log-probs of plain decoding (vocabulary ${vocab}, ${draftTokens} drafts a step)`, async () => {
    await initBackend("wasm");
    const m = tinyMimo(vocab, 11), live = tf.memory().numTensors;
    try {
      const rng = new Rng(4);
      const prompts = Array.from({ length: 5 }, (_, i) => Array.from({ length: 2 + 3 * i }, () => rng.int(vocab)));
      const eos = vocab > 4 ? [7] : [];
      // 4 slots for 5 conversations: parked caches are reused, and evicted
      const plain = server(m, 4, undefined, { eos });
      const stats: SpeculativeStats = { drafted: 0, accepted: 0 };
      const spec = server(m, 4, stats, { eos, draftTokens });
      const a = await conversations(plain, prompts, 3, 10, vocab), b = await conversations(spec, prompts, 3, 10, vocab);
      assertSame(b, a, "draft vs plain");
      assert.ok(spec.stats().reusedTokens > 0, `turns reused their caches: ${JSON.stringify(spec.stats())} ${JSON.stringify(plain.stats())}`);
      assert.ok(stats.drafted > 0 && stats.accepted > 0, `accepted ${stats.accepted} of ${stats.drafted}`);
      if (vocab === 4) assert.ok(stats.accepted < stats.drafted, `some drafts rejected: ${stats.accepted} of ${stats.drafted}`);
      // fewer steps than tokens once drafts are accepted
      assert.ok(spec.stats().decodeSteps < plain.stats().decodeSteps, `${spec.stats().decodeSteps} steps with the draft, ${plain.stats().decodeSteps} without`);
      assert.equal(spec.stats().decodeTokens, plain.stats().decodeTokens);
      await plain.sleep();
      await spec.sleep();
      assert.equal(tf.memory().numTensors, live, "no tensor left behind");
    } finally {
      m.dispose();
    }
  });
}

for (const draftTokens of [1, 3]) test(`server: a rolled-back cache serves the next turn (tool reply after rejected drafts) as a fresh cache does, also when the prompt rewrites the last turn (${draftTokens} drafts a step)`, async () => {
  await initBackend("wasm");
  const V = 4, m = tinyMimo(V, 11);
  try {
    const stats: SpeculativeStats = { drafted: 0, accepted: 0 };
    const s = server(m, 1, stats, { draftTokens });
    const prompt = [0, 1, 2, 3, 1, 0];
    const t1 = await s.generate("turn1", prompt, { ...greedy, maxTokens: 12 });
    assert.ok(stats.accepted < stats.drafted, "turn 1 rejected drafts (its cache was rolled back)");
    const cases = [
      [...prompt, ...t1.tokenIds, 3, 3, 1], // the tool call's reply after the whole turn
      [...prompt, ...t1.tokenIds.slice(0, 6), (t1.tokenIds[6]! + 1) % V, 2], // a rewritten turn: the cache diverges mid-way
      [...prompt.slice(0, 3), 1, 1], // diverging inside the first prompt
    ];
    let reused = s.stats().reusedTokens;
    for (const [i, turn2] of cases.entries()) {
      const before = { ...stats };
      const o = await s.generate(`turn2-${i}`, turn2, { ...greedy, maxTokens: 12 });
      assert.ok(s.stats().reusedTokens > reused, `case ${i}: the cache was reused`);
      reused = s.stats().reusedTokens;
      const freshStats: SpeculativeStats = { drafted: 0, accepted: 0 };
      const fresh = server(m, 1, freshStats, { draftTokens }), plain = server(m, 1);
      const f = await fresh.generate("f", turn2, { ...greedy, maxTokens: 12 }), p = await plain.generate("p", turn2, { ...greedy, maxTokens: 12 });
      assertSame([[o], [f]], [[p], [p]], `case ${i}`);
      // the MTP layer's cache, kept and cut back with the trunk's, drafts what a fresh one drafts
      assert.deepEqual({ drafted: stats.drafted - before.drafted, accepted: stats.accepted - before.accepted }, freshStats, `case ${i}: the drafts`);
      await fresh.sleep();
      await plain.sleep();
      // the next case starts from this turn's cache
      await s.generate(`again-${i}`, [...turn2, ...o.tokenIds, 0], { ...greedy, maxTokens: 5 });
    }
    // a prompt near the model length: the last steps decode plainly
    const near = server(m, 1, { drafted: 0, accepted: 0 }, { maxModelLen: 16, draftTokens }), nearPlain = server(m, 1, undefined, { maxModelLen: 16 });
    const long = Array.from({ length: 9 }, (_, i) => i % V);
    assertSame([[await near.generate("n", long, greedy)]], [[await nearPlain.generate("n", long, greedy)]], "near the model length");
    await s.sleep();
    // the slot decoder of another engine (WebGPU) cannot draft: refused by name
    assert.throws(() => new ContinuousBatchingServer(m, { maxNumSeqs: 1, maxModelLen: 16, eosTokenIds: [], rng: new Rng(0), mtpDraft: stats, decoder: () => { throw new Error("unused"); } }),
      /runs on the host KV-cache decoder; this rollout engine's slot decoder cannot draft/);
  } finally {
    m.dispose();
  }
});

for (const [draftTokens, maxTokens] of [[1, 3], [2, 4]] as const) {
  test(`server: speculative sampling draws plain decoding's distribution (chi-square over the first 3 response tokens; ${draftTokens} drafts a step)`, async () => {
    await initBackend("wasm");
    const V = 4, N = 4000, temperature = 0.8, prompt = [1, 2, 3];
    const m = tinyMimo(V, 5);
    try {
      const stats: SpeculativeStats = { drafted: 0, accepted: 0 };
      // 4 tokens with 2 drafts: after the first token, one step drafts tokens 2 and 3 by the chained MTP layer
      const s = server(m, 32, stats, { seed: 2024, draftTokens });
      const outs = await Promise.all(Array.from({ length: N }, (_, i) => s.generate(`r${i}`, prompt, { temperature, topP: 1, topK: -1, maxTokens })));
      assertThreeTokenDistribution(m, prompt, temperature, outs.map((o) => o.tokenIds.slice(0, 3)));
      assert.ok(stats.accepted > 0.1 * stats.drafted && stats.accepted < 0.95 * stats.drafted, `accepted ${stats.accepted} of ${stats.drafted}`);
      await s.sleep();
    } finally {
      m.dispose();
    }
  });
}

test("server: with the draft, a seeded request samples the same tokens alone or among others; the server's seed fixes the unseeded ones", async () => {
  await initBackend("wasm");
  const V = 320, m = tinyMimo(V, 3);
  try {
    const sampling = { temperature: 1, topP: 0.9, topK: 50, maxTokens: 16, logprobs: true };
    const alone = await server(m, 4, { drafted: 0, accepted: 0 }).generate("x", [5, 6, 7], { ...sampling, seed: 99 });
    const crowd = server(m, 4, { drafted: 0, accepted: 0 });
    const [, mid] = await Promise.all([crowd.generate("a", [1, 2], sampling), crowd.generate("x", [5, 6, 7], { ...sampling, seed: 99 }), crowd.generate("b", [9, 9, 9, 9, 9], sampling)]);
    assert.deepEqual(mid!.tokenIds, alone.tokenIds);
    const run = async (seed: number) => {
      const stats: SpeculativeStats = { drafted: 0, accepted: 0 };
      const s = server(m, 3, stats, { seed });
      const outs = await conversations(s, [[4, 5, 6], [7, 8], [9], [1, 2, 3, 4]], 2, 12, V, { temperature: 1, topP: 1, topK: -1, logprobs: true });
      return { tokens: outs.map((c) => c.map((o) => o.tokenIds)), stats };
    };
    const a = await run(1), b = await run(1), c = await run(2);
    assert.deepEqual(a, b);
    assert.notDeepEqual(a.tokens, c.tokens);
  } finally {
    m.dispose();
  }
});

/** A sampler that keeps the logits rows it turns into distributions (the draft's come first in a step). */
class Recording extends TokenSampler {
  rows: Float32Array[] = [];
  override probabilities(logits: Float32Array, offset: number, out: Float64Array): Float64Array {
    this.rows.push(logits.slice(offset, offset + this.vocabSize));
    return super.probabilities(logits, offset, out);
  }
}

for (const draftTokens of [1, 3]) test(`SpeculativeSlots: after a turn is rewritten, the kept and cut-back MTP cache drafts from the logits a fresh cache gives (${draftTokens} drafts a step)`, async () => {
  await initBackend("wasm");
  const V = 320, m = tinyMimo(V, 11), L = 64;
  const trunk = new KvCacheDecoder(m, 2, L, { kernels: hostKernels(), maxRowsPerCall: 8 });
  const spec = new SpeculativeSlots(m, trunk, 2, L, 8, { drafted: 0, accepted: 0 }, hostKernels(), draftTokens);
  try {
    const params = defaultSamplingParams({ temperature: 0, responseLength: 8, eosTokenIds: [], padTokenId: 0 });
    /** Decode `n` greedy steps on `slot` from `prompt`; returns the tokens and the sampler. */
    const decode = (slot: number, prompt: number[], reuse: number, n: number) => {
      const sampler = new Recording(V, params), cached = prompt.slice(), out: number[] = [];
      // (each step takes at most draftTokens + 1 tokens; the cache has room for them all)
      let next = sampler.sample(spec.prefill(slot, prompt, reuse), 0, new Rng(0)).token;
      for (let i = 0; i < n; i++) {
        if (cached.length + draftTokens + 1 >= L) break;
        spec.step([{ slot, cached, next, sampler, rng: new Rng(i), draft: draftTokens, emit: (t) => { out.push(t); next = t; return true; } }]);
      }
      return { out, cached, sampler };
    };
    const prompt = [5, 17, 30, 2, 9, 11, 40];
    const t1 = decode(0, prompt, 0, 6);
    // matches cut inside the generated part, right at the end of the prompt and inside it (each leaves the MTP cache behind the cut)
    for (const cut of [t1.cached.length - 2, prompt.length + 1, 3]) {
      const rewritten = [...t1.cached.slice(0, cut), 99, 98, 97];
      const reuse = spec.reusable(0, cut);
      assert.ok(reuse >= cut - 1 && reuse <= cut, `cut ${cut}: keeps ${reuse}`);
      const kept = decode(0, rewritten, reuse, 3), fresh = decode(1, rewritten, 0, 3);
      assert.deepEqual(kept.out, fresh.out);
      assert.equal(kept.sampler.rows.length, fresh.sampler.rows.length);
      kept.sampler.rows.forEach((row, i) => row.forEach((x, v) => assert.ok(Math.abs(x - fresh.sampler.rows[i]![v]!) < 1e-4, `cut ${cut}: logits row ${i} id ${v}: ${x} vs ${fresh.sampler.rows[i]![v]}`)));
      // back to the first conversation's cache for the next cut
      decode(0, t1.cached, spec.reusable(0, Math.min(cut, t1.cached.length - 1)), 0);
    }
  } finally {
    spec.dispose();
    trunk.dispose();
    m.dispose();
  }
});
