import { before, test } from "node:test";
import assert from "node:assert/strict";
import * as tf from "@tensorflow/tfjs";
import {
  getAdvEstimator, getPolicyLoss, listAdvEstimators, listPolicyLosses, registerAdvEstimator, registerPolicyLoss,
  aggLoss, computeAdvantage,
} from "../../../../src/trainer/ppo/core_algos/index.js";
import type { AdvEstimatorFn, PolicyLossFn } from "../../../../src/trainer/ppo/core_algos/index.js";
import { DataProto, tensor } from "../../../../src/protocol/index.js";
import { closeAll, cpu, scalar, t2 } from "../helpers.js";

before(cpu);

test("built-ins are registered under verl's names", () => {
  for (const name of ["gae", "grpo", "grpo_vectorized", "grpo_passk", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "rloo", "rloo_vectorized", "opo", "remax", "gpg"]) {
    assert.ok(listAdvEstimators().includes(name), name);
  }
  for (const name of ["vanilla", "gspo", "sapo", "gpg", "clip_cov", "kl_cov", "geo_mean", "cispo"]) assert.ok(listPolicyLosses().includes(name), name);
});

test("same function twice is fine, a different one under a taken name is an error, unknown names list the known ones", () => {
  const fn: AdvEstimatorFn = (a) => ({ advantages: tf.zerosLike(a.tokenLevelRewards) as tf.Tensor2D, returns: tf.zerosLike(a.tokenLevelRewards) as tf.Tensor2D });
  registerAdvEstimator("zero_test", fn);
  registerAdvEstimator("zero_test", fn);
  assert.equal(getAdvEstimator("zero_test"), fn);
  assert.throws(() => registerAdvEstimator("zero_test", (a) => fn(a)), /advantage estimator 'zero_test' is already registered with a different value/);
  assert.throws(() => registerAdvEstimator("grpo", fn), /already registered/);
  assert.throws(() => getAdvEstimator("GAE"), /unknown advantage estimator 'GAE' \(known: gae, grpo/);
  assert.throws(() => getPolicyLoss("ppo"), /unknown policy loss 'ppo' \(known: vanilla/);
  const loss: PolicyLossFn = (a) => ({ pgLoss: aggLoss(tf.neg(a.logProb), a.responseMask, a.lossAggMode ?? "token-mean"), metrics: {} });
  registerPolicyLoss("neg_logp_test", loss);
  assert.throws(() => registerPolicyLoss("vanilla", loss), /policy loss 'vanilla' is already registered/);
  const out = getPolicyLoss("neg_logp_test")({ oldLogProb: t2([[0, 0]]), logProb: t2([[-1, -3]]), advantages: t2([[1, 1]]), responseMask: t2([[1, 0]]), config: {} });
  assert.equal(scalar(out.pgLoss), 1);
});

test("a custom estimator runs through computeAdvantage with verl's argument names", async () => {
  // "Mean of the others": each row's score minus the mean score of the rest of the batch.
  registerAdvEstimator("batch_loo_test", ({ tokenLevelRewards, responseMask, index, config }) => {
    assert.deepEqual(index, ["p", "p", "q"]);
    assert.equal(config?.adv_estimator, "batch_loo_test");
    return tf.tidy(() => {
      const s = tf.sum(tokenLevelRewards, -1);
      const n = s.shape[0]!;
      const others = tf.div(tf.sub(tf.sum(s), s), n - 1);
      const adv = tf.mul(tf.expandDims(tf.sub(s, others), -1), responseMask) as tf.Tensor2D;
      return { advantages: adv, returns: adv };
    });
  });
  const data = DataProto.fromDict(
    { token_level_rewards: tensor([0, 1, 0, 0, 2, 0], [3, 2]), response_mask: tensor(new Int32Array([1, 1, 1, 0, 1, 1]), [3, 2]) },
    { uid: ["p", "p", "q"] },
  );
  await computeAdvantage(data, { advEstimator: "batch_loo_test", config: { adv_estimator: "batch_loo_test" } });
  // scores 1, 0, 2 → minus the mean of the other two: 0, −1.5, 1.5.
  closeAll(Array.from(data.batch.advantages!.data), [0, 0, -1.5, 0, 1.5, 1.5], 1e-6);
});
