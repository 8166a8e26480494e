// Issue 28 item 14: bad input found from outside. Invalid UTF-8 in a JSON-lines
// prompt file is refused naming file and line; a key (or value) nested thousands
// deep is refused with the limit instead of overflowing the stack; a finite reward
// beyond float32 (the reward tensor's type) is an error naming the row, not a
// "non-finite" count; a restart writes one validation row at the resumed step, not
// one more per restart.
import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { RLHFDataset } from "../../src/data/rl_dataset.js";
import { parseOverride, MAX_CONFIG_DEPTH } from "../../src/config/overrides.js";
import { CharTokenizer } from "../../src/models/tokenizers/char.js";
import { NaiveRewardManager } from "../../src/reward/managers/index.js";
import { Tracking } from "../../src/utils/tracking.js";
import { makeBatch } from "../reward/helpers.js";

process.env.VERL_LOG_LEVEL ??= "fatal";

function inDir<T>(body: (dir: string) => T): T {
  const dir = mkdtempSync(join(tmpdir(), "verl-badinput-"));
  try {
    return body(dir);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

test("invalid UTF-8 in a JSON-lines prompt file is refused, naming the file and the line", () => inDir((dir) => {
  const f = join(dir, "train.jsonl");
  const good = Buffer.from('{"data_source":"a","prompt":[{"role":"user","content":"hi"}],"reward_model":{"ground_truth":"1"}}\n');
  const bad = Buffer.concat([Buffer.from('{"data_source":"a","prompt":[{"role":"user","content":"caf'), Buffer.from([0xe9]), Buffer.from('"}],"reward_model":{"ground_truth":"1"}}\n')]);
  writeFileSync(f, Buffer.concat([good, good, bad]));
  assert.throws(() => new RLHFDataset(f, null, { prompt_key: "prompt", filter_overlong_prompts: false }),
    new RegExp(`^Error: ${f}:3: not valid UTF-8 \\(byte 0xe9 at column 59 of the line\\)`));
  writeFileSync(f, Buffer.concat([good, Buffer.from("caf\u00e9 ok? no: ", "utf8"), Buffer.from("\n")]));
  assert.throws(() => new RLHFDataset(f, null, { prompt_key: "prompt", filter_overlong_prompts: false }), /train\.jsonl:2: not valid JSON/);
  // valid multi-byte text is fine
  writeFileSync(f, Buffer.concat([good, Buffer.from('{"data_source":"a","prompt":[{"role":"user","content":"café ☕ 𝄞"}],"reward_model":{"ground_truth":"1"}}\n', "utf8")]));
  assert.equal(new RLHFDataset(f, null, { prompt_key: "prompt", filter_overlong_prompts: false }).length, 2);
}));

test("a 5000-segment key, or a value nested 5000 deep, is refused with the limit", () => {
  const key = Array.from({ length: 5000 }, () => "a").join(".");
  assert.throws(() => parseOverride(`+${key}=1`), new RegExp(`nests 5000 levels deep \\(5000 key segments\\); config keys and values are limited to ${MAX_CONFIG_DEPTH} levels`));
  assert.throws(() => parseOverride(`+x=${"[".repeat(5000)}${"]".repeat(5000)}`), /nests 5001 levels deep .*limited to 64 levels/);
  // ordinary keys and numbers are untouched
  assert.equal(parseOverride("trainer.total_training_steps=100").override.value, 100);
  assert.deepEqual(parseOverride("+a.b=[[1,2],[3]]").override.value, [[1, 2], [3]]);
});

test("a finite reward beyond float32 is an error naming the row, not a non-finite reward", async () => {
  const tok = new CharTokenizer("0123456789 abcdefghijklmnopqrstuvwxyz");
  const data = makeBatch(tok, [
    { prompt: "q", response: "a", dataSource: "d", groundTruth: "1" },
    { prompt: "q", response: "b", dataSource: "d", groundTruth: "1" },
  ], 2, 4);
  const mgr = new NaiveRewardManager({ tokenizer: tok, numExamine: 0, rewardFnKey: "data_source", rewardKwargs: {}, computeScore: (_d, s) => (s === "b" ? 1e308 : 3e38) });
  await assert.rejects(mgr.compute(data), /row 1 \(data_source "d"\): reward 1e\+308 is finite but beyond float32's range \(±3\.4e38\), the reward tensor's type/);
});

test("each restart writes one validation row at the resumed step, replacing the previous restart's", () => inDir((dir) => {
  const path = join(dir, "metrics.jsonl");
  const prev = process.env.VERL_FILE_LOGGER_PATH;
  process.env.VERL_FILE_LOGGER_PATH = path;
  try {
    const run = () => new Tracking({ projectName: "p", experimentName: "e", backends: "file" });
    const first = run();
    first.begin(0);
    first.log({ "val-core/x": 0.1 }, 0);
    for (const s of [1, 2]) first.log({ "critic/score/mean": s }, s);
    for (let restart = 0; restart < 3; restart++) {
      const t = run();
      t.begin(2, undefined, { rowsAtResumedStep: 1 }); // as the PPO trainer declares it
      t.log({ "val-core/x": 0.2 }, 2); // val_before_train at the resumed step, as verl logs it
    }
    const rows = readFileSync(path, "utf8").trim().split("\n").map((l) => JSON.parse(l) as { step: number; data: Record<string, number> });
    assert.deepEqual(rows.map((r) => [r.step, Object.keys(r.data)[0]]), [[0, "val-core/x"], [1, "critic/score/mean"], [2, "critic/score/mean"], [2, "val-core/x"]]);
  } finally {
    if (prev === undefined) delete process.env.VERL_FILE_LOGGER_PATH; else process.env.VERL_FILE_LOGGER_PATH = prev;
  }
}));
