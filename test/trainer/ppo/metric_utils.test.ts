import { test } from "node:test";
import assert from "node:assert/strict";
import {
  computeDataMetrics, computeThroughputMetrics, computeTimingMetrics, Metric, reduceMetrics,
} from "../../../src/trainer/ppo/metric_utils.js";
import { DataProto, tensor } from "../../../src/protocol/index.js";
import { close } from "./helpers.js";

function unbiasedVar(xs: number[]): number {
  const mu = xs.reduce((a, b) => a + b, 0) / xs.length;
  return xs.reduce((a, b) => a + (b - mu) ** 2, 0) / (xs.length - 1);
}

// Prompt width 2, response width 3. Row 0 is a full-length multi-turn response whose
// middle token is tool output (response_mask 0, attention 1); row 1 has one token;
// row 2 is aborted (no response tokens).
function batch(): DataProto {
  return DataProto.fromDict(
    {
      responses: tensor(new Int32Array(9), [3, 3]),
      attention_mask: tensor(new Int32Array([1, 1, 1, 1, 1, 0, 1, 1, 0, 0, 1, 1, 0, 0, 0]), [3, 5]),
      response_mask: tensor(new Int32Array([1, 0, 1, 1, 0, 0, 0, 0, 0]), [3, 3]),
      token_level_scores: tensor([0, 0, 1, 0.5, 0, 0, 0, 0, 0.7], [3, 3]),
      token_level_rewards: tensor([-0.1, 0, 1, 0.4, 0, 0, 0, 0, 0.7], [3, 3]),
      advantages: tensor([1, 99, 3, -2, 99, 99, 99, 99, 99], [3, 3]),
      returns: tensor([0.5, 9, 1.5, 2, 9, 9, 9, 9, 9], [3, 3]),
      values: tensor([0.4, 9, 1.0, 1.5, 9, 9, 9, 9, 9], [3, 3]),
    },
    { __num_turns__: [2, 1, 3] },
    { global_token_num: [5, 2, 2] },
  );
}

test("computeDataMetrics: scores and rewards over non-aborted rows, token stats over response_mask, lengths from attention_mask", () => {
  const m = computeDataMetrics(batch(), true);
  const expected: Record<string, number> = {
    "critic/score/mean": 0.75, "critic/score/max": 1, "critic/score/min": 0.5,
    "critic/rewards/mean": 0.65, "critic/rewards/max": 0.9, "critic/rewards/min": 0.4,
    "critic/advantages/mean": 2 / 3, "critic/advantages/max": 3, "critic/advantages/min": -2,
    "critic/returns/mean": 4 / 3, "critic/returns/max": 2, "critic/returns/min": 0.5,
    "critic/values/mean": 2.9 / 3, "critic/values/max": 1.5, "critic/values/min": 0.4,
    "critic/vf_explained_var": 1 - unbiasedVar([0.1, 0.5, 0.5]) / (unbiasedVar([0.5, 1.5, 2]) + 1e-5),
    "response_length/mean": 4 / 3, "response_length/max": 3, "response_length/min": 0, "response_length/clip_ratio": 1 / 3,
    "response_length_non_aborted/mean": 2, "response_length_non_aborted/max": 3, "response_length_non_aborted/min": 1,
    "response_length_non_aborted/clip_ratio": 0.5,
    "response/aborted_ratio": 1 / 3,
    "prompt_length/mean": 5 / 3, "prompt_length/max": 2, "prompt_length/min": 1, "prompt_length/clip_ratio": 2 / 3,
    "num_turns/min": 1, "num_turns/max": 3, "num_turns/mean": 2,
  };
  assert.deepEqual(Object.keys(m).sort(), Object.keys(expected).sort());
  for (const [k, v] of Object.entries(expected)) close(m[k]!, v, 1e-6, k);
  const noCritic = computeDataMetrics(batch(), false);
  assert.ok(!("critic/values/mean" in noCritic) && !("critic/vf_explained_var" in noCritic));
  const allAborted = batch();
  allAborted.batch.attention_mask = tensor(new Int32Array([1, 1, 0, 0, 0, 1, 1, 0, 0, 0, 1, 1, 0, 0, 0]), [3, 5]);
  assert.throws(() => computeDataMetrics(allAborted), /every response in the batch is empty/);
  const missing = batch();
  delete missing.batch.advantages;
  assert.throws(() => computeDataMetrics(missing), /batch key 'advantages' is missing/);
});

test("timing and throughput metrics", () => {
  const timing = { gen: 0.5, update_actor: 2, reward: 0.1, step: 4 };
  const t = computeTimingMetrics(batch(), timing);
  assert.deepEqual(Object.keys(t).sort(), ["timing_per_token_ms/gen", "timing_per_token_ms/update_actor", "timing_s/gen", "timing_s/reward", "timing_s/step", "timing_s/update_actor"]);
  close(t["timing_per_token_ms/gen"]!, 500 / 4, 1e-9);
  close(t["timing_per_token_ms/update_actor"]!, 2000 / 9, 1e-9);
  assert.deepEqual(computeThroughputMetrics(batch(), timing, 2), { "perf/total_num_tokens": 9, "perf/time_per_step": 4, "perf/throughput": 9 / 8 });
  assert.throws(() => computeThroughputMetrics(DataProto.fromDict({ x: tensor([1], [1]) }), timing, 1), /global_token_num/);
});

test("reduceMetrics: 'max'/'min' in the key pick the reducer, else mean; Metric keeps its own aggregation", () => {
  const r = reduceMetrics({
    "actor/pg_loss": [1, 2, 3],
    "response_length/max": [5, 8, 6],
    "critic/score/min": [0.1, 0.05],
    "actor/lr": 0.5,
    "empty": [],
    "summed": new Metric("sum", [1, 2, 3.5]),
  });
  assert.deepEqual(r, { "actor/pg_loss": 2, "response_length/max": 8, "critic/score/min": 0.05, "actor/lr": 0.5, empty: NaN, summed: 6.5 });
  const m = new Metric("max", 1);
  m.append(new Metric("max", [4, 2]));
  assert.equal(m.aggregate(), 4);
  assert.throws(() => m.extend(new Metric("sum", [1])), /aggregation mismatch/);
  assert.throws(() => new Metric("median"), /unsupported metric aggregation 'median'/);
});
