import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { writeParquet } from "../../src/data/parquet.js";
import { RLHFDataset } from "../../src/data/rl_dataset.js";
import { createRLDataloaders } from "../../src/data/factory.js";
import { arithmeticRow } from "../../src/data/preprocess/index.js";
import { TinyTokenizer } from "./helpers.js";

let dir = "";
let fileA = "", fileB = "";
const lengths = [3, 30, 5, 12, 7, 40]; // question digits -> prompt lengths vary

function row(i: number, split = "train"): Record<string, unknown> {
  const r = arithmeticRow(i, 10 ** lengths[i % lengths.length]! % 997, split, i);
  return { ...r, prompt: [{ role: "user", content: "q".repeat(lengths[i % lengths.length]!) }] };
}

before(async () => {
  dir = mkdtempSync(join(tmpdir(), "verl-rlds-"));
  fileA = join(dir, "a.parquet");
  fileB = join(dir, "b.parquet");
  await writeParquet(fileA, [0, 1, 2].map((i) => row(i)));
  await writeParquet(fileB, [3, 4, 5].map((i) => row(i)));
});
after(() => rmSync(dir, { recursive: true, force: true }));

const cfg = (over: Record<string, unknown> = {}) => ({ max_prompt_length: 100, filter_overlong_prompts: false, truncation: "error", shuffle: false, ...over });

test("rows from several files keep raw_prompt, index and kwargs; ids come from the chat template", () => {
  const ds = new RLHFDataset([fileA, fileB], new TinyTokenizer(true), cfg());
  assert.equal(ds.length, 6);
  const r = ds.get(4);
  assert.deepEqual(r.raw_prompt, [{ role: "user", content: "q".repeat(7) }]);
  assert.equal(r.index, 4);
  assert.equal(r.data_source, "openai/gsm8k");
  assert.deepEqual(r.tools_kwargs, {});
  assert.deepEqual(r.interaction_kwargs, {});
  const tok = new TinyTokenizer(true);
  assert.deepEqual(r.input_ids, tok.encode(`user:${"q".repeat(7)}\nassistant:`));
  assert.throws(() => ds.get(6), /index 6 out of range for 6 rows/);
});

test("without a chat template the contents are joined and BOS added; without a tokenizer there are no ids", () => {
  const ds = new RLHFDataset(fileA, new TinyTokenizer(false), cfg());
  assert.deepEqual(ds.get(0).input_ids, [1, ..."qqq".split("").map((c) => c.charCodeAt(0) + 3)]);
  const plain = new RLHFDataset(fileA, null, cfg());
  assert.equal(plain.get(0).input_ids, undefined);
  assert.throws(() => new RLHFDataset(fileA, null, cfg({ filter_overlong_prompts: true })), /filter_overlong_prompts needs a tokenizer/);
});

test("filter_overlong_prompts drops prompts over max_prompt_length (template included)", () => {
  // Templated length = content + "user:" (5) + "\n" (1) + "assistant:" (10) = content + 16.
  const ds = new RLHFDataset([fileA, fileB], new TinyTokenizer(true), cfg({ filter_overlong_prompts: true, max_prompt_length: 28 }));
  assert.deepEqual([...Array(ds.length).keys()].map((i) => ds.get(i).index), [0, 2, 3, 4]);
});

test("truncation: error names the file and row; left keeps the end", () => {
  const ds = new RLHFDataset(fileA, new TinyTokenizer(true), cfg({ max_prompt_length: 20 }));
  assert.equal(ds.get(0).input_ids!.length, 19);
  assert.throws(() => ds.get(1), new RegExp(`${fileA.replace(/[.]/g, "\\.")} row 1: prompt is 46 tokens, longer than data.max_prompt_length=20`));
  const left = new RLHFDataset(fileA, new TinyTokenizer(true), cfg({ max_prompt_length: 20, truncation: "left" }));
  const ids = left.get(1).input_ids!;
  assert.equal(ids.length, 20);
  assert.equal(new TinyTokenizer(true).decode(ids).endsWith("\nassistant:"), true);
  assert.throws(() => new RLHFDataset(fileA, null, cfg({ truncation: "sideways" })), /data\.truncation must be error, left, right, middle/);
});

test("max samples: the first rows, or a seeded random subset when shuffling", () => {
  const first = new RLHFDataset([fileA, fileB], null, cfg(), { maxSamples: 2 });
  assert.deepEqual([0, 1].map((i) => first.get(i).index), [0, 1]);
  const pick = (seed: number) => {
    const ds = new RLHFDataset([fileA, fileB], null, cfg({ shuffle: true, seed }), { maxSamples: 4 });
    return [...Array(ds.length).keys()].map((i) => ds.get(i).index);
  };
  assert.deepEqual(pick(5), pick(5));
  assert.equal(new Set(pick(5)).size, 4);
  assert.equal(new RLHFDataset(fileA, null, cfg(), { maxSamples: -1 }).length, 3);
});

test("bad inputs are reported with their file and row", async () => {
  const bad = join(dir, "bad.parquet");
  await writeParquet(bad, [{ prompt: [{ role: "user", content: "x" }] }, { prompt: [] }]);
  assert.throws(() => new RLHFDataset(bad, null, cfg()), /bad\.parquet row 1: 'prompt' must be a non-empty list of chat messages/);
  assert.throws(() => new RLHFDataset(join(dir, "x.csv"), null, cfg()), /unsupported data file format: .*x\.csv/);
  assert.throws(() => new RLHFDataset(join(dir, "nope.parquet"), null, cfg()), /cannot read parquet file .*nope\.parquet/);
  const jl = join(dir, "p.jsonl");
  writeFileSync(jl, `${JSON.stringify(row(0))}\n{oops\n`);
  assert.throws(() => new RLHFDataset(jl, null, cfg()), /p\.jsonl:2: not valid JSON/);
  writeFileSync(jl, `${JSON.stringify(row(0))}\n`);
  assert.equal(new RLHFDataset(jl, null, cfg()).get(0).index, 0);
  const empty = fileURLToPath(new URL("../../../test/data/fixtures/empty_rows.parquet", import.meta.url));
  assert.throws(() => createRLDataloaders({ ...cfg(), train_files: empty, val_files: fileA }, null),
    /data\.train_files: .*empty_rows\.parquet: no rows \(the file holds a schema but 0 rows\); give a file with at least one prompt/);
});

test("createRLDataloaders builds verl's train and val loaders from the data config", () => {
  const data = { ...cfg(), train_files: [fileA, fileB], val_files: fileA, train_batch_size: 4, val_batch_size: null, shuffle: true, seed: null };
  const { train, val, trainDataset } = createRLDataloaders(data, new TinyTokenizer(true));
  assert.equal(trainDataset.length, 6);
  assert.equal(train.length, 1, "drop_last: 6 prompts make one batch of 4");
  const batches = [...train];
  assert.equal(batches.length, 1);
  assert.deepEqual(batches[0]!.tensor("input_ids").shape, [4, 100]);
  assert.equal(batches[0]!.nonTensorBatch.raw_prompt!.length, 4);
  assert.equal(train.seed, 1, "seed null -> 1");
  const [v] = [...val];
  assert.equal(v!.length, 3, "val_batch_size null: the whole validation set");
  assert.deepEqual(v!.nonTensorBatch.index, [0, 1, 2], "validation is not shuffled by default");
  assert.throws(() => createRLDataloaders({ ...data, train_batch_size: 7 }, null), /the train dataloader is empty: 6 prompts, fewer than one batch of 7/);
  assert.throws(() => createRLDataloaders({ ...data, train_files: [] }, null), /data\.train_files must be a path or a non-empty list/);
});
