import { test } from "node:test";
import assert from "node:assert/strict";
import * as tf from "@tensorflow/tfjs";
import { loadConfig } from "../../src/config/index.js";
import { RewardModelWorker } from "../../src/workers/reward_model_worker.js";
import { syntheticBatch } from "./helpers.js";

test("the reward model scores each sequence at its last attended token and puts it at the last response token", async () => {
  const config = loadConfig({
    configName: "ppo_trainer",
    overrides: [
      "trainer.device=cpu", "actor_rollout_ref.model.path=scratch", "actor_rollout_ref.model.tokenizer_path=char:abcdefghijklmnopqrstuvwxyzABCD",
      "+actor_rollout_ref.model.override_config.hidden_size=16", "+actor_rollout_ref.model.override_config.num_hidden_layers=1",
      "+actor_rollout_ref.model.override_config.num_attention_heads=2",
      "reward_model.enable=true", "reward_model.model.path=scratch", "reward_model.micro_batch_size_per_gpu=3",
      "data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
      "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4", "algorithm.adv_estimator=grpo",
    ],
  });
  const worker = new RewardModelWorker(config);
  await worker.initModel();
  const data = syntheticBatch(5, 4, 6, 33, 21);
  const scores = (await worker.computeRmScore(data)).batch.rm_scores!;
  assert.deepEqual(scores.shape, [5, 6]);
  const mask = data.batch.response_mask!.data;
  // The same model, row by row: the value at the row's last attended column.
  const model = (worker as unknown as { model: { forward(ids: tf.Tensor2D, o: object): tf.Tensor2D } }).model;
  for (let b = 0; b < 5; b++) {
    let len = 0;
    for (let t = 0; t < 6; t++) len += mask[b * 6 + t]!;
    const row = data.slice(b, b + 1);
    const v = tf.tidy(() => model.forward(tf.tensor2d(row.batch.input_ids!.data as Int32Array, [1, 10], "int32"),
      { attentionMask: tf.tensor2d(row.batch.attention_mask!.data as Int32Array, [1, 10], "int32"), positionIds: tf.tensor2d(row.batch.position_ids!.data as Int32Array, [1, 10], "int32") }).dataSync());
    const last = 4 + len - 1;
    for (let t = 0; t < 6; t++) {
      const got = scores.data[b * 6 + t]!;
      if (t === len - 1) assert.ok(Math.abs(got - v[last]!) < 1e-5, `row ${b}: score ${got} vs value ${v[last]}`);
      else assert.equal(got, 0);
    }
  }
});
