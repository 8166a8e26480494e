// A null reward_model.ground_truth: the built-in scorers refuse the row (naming it) instead of
// scoring 0, a custom compute_score still receives null (as verl passes None), and the dataset
// warns at load naming the file rows.
import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { CharTokenizer } from "../../src/models/tokenizers/char.js";
import { NaiveRewardManager } from "../../src/reward/managers/index.js";
import type { RewardManagerOptions } from "../../src/reward/types.js";
import { writeParquet } from "../../src/data/parquet.js";
import { RLHFDataset } from "../../src/data/rl_dataset.js";
import { logger } from "../../src/utils/logger.js";
import { makeBatch, rowSums } from "./helpers.js";

const tok = new CharTokenizer("0123456789#+=-,.$ abcdefghijklmnopqrstuvwxyz\\{}");
const opts = (o: Partial<RewardManagerOptions> = {}): RewardManagerOptions => ({ tokenizer: tok, numExamine: 0, rewardFnKey: "data_source", rewardKwargs: {}, ...o });

test("a built-in scorer refuses a null ground truth, naming the row, instead of scoring 0", async () => {
  const rows = [
    { prompt: "1+1=", response: "#### 2", dataSource: "openai/gsm8k", groundTruth: "2", extraInfo: { index: 0, split: "train" } },
    { prompt: "2+2=", response: "#### 4", dataSource: "openai/gsm8k", groundTruth: null, extraInfo: { index: 17, split: "train" } },
  ];
  await assert.rejects(new NaiveRewardManager(opts()).compute(makeBatch(tok, rows, 6, 12)),
    /reward: a data_source "openai\/gsm8k" row \(extra_info\.index 17, split train\) has a null reward_model\.ground_truth, and the built-in scorer cannot score without one .*custom_reward_function\.path/);
  const math = [{ prompt: "x", response: "\\boxed{7}", dataSource: "lighteval/MATH", groundTruth: null, extraInfo: { index: 3 } }];
  await assert.rejects(new NaiveRewardManager(opts()).compute(makeBatch(tok, math, 6, 12)), /"lighteval\/MATH" row \(extra_info\.index 3\) has a null reward_model\.ground_truth/);
});

test("a custom compute_score still gets the null ground truth", async () => {
  const seen: unknown[] = [];
  const custom = (_ds: string, _s: string, gt: unknown) => { seen.push(gt); return gt === null ? 0.5 : 1; };
  const rows = [{ prompt: "1+1=", response: "#### 2", dataSource: "openai/gsm8k", groundTruth: null }];
  const r = await new NaiveRewardManager(opts({ computeScore: custom })).compute(makeBatch(tok, rows, 6, 12));
  assert.deepEqual(seen, [null]);
  assert.deepEqual(rowSums(r.rewardTensor), [0.5]);
});

test("the RL dataset warns at load naming the file rows with a null ground truth", async () => {
  const dir = mkdtempSync(join(tmpdir(), "verl-gt-"));
  const log = logger();
  const warnings: string[] = [];
  const warn = log.warn;
  log.warn = ((msg: unknown) => { warnings.push(String(msg)); }) as typeof log.warn;
  try {
    const file = join(dir, "t.parquet");
    const row = (gt: string | null) => ({ data_source: "openai/gsm8k", prompt: [{ role: "user", content: "q" }], reward_model: { style: "rule", ground_truth: gt } });
    await writeParquet(file, [row("1"), row(null), row("3"), row(null)]);
    new RLHFDataset(file, null, { max_prompt_length: 10, filter_overlong_prompts: false });
    assert.equal(warnings.length, 1, warnings.join("\n"));
    assert.match(warnings[0]!, /^2 row\(s\) have a null reward_model\.ground_truth \(.*t\.parquet row 1; .*t\.parquet row 3\): the built-in scorers refuse such rows/);
    warnings.length = 0;
    await writeParquet(file, [row("1")]);
    new RLHFDataset(file, null, { max_prompt_length: 10, filter_overlong_prompts: false });
    assert.deepEqual(warnings, []);
  } finally {
    log.warn = warn;
    rmSync(dir, { recursive: true, force: true });
  }
});
