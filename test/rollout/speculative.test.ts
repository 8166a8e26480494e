// Speculative decoding with the MTP layer as the draft: greedy gives plain decoding's tokens and
// log-probs; sampling draws exactly plain decoding's distribution (a chi-square test against the
// distribution computed from the tfjs forward, on a 4-token vocabulary where drafts are often
// accepted and often rejected).
import { test } from "node:test";
import assert from "node:assert/strict";
import { initBackend } from "../../src/engine/backend.js";
import { defaultSamplingParams, generate, leftPadPrompts } from "../../src/rollout/index.js";
import { generateSpeculative, type SpeculativeStats } from "../../src/rollout/speculative.js";
import { Rng } from "../../src/utils/rng.js";
import { assertThreeTokenDistribution, tinyMimo } from "./speculative_helpers.js";

for (const [vocab, draftTokens] of [[320, 1], [4, 1], [320, 3], [4, 3]] as const) {
  test(`speculative greedy decoding gives plain greedy decoding's tokens and log-probs (vocabulary ${vocab}, ${draftTokens} drafts a step)`, async () => {
    await initBackend("cpu");
    const m = tinyMimo(vocab, 11);
    try {
      const prompts = leftPadPrompts([[1, 2, 3], [3, 1], [2], [0, 1, 2, 3, 1, 0]].map((p) => p.map((x) => x % vocab)), 0);
      const params = defaultSamplingParams({ temperature: 0, doSample: false, responseLength: 12, eosTokenIds: vocab > 4 ? [7] : [], padTokenId: 0, calculateLogProbs: true });
      const plain = generate(m, prompts, params, new Rng(1));
      const stats: SpeculativeStats = { drafted: 0, accepted: 0 };
      const spec = generateSpeculative(m, prompts, params, new Rng(1), { stats, draftTokens });
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

for (const [draftTokens, R] of [[1, 3], [3, 5]] as const) {
  test(`speculative sampling draws plain decoding's distribution (chi-square over the first 3 response tokens; ${draftTokens} drafts a step)`, async () => {
    await initBackend("cpu");
    const V = 4, N = 6000, temperature = 0.8, prompt = [1, 2, 3];
    const m = tinyMimo(V, 5);
    try {
      const stats: SpeculativeStats = { drafted: 0, accepted: 0 };
      // R = 5 with 3 drafts: after the first token, one step drafts tokens 2 to 4 by the chained MTP layer
      const params = defaultSamplingParams({ temperature, responseLength: R, eosTokenIds: [], padTokenId: 0 });
      const out = generateSpeculative(m, leftPadPrompts(Array.from({ length: N }, () => prompt), 0), params, new Rng(2024), { stats, draftTokens });
      const r = out.batch["responses"]!.data;
      assertThreeTokenDistribution(m, prompt, temperature, Array.from({ length: N }, (_, i) => r.subarray(R * i, R * i + 3)));
      assert.ok(stats.accepted > 0.1 * stats.drafted && stats.accepted < 0.95 * stats.drafted, `accepted ${stats.accepted} of ${stats.drafted}`);
    } finally {
      m.dispose();
    }
  });
}
