import { before, test } from "node:test";
import assert from "node:assert/strict";
import * as tf from "@tensorflow/tfjs";
import { getAdvEstimator } from "../../../../src/trainer/ppo/core_algos/index.js";
import type { AdvEstimatorArgs } from "../../../../src/trainer/ppo/core_algos/index.js";
import { close, closeAll, cpu, randMat, read, t2, testVectors, type Mat } from "../helpers.js";

before(cpu);

function run(name: string, args: Omit<AdvEstimatorArgs, "tokenLevelRewards" | "responseMask"> & { rewards: Mat; mask: Mat }) {
  const { rewards, mask, ...rest } = args;
  const out = getAdvEstimator(name)({ ...rest, tokenLevelRewards: t2(rewards), responseMask: t2(mask) });
  const res = { adv: read(out.advantages), ret: read(out.returns) };
  tf.dispose([out.advantages, out.returns]);
  return res;
}

/** Outcome rewards: the score sits on the last valid token. */
function outcome(scores: number[], len: number, lengths?: number[]): { rewards: Mat; mask: Mat } {
  const mask = scores.map((_, i) => Array.from({ length: len }, (_, t) => (t < (lengths?.[i] ?? len) ? 1 : 0)));
  const rewards = scores.map((s, i) => mask[i]!.map((_, t) => (t === Math.max((lengths?.[i] ?? len) - 1, 0) ? s : 0)));
  return { rewards, mask };
}

function perRow(values: number[], cols: number, mask: Mat): number[] {
  return values.flatMap((v, i) => Array.from({ length: cols }, (_, t) => v * mask[i]![t]!));
}

test("grpo with and without std normalisation matches the reference vectors (singleton group: mean 0, std 1)", (t) => {
  const tv = testVectors();
  if (!tv) return t.skip("../shared/reference/test-vectors.json absent");
  const g = tv.grpo as { scores: number[]; index: string[]; norm_true: number[]; norm_false_drgrpo: number[] };
  const { rewards, mask } = outcome(g.scores, 3);
  for (const [norm, expected] of [[true, g.norm_true], [false, g.norm_false_drgrpo]] as const) {
    const { adv, ret } = run("grpo", { rewards, mask, index: g.index, normAdvByStdInGrpo: norm });
    closeAll(adv, perRow(expected, 3, mask), 1e-5, `grpo norm=${norm}`);
    assert.deepEqual(adv, ret);
  }
});

test("rloo matches the reference vector; rloo_vectorized gives a singleton 0 instead of its score", (t) => {
  const tv = testVectors();
  if (!tv) return t.skip("../shared/reference/test-vectors.json absent");
  const g = tv.grpo as { scores: number[]; index: string[] };
  const { rewards, mask } = outcome(g.scores, 2);
  const expected = tv.rloo as number[];
  closeAll(run("rloo", { rewards, mask, index: g.index }).adv, perRow(expected, 2, mask), 1e-5, "rloo");
  const vec = expected.map((v, i) => (g.index[i] === "c" ? 0 : v));
  closeAll(run("rloo_vectorized", { rewards, mask, index: g.index }).adv, perRow(vec, 2, mask), 1e-5, "rloo_vectorized");
});

test("grpo and grpo_vectorized agree on random groups; the vectorised floor only shows for a zero-variance group", () => {
  const scores = randMat(1, 24, 7)[0]!;
  const index = scores.map((_, i) => `g${i % 5}`);
  const { rewards, mask } = outcome(scores, 4, scores.map((_, i) => 1 + (i % 4)));
  const a = run("grpo", { rewards, mask, index }).adv;
  const b = run("grpo_vectorized", { rewards, mask, index }).adv;
  closeAll(b, a, 1e-5, "vectorized vs grpo");
  // Equal scores: both give 0 (vectorised divides 0 by sqrt(eps)+eps).
  const same = outcome([2, 2, 2], 2);
  assert.deepEqual(run("grpo_vectorized", { ...same, index: ["x", "x", "x"] }).adv, [0, 0, 0, 0, 0, 0]);
  // Nearly equal scores: var < eps, so the vectorised std is floored at sqrt(1e-6).
  const near = outcome([1, 1.0001], 1);
  const sNear = run("grpo_vectorized", { ...near, index: ["y", "y"] }).adv;
  const mu = 1.00005, d = 0.00005;
  closeAll(sNear, [(1 - mu) / (Math.sqrt(1e-6) + 1e-6), d / (Math.sqrt(1e-6) + 1e-6)], 1e-3, "floored std");
});

test("grpo: masked positions are zero, an empty response gets zero advantage", () => {
  const { rewards, mask } = outcome([1, 0, 1, 0], 3, [3, 2, 0, 1]);
  const { adv } = run("grpo", { rewards, mask, index: ["a", "a", "a", "a"] });
  mask.flat().forEach((m, k) => { if (m === 0) assert.equal(adv[k]! + 0, 0); });
  // Rows 0/2 share score 1 and rows 1/3 score 0: mean 0.5, std (unbiased) sqrt(1/3).
  close(adv[0]!, 0.5 / (Math.sqrt(1 / 3) + 1e-6), 1e-5);
  close(adv[3]!, -0.5 / (Math.sqrt(1 / 3) + 1e-6), 1e-5);
});

test("grpo_passk: only the best of a group gets (max − second)/(std + eps); singleton groups are an error", () => {
  const { rewards, mask } = outcome([0.2, 0.9, 0.5, 1, 1], 1);
  const index = ["a", "a", "a", "b", "b"];
  const { adv } = run("grpo_passk", { rewards, mask, index });
  const std = Math.sqrt(((0.2 - 0.8 / 1.5) ** 2 + (0.9 - 1.6 / 3) ** 2 + (0.5 - 1.6 / 3) ** 2) / 2);
  closeAll(adv, [0, 0.4 / (std + 1e-6), 0, 0, 0], 1e-5, "passk");
  closeAll(run("grpo_passk", { rewards, mask, index, normAdvByStdInGrpo: false }).adv, [0, 0.4, 0, 0, 0], 1e-6, "passk unnormalised");
  assert.throws(() => run("grpo_passk", { rewards, mask, index: ["a", "a", "a", "a", "c"] }), /at least 2 samples per group; group 'c' has 1/);
});

test("opo: baseline is the length-weighted group mean; a group of empty responses gets baseline 0, not NaN", () => {
  const { rewards, mask } = outcome([1, 0, 3, 5, 2, 7], 4, [4, 2, 1, 0, 0, 3]);
  const index = ["a", "a", "a", "e", "e", "s"];
  const { adv } = run("opo", { rewards, mask, index });
  const bsl = (4 * 1 + 2 * 0 + 1 * 3) / 7;
  const expected = [1 - bsl, 0 - bsl, 3 - bsl, 5, 2, 7];
  closeAll(adv, perRow(expected, 4, mask), 1e-5, "opo");
  assert.ok(adv.every(Number.isFinite));
});

test("gpg: alpha = B/#nonzero scores times the group-centred score", () => {
  const { rewards, mask } = outcome([1, 0, 0, 2, 3], 1);
  const index = ["a", "a", "b", "b", "c"];
  const alpha = 5 / 3;
  closeAll(run("gpg", { rewards, mask, index }).adv, [alpha * 0.5, alpha * -0.5, alpha * -1, alpha * 1, alpha * 3], 1e-5, "gpg");
});

/** Float64 whitening over the mask (unbiased variance). */
function whiten(values: number[], mask: number[]): number[] {
  const sel = values.filter((_, k) => mask[k]);
  const mu = sel.reduce((a, b) => a + b, 0) / sel.length;
  const v = sel.reduce((a, b) => a + (b - mu) ** 2, 0) / (sel.length - 1);
  return values.map((x) => (x - mu) / Math.sqrt(v + 1e-8));
}

test("reinforce_plus_plus_baseline: whitened (s − group mean) over the response tokens", () => {
  const { rewards, mask } = outcome([1, 3, 2, 5], 3, [3, 1, 2, 3]);
  const index = ["a", "a", "b", "c"];
  const centred = [-1, 1, 2, 5]; // singletons keep their score (group mean 0)
  const tiled = perRow(centred, 3, mask);
  const expected = whiten(tiled, mask.flat()).map((a, k) => a * mask.flat()[k]!);
  closeAll(run("reinforce_plus_plus_baseline", { rewards, mask, index }).adv, expected, 1e-5, "rf++ baseline");
});

test("reinforce_plus_plus: discounted returns reset at masked tokens, advantages whitened ×mask", () => {
  const rewards = [[0.5, 0, 1, 0, 0], [0, 1, 0, 2, 0]];
  const mask = [[1, 1, 1, 0, 0], [1, 1, 0, 1, 1]];
  const gamma = 0.9;
  // Row 1 has a masked token in the middle: the return restarts there.
  const G = [[0.5 + 0.9 * 0.9, 0.9, 1, 0, 0], [0.9, 1, 0 + 0.9 * 2, 2, 0]];
  const { adv, ret } = run("reinforce_plus_plus", { rewards, mask, gamma });
  closeAll(ret, G.flat(), 1e-6, "returns");
  closeAll(adv, whiten(G.flat(), mask.flat()).map((a, k) => a * mask.flat()[k]!), 1e-5, "advantages");
});

test("remax: reverse cumulative rewards minus the greedy baseline on response tokens", () => {
  const rewards = [[0, 0, 1, 0], [0.5, 0, 0, 0]];
  const mask = [[1, 1, 1, 0], [1, 0, 0, 0]];
  const out = getAdvEstimator("remax")({ tokenLevelRewards: t2(rewards), responseMask: t2(mask), rewardBaselines: tf.tensor1d([0.25, 1]) });
  closeAll(read(out.returns), [1, 1, 1, 0, 0.5, 0, 0, 0], 1e-6, "returns");
  closeAll(read(out.advantages), [0.75, 0.75, 0.75, 0, -0.5, 0, 0, 0], 1e-6, "advantages");
  assert.throws(() => getAdvEstimator("remax")({ tokenLevelRewards: t2(rewards), responseMask: t2(mask) }), /rewardBaselines/);
});

/** GAE written over the compacted valid tokens of each row; skipped tokens carry the next valid advantage. */
function gaeReference(r: Mat, v: Mat, m: Mat, gamma: number, lam: number): { adv: number[]; ret: number[] } {
  const raw: number[] = [], ret: number[] = [];
  r.forEach((row, i) => {
    const valid = row.map((_, t) => t).filter((t) => m[i]![t]);
    const a = new Array<number>(row.length).fill(0);
    let nextA = 0, nextV = 0;
    for (let j = valid.length - 1; j >= 0; j--) {
      const t = valid[j]!;
      const delta = r[i]![t]! + gamma * nextV - v[i]![t]!;
      a[t] = delta + gamma * lam * nextA;
      nextA = a[t]!;
      nextV = v[i]![t]!;
    }
    // A skipped token holds the advantage of the next valid token after it (0 if none).
    let carry = 0;
    for (let t = row.length - 1; t >= 0; t--) {
      if (m[i]![t]) carry = a[t]!;
      else a[t] = carry;
    }
    a.forEach((x, t) => { raw.push(x); ret.push(x + v[i]![t]!); });
  });
  return { adv: whiten(raw, m.flat()), ret };
}

test("gae matches a compacted-sequence reference; values on masked (tool) tokens do not matter", () => {
  const rewards = [[0, 0, 0.1, 0.1, 0.1, 0, 0, 0.1, 1, 0, 0], [0, 0.2, 0, 0, 0, 0, 0, 0, 0, 0, 0.5]];
  const mask = [[0, 0, 1, 1, 1, 0, 0, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]];
  const base = randMat(2, 11, 3, -2, 2);
  const other = base.map((row, i) => row.map((x, t) => (mask[i]![t] ? x : 50 * Math.sin(7 * t + i))));
  const gamma = 0.93, lam = 0.81;
  const a = run("gae", { rewards, mask, values: t2(base), gamma, lam });
  const b = run("gae", { rewards, mask, values: t2(other), gamma, lam });
  const ref = gaeReference(rewards, base, mask, gamma, lam);
  closeAll(a.adv, ref.adv, 2e-5, "gae advantages");
  closeAll(a.ret, ref.ret, 2e-5, "gae returns");
  assert.deepEqual(b.adv, a.adv, "advantages must not depend on values at masked positions");
  const masked = (xs: number[]) => xs.map((x, k) => x * mask.flat()[k]! + 0);
  assert.deepEqual(masked(b.ret), masked(a.ret), "returns on response tokens must not depend on masked values");
  // NaN values in skipped slots do not leak either.
  const nan = base.map((row, i) => row.map((x, t) => (mask[i]![t] ? x : NaN)));
  assert.deepEqual(run("gae", { rewards, mask, values: t2(nan), gamma, lam }).adv, a.adv);
});

test("gae with an empty response row and gamma/lam from config; clear errors for bad input", () => {
  const rewards = [[0, 1, 0], [0, 0, 0]];
  const mask = [[1, 1, 0], [0, 0, 0]];
  const values = [[0.5, 0.2, 9], [3, 3, 3]];
  const viaConfig = run("gae", { rewards, mask, values: t2(values), config: { gamma: 0.5, lam: 0.5 } });
  const ref = gaeReference(rewards, values, mask, 0.5, 0.5);
  closeAll(viaConfig.adv, ref.adv, 1e-5, "gae adv");
  assert.throws(() => run("gae", { rewards, mask }), /needs `values`/);
  assert.throws(() => run("grpo", { rewards, mask }), /needs `index`/);
  assert.throws(() => run("grpo", { rewards, mask, index: ["a"] }), /index has 1 entries but the batch has 2 rows/);
  assert.throws(() => run("grpo", { rewards, mask: [[1, 1]], index: ["a", "b"] }), /responseMask has shape \[1, 2\]/);
  assert.throws(() => run("gae", { rewards, mask: [[0, 0, 0], [0, 0, 0]], values: t2(values) }), /at least one response token/);
});

test("every estimator handles empty responses and singleton groups: finite, zero on masked tokens", () => {
  // Row 1 is empty; group "s" is a singleton; group "e" holds only empty-ish rows.
  const { rewards, mask } = outcome([1, 0.5, 0, 2, 1, 0], 4, [4, 0, 2, 3, 1, 0]);
  const index = ["a", "a", "a", "s", "e", "e"];
  const values = t2(randMat(6, 4, 9));
  for (const name of ["gae", "grpo", "grpo_vectorized", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "rloo", "rloo_vectorized", "opo", "remax", "gpg"]) {
    const { adv, ret } = run(name, { rewards, mask, index, values, rewardBaselines: tf.tensor1d([0.5, 0.5, 0.5, 1, 1, 1]), gamma: 0.9, lam: 0.95 });
    assert.ok(adv.every(Number.isFinite) && ret.every(Number.isFinite), `${name}: finite`);
    if (name !== "gae") mask.flat().forEach((m, k) => { if (m === 0) assert.equal(adv[k]! + 0, 0, `${name}: masked position ${k}`); });
  }
});
