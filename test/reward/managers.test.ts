import { test } from "node:test";
import assert from "node:assert/strict";
import { CharTokenizer } from "../../src/models/tokenizers/char.js";
import { NaiveRewardManager, BatchRewardManager, DapoRewardManager, getRewardManager, registerRewardManager } from "../../src/reward/managers/index.js";
import type { RewardManagerOptions, RewardManager, RewardResult } from "../../src/reward/types.js";
import { tensor } from "../../src/protocol/tensor.js";
import type { DataProto } from "../../src/protocol/data_proto.js";
import { makeBatch, rewardPositions, rowSums } from "./helpers.js";

const tok = new CharTokenizer("0123456789#+=-,.$ abcdefghijklmnopqrstuvwxyz\\{}");
const opts = (o: Partial<RewardManagerOptions> = {}): RewardManagerOptions => ({ tokenizer: tok, numExamine: 0, rewardFnKey: "data_source", rewardKwargs: {}, ...o });

const gsmRows = [
  { prompt: "1+1=", response: "#### 2", dataSource: "openai/gsm8k", groundTruth: "2" },
  { prompt: "2+2=", response: "#### 5", dataSource: "openai/gsm8k", groundTruth: "4" },
  { prompt: "x", response: "\\boxed{7}", dataSource: "lighteval/MATH", groundTruth: "7" },
  { prompt: "y", response: "", dataSource: "openai/gsm8k", groundTruth: "1" },
];

test("naive: built-in scorers by data_source, score at the last valid response token", async () => {
  const data = makeBatch(tok, gsmRows, 6, 12);
  const { rewardTensor, rewardExtraInfo } = await new NaiveRewardManager(opts({ numExamine: 1 })).compute(data);
  assert.deepEqual(rewardTensor.shape, [4, 12]);
  assert.deepEqual(rowSums(rewardTensor), [1, 0, 1, 0]);
  assert.deepEqual(rewardPositions(rewardTensor), [5, -1, 8, -1]);
  assert.deepEqual(rewardExtraInfo, {});
});

test("naive: valid length 0 puts the score in the last slot, as verl does", async () => {
  const data = makeBatch(tok, [{ prompt: "a", response: "", dataSource: "t", groundTruth: "" }], 2, 5);
  const fn = () => 0.5;
  const { rewardTensor } = await new NaiveRewardManager(opts({ computeScore: fn })).compute(data);
  assert.deepEqual(Array.from(rewardTensor.data), [0, 0, 0, 0, 0.5]);
});

test("naive: a custom function gets (data_source, solution, ground_truth, extra_info) and dict fields become reward_extra_info", async () => {
  const calls: unknown[][] = [];
  const fn = async (ds: string, sol: string, gt: unknown, extra: Record<string, unknown> | null) => {
    calls.push([ds, sol, gt, extra]);
    return { score: sol.length / 10, length: sol.length, tag: ds };
  };
  const data = makeBatch(tok, gsmRows.slice(0, 2), 6, 12);
  const { rewardTensor, rewardExtraInfo } = await new NaiveRewardManager(opts({ computeScore: fn })).compute(data);
  assert.deepEqual(calls[0], ["openai/gsm8k", "#### 2", "2", { index: 0, num_turns: null, rollout_reward_scores: {} }]);
  assert.deepEqual(rowSums(rewardTensor).map((x) => Math.round(x * 10) / 10), [0.6, 0.6]);
  assert.deepEqual(rewardExtraInfo, { score: [0.6, 0.6], length: [6, 6], tag: ["openai/gsm8k", "openai/gsm8k"] });
  assert.deepEqual(data.nonTensorBatch.extra_info![0], { index: 0 }, "the batch's extra_info is not modified");
});

test("managers: rm_scores in the batch wins; clear errors for missing keys", async () => {
  const data = makeBatch(tok, gsmRows.slice(0, 2), 6, 12);
  data.batch.rm_scores = tensor(new Float32Array(24).fill(0.25), [2, 12]);
  data.nonTensorBatch.judge = ["a", "b"];
  data.metaInfo.reward_extra_keys = ["judge"];
  for (const m of [new NaiveRewardManager(opts()), new BatchRewardManager(opts()), new DapoRewardManager(opts())]) {
    const r = await m.compute(data);
    assert.equal(r.rewardTensor, data.batch.rm_scores);
    assert.deepEqual(r.rewardExtraInfo, { judge: ["a", "b"] });
  }
  const plain = makeBatch(tok, gsmRows.slice(0, 1), 6, 12);
  await assert.rejects(new NaiveRewardManager(opts({ rewardFnKey: "source" })).compute(plain), /no non-tensor 'source' \(data.reward_fn_key\)/);
  plain.nonTensorBatch.reward_model = [{ style: "rule" }];
  await assert.rejects(new NaiveRewardManager(opts()).compute(plain), /row 0 \(data_source "openai\/gsm8k"\) has no reward_model.ground_truth/);
  const unknown = makeBatch(tok, [{ ...gsmRows[0]!, dataSource: "my/set" }], 6, 12);
  await assert.rejects(new NaiveRewardManager(opts()).compute(unknown), /data_source="my\/set".*Known data sources/);
});

test("batch: one call for the whole batch with reward kwargs; acc stored", async () => {
  let calls = 0;
  const fn = (dss: string[], sols: string[], gts: unknown[], extras: unknown[], kw: Record<string, unknown>) => {
    calls++;
    assert.equal(extras.length, dss.length);
    return sols.map((s, i) => (s.endsWith(String(gts[i])) ? kw.hit : { score: 0, why: "miss" }));
  };
  const data = makeBatch(tok, gsmRows.slice(0, 3), 6, 12);
  const r = await new BatchRewardManager(opts({ computeScore: fn, rewardKwargs: { hit: 2 } })).compute(data);
  assert.equal(calls, 1);
  assert.deepEqual(rowSums(r.rewardTensor), [2, 0, 0]);
  assert.deepEqual(r.rewardExtraInfo, { score: [0, 0], why: ["miss", "miss"] });
  assert.deepEqual(Array.from(data.batch.acc!.data), [2, 0, 0]);
  // Without a custom function the built-in scorers apply.
  const d2 = makeBatch(tok, gsmRows, 6, 12);
  assert.deepEqual(rowSums((await new BatchRewardManager(opts()).compute(d2)).rewardTensor), [1, 0, 1, 0]);
  await assert.rejects(new BatchRewardManager(opts({ computeScore: () => [1] })).compute(d2), /must return an array of 4 scores, got 1 items/);
});

test("dapo: overlong penalty min(-(len-(max-buf))/buf*factor, 0) and acc", async () => {
  const rows = [
    { prompt: "a", response: "#### 1", dataSource: "openai/gsm8k", groundTruth: "1" }, // 6 tokens
    { prompt: "a", response: "#### 12345", dataSource: "openai/gsm8k", groundTruth: "12345" }, // 10 tokens
    { prompt: "a", response: "#### 1", dataSource: "openai/gsm8k", groundTruth: "2" },
  ];
  const data = makeBatch(tok, rows, 2, 10);
  const m = new DapoRewardManager(opts({ rewardKwargs: { max_resp_len: 10, overlong_buffer_cfg: { enable: true, len: 4, penalty_factor: 1, log: true } } }));
  const r = await m.compute(data);
  // expected length 10-4 = 6: row 0 exceeds by 0, row 1 by 4 -> -1.0
  assert.deepEqual(rowSums(r.rewardTensor), [1, 0, 0]);
  assert.deepEqual(r.rewardExtraInfo.acc, [1, 1, 0]);
  assert.deepEqual(r.rewardExtraInfo.overlong_reward!.map((x) => Number(x) + 0), [0, -1, 0]);
  assert.deepEqual(r.rewardExtraInfo.overlong, [false, true, false]);
  assert.throws(() => new DapoRewardManager(opts({ rewardKwargs: { max_resp_len: 3, overlong_buffer_cfg: { enable: true, len: 4 } } })), /must be >= reward_model.overlong_buffer.len/);
  // Disabled buffer: plain scores.
  const plain = await new DapoRewardManager(opts()).compute(makeBatch(tok, rows, 2, 10));
  assert.deepEqual(rowSums(plain.rewardTensor), [1, 1, 0]);
});

test("registry: users register managers by name; unknown names list the known ones", async () => {
  class ConstantManager implements RewardManager {
    constructor(private readonly o: RewardManagerOptions) {}
    async compute(data: DataProto): Promise<RewardResult> {
      const R = data.batch.responses!.shape[1]!;
      return { rewardTensor: tensor(new Float32Array(data.length * R).fill(Number(this.o.rewardKwargs.value)), [data.length, R]), rewardExtraInfo: {} };
    }
  }
  registerRewardManager("test-constant", ConstantManager);
  registerRewardManager("test-constant", ConstantManager);
  assert.throws(() => registerRewardManager("test-constant", NaiveRewardManager), /already registered/);
  assert.throws(() => registerRewardManager("naive", ConstantManager), /already registered/);
  const M = getRewardManager("test-constant");
  const r = await new M(opts({ rewardKwargs: { value: 3 } })).compute(makeBatch(tok, gsmRows.slice(0, 1), 6, 6));
  assert.deepEqual(Array.from(r.rewardTensor.data), [3, 3, 3, 3, 3, 3]);
  assert.throws(() => getRewardManager("nope"), /unknown reward manager "nope".*known: batch, dapo, naive, prime/);
});
