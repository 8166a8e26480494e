import { test } from "node:test";
import assert from "node:assert/strict";
import { extractGsm8kSolution, gsm8kComputeScore } from "../../src/reward/scorers/gsm8k.js";
import { isEquiv, lastBoxedOnlyString, mathComputeScore, stripString } from "../../src/reward/scorers/math.js";
import { defaultComputeScore, knownDataSources, registerScorer } from "../../src/reward/scorers/registry.js";
import { GSM8K_FLEXIBLE, GSM8K_STRICT, MATH } from "./verl_score_vectors.js";

test("gsm8k strict: matches verl on several ####, commas, negatives, $, trailing period, the 300-char window", () => {
  for (const [s, gt, extracted, score] of GSM8K_STRICT) {
    assert.equal(extractGsm8kSolution(s, "strict"), extracted, JSON.stringify(s.slice(0, 50)));
    assert.equal(gsm8kComputeScore(s, gt), score, JSON.stringify([s.slice(0, 50), gt]));
  }
});

test("gsm8k flexible: last number-like run, commas kept, '.' skipped", () => {
  for (const [s, gt, extracted, score] of GSM8K_FLEXIBLE) {
    assert.equal(extractGsm8kSolution(s, "flexible"), extracted, JSON.stringify(s));
    assert.equal(gsm8kComputeScore(s, gt, { method: "flexible" }), score, JSON.stringify([s, gt]));
  }
  assert.equal(gsm8kComputeScore("#### 4", "5", { formatScore: 0.1 }), 0.1);
  assert.equal(gsm8kComputeScore("#### 4", 4), 1, "a numeric ground truth is compared as its string");
  assert.throws(() => extractGsm8kSolution("x", "loose" as "strict"), /method must be "strict" or "flexible"/);
});

test("gsm8k: the 300-character window counts code points like Python", () => {
  const emoji = "🙂".repeat(299);
  assert.equal(extractGsm8kSolution(`#### 5${emoji}`), null); // "#### 5" is cut: 300 code points keep only "5" + emoji
  assert.equal(extractGsm8kSolution(`#### 5${"🙂".repeat(294)}`), "5");
});

test("math: boxed extraction and normalisation match verl (nested braces, \\frac/\\dfrac, units, %, degrees, a/b, 0.5)", () => {
  for (const [s, gt, boxed, score] of MATH) {
    assert.equal(lastBoxedOnlyString(s), boxed, JSON.stringify(s));
    assert.equal(mathComputeScore(s, gt), score, JSON.stringify([s, gt]));
  }
});

test("math: strip_string pieces", () => {
  assert.equal(stripString("\\dfrac12"), "\\frac{1}{2}");
  assert.equal(stripString("0.5"), "\\frac{1}{2}");
  assert.equal(stripString(".5"), "\\frac{1}{2}");
  assert.equal(stripString("3/4"), "\\frac{3}{4}");
  assert.equal(stripString("k = \\sqrt3"), "\\sqrt{3}");
  assert.equal(stripString("5\\text{ inches}"), "5");
  assert.ok(isEquiv("\\left(3, 4\\right)", "(3,4)"));
  assert.ok(!isEquiv("3", null));
  assert.ok(isEquiv(null, null));
  // verl falls back to raw equality when normalisation raises (two "\text{ " here).
  assert.ok(isEquiv("1\\text{ a}\\text{ b}", "1\\text{ a}\\text{ b}"));
  assert.ok(!isEquiv("1\\text{ a}\\text{ b}", "1"));
});

test("registry: dispatch by data_source, clear error for unknown ones, registerScorer rules", async () => {
  assert.equal(await defaultComputeScore("openai/gsm8k", "#### 3", "3"), 1);
  assert.equal(await defaultComputeScore("HuggingFaceH4/MATH-500", "\\boxed{\\dfrac{1}{2}}", "\\frac12"), 1);
  assert.throws(
    () => defaultComputeScore("my/dataset", "x", "y"),
    (e: Error) => /data_source="my\/dataset"/.test(e.message) && /openai\/gsm8k/.test(e.message) && /registerScorer/.test(e.message),
  );
  const exact = (s: string, gt: unknown) => ({ score: s.trim() === gt ? 1 : 0, exact: true });
  registerScorer("test/exact", exact);
  registerScorer("test/exact", exact); // same function again: fine
  assert.deepEqual(await defaultComputeScore("test/exact", " a ", "a"), { score: 1, exact: true });
  assert.throws(() => registerScorer("test/exact", () => 0), /already has a scorer/);
  assert.throws(() => registerScorer("openai/gsm8k", () => 0), /already has a built-in scorer/);
  registerScorer("test/async-bool", async (s) => s === "yes");
  assert.equal(await defaultComputeScore("test/async-bool", "yes", null), 1);
  registerScorer("test/bad", () => ({ value: 1 }) as never);
  assert.throws(() => defaultComputeScore("test/bad", "", ""), /needs a numeric 'score'/);
  assert.ok(knownDataSources().includes("lighteval/MATH"));
});
