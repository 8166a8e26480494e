import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, mkdirSync, writeFileSync, readFileSync, existsSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { readParquet, writeParquet } from "../../src/data/parquet.js";
import {
  getPreprocessor, registerPreprocessor, listPreprocessors, ARITHMETIC_ALPHABET, arithmeticPairs,
} from "../../src/data/preprocess/index.js";
import { sharedPath } from "../../src/utils/paths.js";

function tmp(): string {
  return mkdtempSync(join(tmpdir(), "verl-pre-"));
}

// The expected row, computed here from the raw record without the preprocessor's code.
function expectedGsm8kRow(q: string, a: string, split: string, index: number): Record<string, unknown> {
  const tail = a.split("#### ")[1]!;
  const gt = tail.match(/^-?[\d.,]+/)![0].replace(/,/g, "");
  return {
    data_source: "openai/gsm8k",
    prompt: [{ role: "user", content: q + " " + "Let's think step by step and output the final answer after \"####\"." }],
    ability: "math",
    reward_model: { style: "rule", ground_truth: gt },
    extra_info: { split, index, answer: a, question: q },
  };
}

test("gsm8k from the shared jsonl matches verl's layout row for row", async (t) => {
  const src = sharedPath("data", "gsm8k");
  if (!src) { t.skip("../shared/data/gsm8k absent"); return; }
  const out = tmp();
  try {
    const res = await getPreprocessor("gsm8k")({ localDatasetPath: src, localSaveDir: out });
    assert.deepEqual(res.rows, { train: 7473, test: 1319 });
    assert.deepEqual(res.files, [join(out, "train.parquet"), join(out, "test.parquet")]);
    for (const split of ["train", "test"]) {
      const raw: { question: string; answer: string }[] = readFileSync(join(src, `${split}.jsonl`), "utf8").trim().split("\n").map((l) => JSON.parse(l) as { question: string; answer: string });
      const rows = await readParquet(join(out, `${split}.parquet`));
      assert.equal(rows.length, raw.length);
      rows.forEach((r, i) => assert.deepEqual(r, expectedGsm8kRow(raw[i]!.question, raw[i]!.answer, split, i), `${split} row ${i}`));
      assert.deepEqual(Object.keys(rows[0]!), ["data_source", "prompt", "ability", "reward_model", "extra_info"]);
    }
    // Spot values: commas and negatives.
    const train = await readParquet(join(out, "train.parquet"));
    const withComma = train.find((r) => /#### -?\d{1,3},\d/.test((r.extra_info as { answer: string }).answer))!;
    assert.ok(!(withComma.reward_model as { ground_truth: string }).ground_truth.includes(","));
    assert.ok(train.some((r) => (r.reward_model as { ground_truth: string }).ground_truth.startsWith("-")));
  } finally { rmSync(out, { recursive: true, force: true }); }
});

async function hfFolder(dir: string): Promise<void> {
  mkdirSync(join(dir, "main"), { recursive: true });
  await writeParquet(join(dir, "main", "train-00000-of-00001.parquet"), [
    { question: "Tom has 3 apples and buys 1,200 more. How many?", answer: "3+1200=<<3+1200=1203>>1203\n#### 1,203" },
    { question: "A debt of 5?", answer: "It is -5.\n#### -5" },
  ]);
  await writeParquet(join(dir, "main", "test-00000-of-00001.parquet"), [{ question: "1+1?", answer: "#### 2" }]);
}

test("gsm8k reads the Hugging Face parquet layout", async () => {
  const dir = tmp();
  try {
    await hfFolder(dir);
    const res = await getPreprocessor("gsm8k")({ localDatasetPath: dir, localSaveDir: join(dir, "out") });
    assert.deepEqual(res.rows, { train: 2, test: 1 });
    const train = await readParquet(join(dir, "out", "train.parquet"));
    assert.deepEqual(train[0], expectedGsm8kRow("Tom has 3 apples and buys 1,200 more. How many?", "3+1200=<<3+1200=1203>>1203\n#### 1,203", "train", 0));
    assert.equal((train[0]!.reward_model as { ground_truth: string }).ground_truth, "1203");
    assert.equal((train[1]!.reward_model as { ground_truth: string }).ground_truth, "-5");
  } finally { rmSync(dir, { recursive: true, force: true }); }
});

test("gsm8k --agent writes the tool-agent variant", async () => {
  const dir = tmp();
  try {
    await hfFolder(dir);
    await getPreprocessor("gsm8k")({ localDatasetPath: dir, localSaveDir: join(dir, "out"), agent: true });
    const [row] = await readParquet(join(dir, "out", "test.parquet"));
    const prompt = row!.prompt as { role: string; content: string }[];
    assert.equal(row!.agent_name, "tool_agent");
    assert.deepEqual(prompt.map((m) => m.role), ["system", "user"]);
    assert.match(prompt[0]!.content, /use the `calc_gsm8k_reward` tool/);
    assert.match(prompt[0]!.content, /Put your final answer in the format of `#### <answer>`\.$/);
    assert.equal(prompt[1]!.content, "1+1? Let's think step by step and output the final answer after `####`.");
    assert.deepEqual(row!.extra_info, {
      split: "test", index: 0, answer: "#### 2", question: "1+1?", need_tools_kwargs: true,
      tools_kwargs: { calc_gsm8k_reward: { create_kwargs: { ground_truth: "2" } } },
      interaction_kwargs: { query: prompt[1]!.content, ground_truth: "2" },
    });
  } finally { rmSync(dir, { recursive: true, force: true }); }
});

test("a malformed row fails with file and line, leaving no output", async () => {
  const dir = tmp();
  try {
    const good = JSON.stringify({ question: "q", answer: "#### 1" });
    writeFileSync(join(dir, "test.jsonl"), `${good}\n`);
    const out = join(dir, "out");
    const run = () => getPreprocessor("gsm8k")({ localDatasetPath: dir, localSaveDir: out });
    writeFileSync(join(dir, "train.jsonl"), `${good}\n${good}\n{"question": "q", "answer": "no final\n`);
    await assert.rejects(run(), new RegExp(`${join(dir, "train.jsonl")}:3: not valid JSON`));
    writeFileSync(join(dir, "train.jsonl"), `${good}\n${JSON.stringify({ question: "q", answer: "42" })}\n`);
    await assert.rejects(run(), /train\.jsonl:2: the answer has no final "#### <number>"/);
    writeFileSync(join(dir, "train.jsonl"), `${JSON.stringify({ question: 7, answer: "#### 1" })}\n`);
    await assert.rejects(run(), /train\.jsonl:1: field 'question' must be a string, got 7/);
    assert.equal(existsSync(out), false, "nothing written");
    rmSync(join(dir, "test.jsonl"));
    writeFileSync(join(dir, "train.jsonl"), `${good}\n`);
    await assert.rejects(run(), /no test split in .*: looked for test\.jsonl/);
    assert.equal(existsSync(out), false, "a missing split writes nothing either");
    const saved = { off: process.env.HF_HUB_OFFLINE, home: process.env.HF_HOME, cache: process.env.HF_HUB_CACHE };
    Object.assign(process.env, { HF_HUB_OFFLINE: "1", HF_HOME: join(dir, "no-hf-cache") });
    delete process.env.HF_HUB_CACHE;
    try {
      await assert.rejects(getPreprocessor("gsm8k")({ localSaveDir: out }), /dataset openai\/gsm8k@main is not in the Hugging Face cache .* and HF_HUB_OFFLINE is set/);
    } finally {
      for (const [k, v] of [["HF_HUB_OFFLINE", saved.off], ["HF_HOME", saved.home], ["HF_HUB_CACHE", saved.cache]] as const) {
        if (v === undefined) delete process.env[k]; else process.env[k] = v;
      }
    }
  } finally { rmSync(dir, { recursive: true, force: true }); }
});

test("arithmetic: verl layout, GSM8K answers, deterministic, disjoint splits, alphabet covers all text", async () => {
  const dir = tmp();
  try {
    const res = await getPreprocessor("arithmetic")({ localSaveDir: dir, numTrain: 300, numTest: 40, seed: 3, digits: 2 });
    assert.deepEqual(res.rows, { train: 300, test: 40 });
    const train = await readParquet(join(dir, "train.parquet"));
    const test = await readParquet(join(dir, "test.parquet"));
    const pair = (r: Record<string, unknown>) => {
      const m = /^What is (\d+)\+(\d+)\?$/.exec((r.prompt as { content: string }[])[0]!.content)!;
      return [Number(m[1]), Number(m[2])] as const;
    };
    for (const [split, rows] of [["train", train], ["test", test]] as const) {
      rows.forEach((r, i) => {
        const [a, b] = pair(r);
        assert.ok(a < 100 && b < 100);
        assert.equal(r.data_source, "openai/gsm8k");
        assert.deepEqual(r.reward_model, { style: "rule", ground_truth: String(a + b) });
        assert.deepEqual(r.extra_info, { split, index: i, answer: `${a}+${b}=${a + b}\n#### ${a + b}`, question: `What is ${a}+${b}?` });
        const text = (r.prompt as { content: string }[])[0]!.content + (r.extra_info as { answer: string }).answer;
        for (const ch of text) assert.ok(ARITHMETIC_ALPHABET.includes(ch), `alphabet lacks ${JSON.stringify(ch)}`);
      });
    }
    const key = ([a, b]: readonly [number, number]) => `${Math.min(a, b)},${Math.max(a, b)}`;
    const testKeys = new Set(test.map((r) => key(pair(r))));
    assert.equal(testKeys.size, 40, "test questions are distinct");
    assert.ok(train.every((r) => !testKeys.has(key(pair(r)))), "no test pair (in either order) in train");
    const again = await getPreprocessor("arithmetic")({ localSaveDir: join(dir, "again"), numTrain: "300" as unknown as number, numTest: 40, seed: 3, digits: 2 });
    assert.deepEqual(readFileSync(again.files[0]!), readFileSync(res.files[0]!), "same seed, same bytes");
    assert.notDeepEqual(arithmeticPairs(50, 5, 4, 2).train, arithmeticPairs(50, 5, 3, 2).train);
    assert.equal(new Set(arithmeticPairs(5000, 10, 1, 2).train.map(([a, b]) => `${a},${b}`)).size, 5000, "distinct while possible");
    assert.equal(arithmeticPairs(20000, 10, 1, 2).train.length, 20000, "with replacement beyond the distinct pairs");
    assert.throws(() => arithmeticPairs(10, 40, 0, 1), /--num-test 40 is too many for 1-digit sums: at most 27/);
    assert.throws(() => arithmeticPairs(10, 1, 0, 0), /--digits must be an integer in \[1, 7\]/);
    await assert.rejects(getPreprocessor("arithmetic")({ localSaveDir: dir, numTrain: -1 }), /--num-train must be an integer >= 0/);
  } finally { rmSync(dir, { recursive: true, force: true }); }
});

test("the preprocessor registry: known names, unknown name, re-registration", async () => {
  assert.ok(listPreprocessors().includes("gsm8k") && listPreprocessors().includes("arithmetic"));
  assert.throws(() => getPreprocessor("nope"), /unknown dataset 'nope' for preprocess \(known: arithmetic, gsm8k/);
  const fn = async () => ({ files: [], rows: {} });
  registerPreprocessor("mine", fn);
  registerPreprocessor("mine", fn);
  assert.equal(getPreprocessor("mine"), fn);
  assert.throws(() => registerPreprocessor("gsm8k", fn), /a different preprocessor is already registered as 'gsm8k'/);
});
