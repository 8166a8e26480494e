// Single-turn speculative decoding prefills a sub-batch's prompts together (packed token by token
// into as few forwards as the buffers allow): bit for bit the tokens and log-probs of one prompt at
// a time, and of runs stored before the batched prefill and the float32 draft logits; the slots'
// batched prefill, split across calls and over reused columns, leaves the caches prefill() leaves.
import { test } from "node:test";
import assert from "node:assert/strict";
import { initBackend } from "../../src/engine/backend.js";
import { hostKernels } from "../../src/engine/host_kernels.js";
import type { LlamaModel } from "../../src/models/llama.js";
import { KvCacheDecoder } from "../../src/rollout/decoder.js";
import { defaultSamplingParams, leftPadPrompts } from "../../src/rollout/index.js";
import { TokenSampler } from "../../src/rollout/sampling.js";
import { generateSpeculative, type SpeculativeStats } from "../../src/rollout/speculative.js";
import { SpeculativeSlots, type SpeculativeRow } from "../../src/rollout/speculative_slots.js";
import { Rng } from "../../src/utils/rng.js";
import { STORIES_MISSING, storiesBin } from "../models/stories.js";
import { fingerprint, storiesPrompts, storiesWithMtp, tinyMimo } from "./speculative_helpers.js";

// fingerprint() of these runs made at commit 739473e (one forward per prompt, float64 draft distributions)
const STORED = [
  { draftTokens: 3, temperature: 1, topP: 1, run: "5ff0deae" },
  { draftTokens: 1, temperature: 0.8, topP: 0.9, run: "5fb0a73c" },
];

test("stories260K: batched speculative prefill gives the tokens and log-probs of one prompt at a time, and of the run stored before it", async (t) => {
  const bin = storiesBin();
  if (!bin) return t.skip(STORIES_MISSING);
  await initBackend("wasm");
  const m = storiesWithMtp(bin, 3);
  try {
    const prompts = leftPadPrompts(storiesPrompts(5), 0);
    for (const { draftTokens, temperature, topP, run } of STORED) {
      const params = defaultSamplingParams({ temperature, topP, responseLength: 24, eosTokenIds: [2], padTokenId: 0, calculateLogProbs: true });
      const stats: SpeculativeStats = { drafted: 0, accepted: 0 };
      const batched = generateSpeculative(m, prompts, params, new Rng(1), { draftTokens, stats });
      const rows = generateSpeculative(m, prompts, params, new Rng(1), { draftTokens, prefill: "rows" });
      const what = `${draftTokens} drafts, temperature ${temperature}, top_p ${topP}`;
      for (const k of ["responses", "response_mask", "rollout_log_probs"]) assert.deepEqual(batched.batch[k]!.data, rows.batch[k]!.data, `${what}: ${k}`);
      assert.equal(fingerprint(batched.batch["responses"]!.data, batched.batch["rollout_log_probs"]!.data as Float32Array), run, `${what}: the stored run`);
      assert.ok(stats.accepted > 0 && stats.accepted < stats.drafted, `${what}: accepted ${stats.accepted} of ${stats.drafted}`);
    }
  } finally {
    m.dispose();
  }
});

/** Slots over `m` with room for `perCall` tokens a forward (less than the prompts: calls split rows). */
function slots(m: LlamaModel, n: number, maxLen: number, perCall: number, draftTokens: number): SpeculativeSlots {
  const trunk = new KvCacheDecoder(m, n, maxLen, { maxRowsPerCall: perCall });
  return new SpeculativeSlots(m, trunk, n, maxLen, perCall, { drafted: 0, accepted: 0 }, hostKernels(), draftTokens);
}

test("SpeculativeSlots.prefillRows, split across calls and over reused columns: the logits of prefill() row by row, then the same steps", async () => {
  await initBackend("wasm");
  const m = tinyMimo(320, 11), V = 320, k = 2, maxLen = 64, perCall = 12;
  try {
    const a = slots(m, 4, maxLen, perCall, k), b = slots(m, 4, maxLen, perCall, k);
    const sampler = new TokenSampler(V, defaultSamplingParams({ temperature: 1, responseLength: 8 }));
    const rng = new Rng(9);
    let prompts = [5, 17, 1, 9].map((n) => Array.from({ length: n }, () => rng.int(V)));
    const cached: number[][][] = [[], []], reused: number[] = [];
    for (let turn = 0; turn < 2; turn++) {
      // turn 1 keeps what reusable() allows of each slot (the MTP row's carry decides)
      const reuse = prompts.map((_, s) => a.reusable(s, turn === 0 ? 0 : cached[0]![s]!.length));
      assert.deepEqual(prompts.map((_, s) => b.reusable(s, turn === 0 ? 0 : cached[1]![s]!.length)), reuse);
      reused.push(...reuse);
      const la = prompts.map((p, s) => a.prefill(s, p, reuse[s]!)), lb = b.prefillRows(prompts.map((prompt, slot) => ({ slot, prompt, reuse: reuse[slot]! })));
      la.forEach((l, s) => assert.deepEqual(lb.subarray(s * V, (s + 1) * V), l, `turn ${turn} slot ${s}: prefill logits`));
      const outs = [a, b].map((spec, x) => {
        const out: number[][] = prompts.map(() => []);
        const rows: SpeculativeRow[] = prompts.map((p, slot) => {
          const r: SpeculativeRow = { slot, cached: p.slice(), next: -1, sampler, rng: new Rng(100 + slot + turn), draft: k,
            emit: (token, logProb) => { out[slot]!.push(token, logProb); r.next = token; return true; } };
          r.next = sampler.sample(x === 0 ? la[slot]! : lb, x === 0 ? 0 : slot * V, r.rng).token;
          return r;
        });
        for (let step = 0; step < 4; step++) spec.step(rows);
        rows.forEach((r, s) => { cached[x]![s] = r.cached; });
        return out;
      });
      assert.deepEqual(outs[1], outs[0], `turn ${turn}: tokens and log-probs of the steps`);
      // the next prompts: what each slot holds, plus its pending token and a few more
      prompts = cached[0]!.map((c, s) => [...c, ...Array.from({ length: 1 + 3 * s }, () => rng.int(V))]);
    }
    assert.ok(reused.some((n) => n > 0), `columns reused: ${reused}`);
  } finally {
    m.dispose();
  }
});
