import { test } from "node:test";
import assert from "node:assert/strict";
import { TokenSampler, defaultSamplingParams } from "../../src/rollout/sampling.js";
import { Rng } from "../../src/utils/rng.js";

const logits = Float32Array.from([Math.log(0.4), Math.log(0.3), Math.log(0.2), Math.log(0.1)]);

function freq(p: Parameters<typeof defaultSamplingParams>[0], n = 20000, seed = 1): number[] {
  const s = new TokenSampler(4, defaultSamplingParams(p));
  const rng = new Rng(seed), c = [0, 0, 0, 0];
  for (let i = 0; i < n; i++) c[s.sample(logits, 0, rng).token]!++;
  return c.map((x) => x / n);
}

test("greedy picks the argmax and reports its log-prob at temperature 1", () => {
  for (const p of [{ temperature: 0 }, { temperature: 0.7, doSample: false }]) {
    const s = new TokenSampler(4, defaultSamplingParams({ responseLength: 1, ...p }));
    const r = s.sample(Float32Array.from([9, 0, ...logits]), 2, new Rng(0));
    assert.equal(r.token, 0);
    assert.ok(Math.abs(r.logProb - Math.log(0.4)) < 1e-6);
  }
});

test("sampling at temperature 1 follows the softmax; temperature sharpens it", () => {
  const f = freq({ responseLength: 1 });
  [0.4, 0.3, 0.2, 0.1].forEach((p, i) => assert.ok(Math.abs(f[i]! - p) < 0.015, `token ${i}: ${f[i]}`));
  const cold = freq({ responseLength: 1, temperature: 0.5 });
  // p^2 normalised: .16/.30, .09/.30, ...
  [0.16, 0.09, 0.04, 0.01].forEach((p, i) => assert.ok(Math.abs(cold[i]! - p / 0.3) < 0.015, `token ${i}: ${cold[i]}`));
});

test("top-k and top-p restrict the candidates and renormalise", () => {
  const k2 = freq({ responseLength: 1, topK: 2 });
  assert.equal(k2[2]! + k2[3]!, 0);
  assert.ok(Math.abs(k2[0]! - 0.4 / 0.7) < 0.015);
  // nucleus 0.5: 0.4 alone does not reach it, so {0.4, 0.3}
  const p5 = freq({ responseLength: 1, topP: 0.5 });
  assert.equal(p5[2]! + p5[3]!, 0);
  assert.ok(Math.abs(p5[1]! - 0.3 / 0.7) < 0.015);
  const p3 = freq({ responseLength: 1, topP: 0.3 });
  assert.deepEqual(p3, [1, 0, 0, 0]);
  // top-k 3 then top-p 0.6 of the renormalised {4/9, 3/9, 2/9}: {0, 1}
  const kp = freq({ responseLength: 1, topK: 3, topP: 0.6 });
  assert.equal(kp[2]! + kp[3]!, 0);
});

test("the reported log-prob is under the temperature-scaled softmax", () => {
  const s = new TokenSampler(4, defaultSamplingParams({ responseLength: 1, temperature: 2, topK: 2 }));
  const { token, logProb } = s.sample(logits, 0, new Rng(3));
  const z = Array.from(logits, (l) => l / 2), lse = Math.log(z.reduce((a, v) => a + Math.exp(v), 0));
  assert.ok(Math.abs(logProb - (z[token]! - lse)) < 1e-6);
});

test("bad sampling parameters are rejected by name", () => {
  assert.throws(() => new TokenSampler(4, defaultSamplingParams({ responseLength: 1, topP: 0 })), /top_p must be in \(0, 1\]/);
  assert.throws(() => new TokenSampler(4, defaultSamplingParams({ responseLength: 0 })), /response_length/);
  assert.throws(() => new TokenSampler(4, defaultSamplingParams({ responseLength: 1, temperature: -1 })), /temperature/);
});
