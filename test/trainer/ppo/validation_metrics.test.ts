import { test } from "node:test";
import assert from "node:assert/strict";
import {
  bootstrapMetric, calcMajVal, genNs, processValidationMetrics, validationMetricsToDict,
} from "../../../src/trainer/ppo/validation_metrics.js";
import { close, testVectors } from "./helpers.js";

test("gen_ns matches the reference vectors", (t) => {
  const tv = testVectors();
  if (!tv) return t.skip("../shared/reference/test-vectors.json absent");
  for (const [n, ns] of Object.entries(tv.val_gen_ns as Record<string, number[]>)) assert.deepEqual(genNs(Number(n)), ns, `N=${n}`);
});

/** E[max of n draws with replacement] over distinct sorted values. */
function expectedBest(values: number[], n: number): number {
  const s = [...values].sort((a, b) => a - b), N = s.length;
  return s.reduce((acc, v, k) => acc + v * (((k + 1) / N) ** n - (k / N) ** n), 0);
}

test("mean@N, std@N (population) and bootstrap best/worst@n per data source, averaged over prompts", () => {
  const rewards = [0, 1, 0.5, 1, /* p2 */ 0, 0, 0, 1, /* other source */ 1, 1];
  const sources = ["gsm8k", "gsm8k", "gsm8k", "gsm8k", "gsm8k", "gsm8k", "gsm8k", "gsm8k", "math", "math"];
  const uids = ["p1", "p1", "p1", "p1", "p2", "p2", "p2", "p2", "p3", "p3"];
  const out = processValidationMetrics(sources, uids, { reward: rewards, pred: rewards.map(String) });
  const g = out.gsm8k!.reward!;
  close(g["mean@4"]!, (0.625 + 0.25) / 2, 1e-12);
  const pstd = (xs: number[]) => { const mu = xs.reduce((a, b) => a + b) / xs.length; return Math.sqrt(xs.reduce((a, b) => a + (b - mu) ** 2, 0) / xs.length); };
  close(g["std@4"]!, (pstd([0, 1, 0.5, 1]) + pstd([0, 0, 0, 1])) / 2, 1e-12);
  for (const n of [2, 4]) {
    const exp = (expectedBest([0, 1, 0.5, 1], n) + expectedBest([0, 0, 0, 1], n)) / 2;
    close(g[`best@${n}/mean`]!, exp, 0.05, `best@${n}`);
    assert.ok(g[`worst@${n}/mean`]! <= g["mean@4"]! && g["mean@4"]! <= g[`best@${n}/mean`]!);
  }
  assert.ok("maj@4/mean" in g && "maj@2/std" in g);
  assert.ok(!("pred" in out.gsm8k!), "string variables are skipped");
  assert.deepEqual(out.math!.reward, { ...out.math!.reward, "mean@2": 1, "std@2": 0, "best@2/mean": 1, "worst@2/mean": 1 });
  // Same seed, same numbers; another seed, other numbers.
  assert.deepEqual(processValidationMetrics(sources, uids, { reward: rewards }), processValidationMetrics(sources, uids, { reward: rewards }));
  assert.notEqual(processValidationMetrics(sources, uids, { reward: rewards }, 7).gsm8k!.reward!["best@2/mean"], g["best@2/mean"]);
  assert.throws(() => processValidationMetrics(sources, uids.slice(1), { reward: rewards }), /uids for 10 samples/);
});

test("val-core holds mean/maj/best at the largest n of the core variable (acc if present); the rest is val-aux", () => {
  const sources = Array(4).fill("ds");
  const uids = ["u", "u", "u", "u"];
  const nested = processValidationMetrics(sources, uids, { reward: [1, 0, 1, 1], acc: [true, false, true, true], pred: ["7", "3", "7", "7"] });
  const flat = validationMetricsToDict(nested, [1, 2, 2]);
  const core = Object.keys(flat).filter((k) => k.startsWith("val-core/")).sort();
  assert.deepEqual(core, ["val-core/ds/acc/best@4/mean", "val-core/ds/acc/best@4/std", "val-core/ds/acc/maj@4/mean", "val-core/ds/acc/maj@4/std", "val-core/ds/acc/mean@4"]);
  assert.ok("val-aux/ds/reward/mean@4" in flat && "val-aux/ds/acc/std@4" in flat && "val-aux/ds/acc/best@2/mean" in flat);
  close(flat["val-core/ds/acc/mean@4"]!, 0.75, 1e-12);
  assert.deepEqual([flat["val-aux/num_turns/min"], flat["val-aux/num_turns/max"]], [1, 2]);
  close(flat["val-aux/num_turns/mean"]!, 5 / 3, 1e-12);
});

test("bootstrap and majority vote helpers", () => {
  const [[mu, sd]] = bootstrapMetric([3, 3, 3], 2, [(s) => s.reduce((a, b) => a + b, 0)]) as [[number, number]];
  assert.deepEqual([mu, sd], [6, 0]);
  assert.equal(calcMajVal([{ pred: "A", val: 0.9 }, { pred: "B", val: 0.8 }, { pred: "A", val: 0.7 }], "pred", "val"), 0.9);
  // Tie: the vote seen first wins.
  assert.equal(calcMajVal([{ pred: "B", val: 0.2 }, { pred: "A", val: 0.1 }], "pred", "val"), 0.2);
  assert.throws(() => bootstrapMetric([], 2, [() => 0]), /no data/);
});
