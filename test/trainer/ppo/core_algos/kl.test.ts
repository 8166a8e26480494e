import { before, test } from "node:test";
import assert from "node:assert/strict";
import * as tf from "@tensorflow/tfjs";
import {
  AdaptiveKLController, FixedKLController, applyKlPenalty, getKlController, klPenalty,
} from "../../../../src/trainer/ppo/core_algos/index.js";
import { tensor } from "../../../../src/protocol/tensor.js";
import type { DataProtoLike } from "../../../../src/trainer/ppo/core_algos/index.js";
import { close, closeAll, cpu, read, testVectors } from "../helpers.js";

before(cpu);

const ALIASES: Record<string, string> = { k1: "kl", k2: "mse", k3: "low_var_kl" };

test("k1 / abs / k2 / k3 and their verl aliases match the reference vectors", (t) => {
  const tv = testVectors();
  if (!tv) return t.skip("../shared/reference/test-vectors.json absent");
  const pairs = tv["kl_pairs(logprob,ref)"] as [number, number][];
  const lp = tf.tensor1d(pairs.map((p) => p[0])), ref = tf.tensor1d(pairs.map((p) => p[1]));
  const kl = tv.kl as Record<string, number[]>;
  for (const kind of ["k1", "abs", "k2", "k3"]) {
    closeAll(read(klPenalty(lp, ref, kind)), kl[kind]!, 1e-5, kind);
    if (ALIASES[kind]) closeAll(read(klPenalty(lp, ref, ALIASES[kind]!)), kl[kind]!, 1e-5, ALIASES[kind]);
    closeAll(read(klPenalty(lp, ref, `${kind}+`)), kl[kind]!, 1e-5, `${kind}+ value`);
  }
});

test("k3 clamps; the '+' kinds keep their value but take the k2 gradient (logπ − ref)", () => {
  const lp = tf.tensor1d([-1, -3, -0.2, -30]), ref = tf.tensor1d([-1.5, -0.5, -0.2, -1]);
  const d = [0.5, -2.5, 0, -29];
  // k3 of log(ref/π) = 29 would be e^20-ish after the inner clamp; the outer clamp holds it at 10.
  close(read(klPenalty(lp, ref, "k3"))[3]!, 10, 1e-6);
  for (const kind of ["k1+", "abs+", "k3+", "low_var_kl+", "k2+"]) {
    const g = tf.grad((x: tf.Tensor) => tf.sum(klPenalty(x, ref, kind)))(lp);
    closeAll(read(g), d, 1e-5, `${kind} gradient`);
  }
  // Without '+', k1's gradient is 1 and k3's is 1 − e^(ref−π) (zero where clamped).
  closeAll(read(tf.grad((x: tf.Tensor) => tf.sum(klPenalty(x, ref, "k1")))(lp)), [1, 1, 1, 1], 0, "k1 gradient");
  const k3g = read(tf.grad((x: tf.Tensor) => tf.sum(klPenalty(x, ref, "k3")))(lp));
  closeAll(k3g.slice(0, 3), [1 - Math.exp(-0.5), 1 - Math.exp(2.5), 0], 1e-5, "k3 gradient");
  assert.throws(() => klPenalty(lp, ref, "full"), /'full' .* not implemented/);
  assert.throws(() => klPenalty(lp, ref, "k4"), /unknown kl_penalty 'k4'; choose one of kl, k1/);
});

test("controllers: fixed stays, adaptive moves by clip(kl/target − 1, ±0.2)·n/horizon", () => {
  const fixed = getKlController({ type: "fixed", kl_coef: 0.05 });
  assert.ok(fixed instanceof FixedKLController);
  fixed.update(10, 100);
  assert.equal(fixed.value, 0.05);
  const ad = getKlController({ type: "adaptive", kl_coef: 0.1, target_kl: 0.02, horizon: 1000 });
  assert.ok(ad instanceof AdaptiveKLController);
  ad.update(0.03, 64); // error 0.5 → clipped to 0.2
  close(ad.value, 0.1 * (1 + (0.2 * 64) / 1000), 1e-12);
  ad.update(0.019, 10); // error −0.05
  close(ad.value, 0.1 * (1 + (0.2 * 64) / 1000) * (1 + (-0.05 * 10) / 1000), 1e-12);
  assert.throws(() => getKlController({ type: "adaptive", horizon: 0 }), /horizon must be larger than 0/);
  assert.throws(() => getKlController({ type: "pid" }), /unknown algorithm.kl_ctrl.type 'pid'/);
});

test("applyKlPenalty subtracts β·kl on response tokens and reports the mean per-sequence KL", async () => {
  const data: DataProtoLike = {
    batch: {
      token_level_scores: tensor([0, 0, 1, 0, 0, 0.5], [2, 3]),
      old_log_probs: tensor([-1, -2, -0.5, -1, -1, -1], [2, 3]),
      ref_log_prob: tensor([-1.5, -1, -0.5, -2, -1, -9], [2, 3]),
      response_mask: tensor(new Int32Array([1, 1, 1, 1, 1, 0]), [2, 3]),
    },
    nonTensorBatch: {},
    metaInfo: {},
  };
  const ctrl = new AdaptiveKLController(0.1, 0.1, 100);
  const metrics = await applyKlPenalty(data, ctrl, "kl");
  const kld = [0.5, -1, 0, 1, 0, 0];
  closeAll(Array.from(data.batch.token_level_rewards!.data), [0, 0, 1, 0, 0, 0.5].map((s, k) => s - 0.1 * kld[k]!), 1e-6, "rewards");
  const current = ((0.5 - 1 + 0) / 3 + (1 + 0) / 2) / 2;
  close(metrics["actor/reward_kl_penalty"]!, current, 1e-6);
  assert.equal(metrics["actor/reward_kl_penalty_coeff"], 0.1);
  close(ctrl.value, 0.1 * (1 + (Math.min(Math.max(current / 0.1 - 1, -0.2), 0.2) * 2) / 100), 1e-6);
  await assert.rejects(applyKlPenalty({ ...data, batch: { token_level_scores: data.batch.token_level_scores!, old_log_probs: data.batch.old_log_probs!, response_mask: data.batch.response_mask! } }, ctrl), /batch key 'ref_log_prob' is missing/);
});
