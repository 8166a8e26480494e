import { before, test } from "node:test";
import assert from "node:assert/strict";
import { computeAdvantage, computeResponseMask, pfPpoSampleIndices } from "../../../../src/trainer/ppo/core_algos/index.js";
import { DataProto, tensor } from "../../../../src/protocol/index.js";
import { Rng } from "../../../../src/utils/rng.js";
import { closeAll, cpu } from "../helpers.js";

before(cpu);

function batch(): DataProto {
  // 2 prompts × 2 samples; prompt width 3 (left-padded), response width 3; row 2 has an empty response.
  return DataProto.fromDict(
    {
      responses: tensor(new Int32Array(12), [4, 3]),
      attention_mask: tensor(new Int32Array([0, 1, 1, 1, 1, 0, 1, 1, 1, 1, 0, 0, 0, 0, 1, 0, 0, 0, 1, 1, 1, 1, 1, 1]), [4, 6]),
      token_level_rewards: tensor([0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1], [4, 3]),
      token_level_scores: tensor([0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1], [4, 3]),
      values: tensor([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2], [4, 3]),
    },
    { uid: ["a", "a", "b", "b"] },
  );
}

test("computeAdvantage derives response_mask from attention_mask and writes grpo advantages/returns", async () => {
  const data = batch();
  await computeAdvantage(data, { advEstimator: "grpo", normAdvByStdInGrpo: false });
  assert.deepEqual(Array.from(data.batch.response_mask!.data), [1, 1, 0, 1, 0, 0, 0, 0, 0, 1, 1, 1]);
  // scores 1, 0 | 0, 1 → ±0.5 over each row's response tokens.
  closeAll(Array.from(data.batch.advantages!.data), [0.5, 0.5, 0, -0.5, 0, 0, 0, 0, 0, 0.5, 0.5, 0.5], 1e-6);
  assert.deepEqual(Array.from(data.batch.returns!.data), Array.from(data.batch.advantages!.data));
  assert.deepEqual(computeResponseMask(data).shape, [4, 3]);
});

test("computeAdvantage passes gamma/lam and values to gae; errors name the missing key", async () => {
  const data = batch();
  await computeAdvantage(data, { advEstimator: "gae", gamma: 1, lam: 1 });
  assert.equal(data.batch.advantages!.shape.join(), "4,3");
  const noValues = batch();
  delete noValues.batch.values;
  await assert.rejects(computeAdvantage(noValues, { advEstimator: "gae" }), /needs `values`/);
  const noRewards = batch();
  delete noRewards.batch.token_level_rewards;
  await assert.rejects(computeAdvantage(noRewards, { advEstimator: "grpo" }), /batch key 'token_level_rewards' is missing/);
  await assert.rejects(computeAdvantage(batch(), { advEstimator: "nope" }), /unknown advantage estimator 'nope'/);
});

test("PF-PPO resamples a GAE batch with replacement, favouring high |score| (pow) and reproducibly", async () => {
  const config = { use_pf_ppo: true, pf_ppo: { reweight_method: "pow", weight_pow: 2 } };
  const a = await computeAdvantage(batch(), { advEstimator: "gae", config, rng: new Rng(9) });
  const b = await computeAdvantage(batch(), { advEstimator: "gae", config, rng: new Rng(9) });
  assert.equal(a.length, 4);
  assert.deepEqual(a.nonTensorBatch.uid, b.nonTensorBatch.uid);
  await assert.rejects(computeAdvantage(batch(), { advEstimator: "gae", config }), /needs `rng`/);
  // Scores 0 get weight 1e-8: with scores [0, 1, 0, 1] only rows 1 and 3 are drawn.
  const idx = pfPpoSampleIndices([0, 1, 0, 1], "pow", 2, new Rng(1));
  assert.ok(idx.every((i) => i === 1 || i === 3));
  assert.deepEqual(pfPpoSampleIndices([0.2, 0.9, 0.1], "max_min", 1, new Rng(2)).filter((i) => i === 0).length, 0);
  assert.throws(() => pfPpoSampleIndices([1], "uniform", 1, new Rng(1)), /reweight_method 'uniform'/);
});
