// data.custom_cls: a user's JS/TS dataset class in RLHFDataset's place, its failures named; and
// `verl train` running on one (Python classes: python_data.test.ts).
import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createRLDataloaders, loadCustomDatasetClass, loadSamplerClass, writeParquet } from "../../src/data/index.js";
import type { DataProto } from "../../src/protocol/index.js";
import { makeWorkspace, runTrain, scratchModel } from "../trainer/ppo/trainer/fixtures.js";

const DATA = new URL("../../src/data/index.js", import.meta.url).href;

async function workspace(): Promise<string> {
  const dir = mkdtempSync(join(tmpdir(), "custom-cls-"));
  const rows = ["one", "two", "three", "four", "five"].map((t, i) => ({
    data_source: "s", prompt: [{ role: "user", content: t }], reward_model: { ground_truth: String(i) }, extra_info: { index: i },
  }));
  await writeParquet(join(dir, "d.parquet"), rows);
  // the usual shape: extend RLHFDataset, change what a row says
  writeFileSync(join(dir, "shout.mjs"), [
    `import { RLHFDataset } from ${JSON.stringify(DATA)};`,
    "export class ShoutDataset extends RLHFDataset {",
    "  get(i) { const r = super.get(i); return { ...r, raw_prompt: r.raw_prompt.map((m) => ({ ...m, content: m.content.toUpperCase() })), shouted: true }; }",
    "}",
  ].join("\n"));
  // from scratch, in TypeScript: rows made up, no files read, default collate
  writeFileSync(join(dir, "gen.ts"), [
    "export class Generated {",
    "  readonly rows: { raw_prompt: { role: string; content: string }[]; reward_model: { ground_truth: string }; data_source: string }[];",
    "  constructor(files: string[], _tok: unknown, config: Record<string, unknown>, opts: { maxSamples?: number }) {",
    "    const n = (config.datagen as { n?: number } | undefined)?.n ?? 3;",
    "    this.rows = Array.from({ length: n }, (_, i) => ({ raw_prompt: [{ role: 'user', content: `${i} plus ${i}` }], reward_model: { ground_truth: String(2 * i) }, data_source: files[0]! }));",
    "  }",
    "  get length() { return this.rows.length; }",
    "  get(i: number) { return this.rows[i]; }",
    "}",
    "export class Broken { constructor() { throw new Error('no rows for you'); } }",
    "export class BadRow { length = 2; get() { return 7; } }",
  ].join("\n"));
  return dir;
}

const data = (dir: string, extra: Record<string, unknown>) => ({
  train_files: [join(dir, "d.parquet")], val_files: [join(dir, "d.parquet")], train_batch_size: 2, max_prompt_length: 16, shuffle: false, filter_overlong_prompts: false, dataloader_num_workers: 0, ...extra,
});

test("data.custom_cls: an RLHFDataset subclass and a TypeScript class from scratch replace the dataset; their failures name the class", async () => {
  const dir = await workspace();
  try {
    const shout = await loadCustomDatasetClass(data(dir, { custom_cls: { path: join(dir, "shout.mjs"), name: "ShoutDataset" } }));
    const l = createRLDataloaders(data(dir, {}), null, { datasetClass: shout });
    const first = [...l.train][0]!;
    assert.deepEqual(first.nonTensorBatch.raw_prompt, [[{ role: "user", content: "ONE" }], [{ role: "user", content: "TWO" }]]);
    assert.deepEqual(first.nonTensorBatch.shouted, [true, true]);
    assert.equal(l.valDataset.length, 5);

    const d = data(dir, { custom_cls: { path: join(dir, "gen.ts"), name: "Generated" }, datagen: { n: 4 } });
    const gen = createRLDataloaders(d, null, { datasetClass: await loadCustomDatasetClass(d) });
    assert.equal(gen.train.length, 2, "4 generated rows (data.datagen.n, read by the class) in batches of 2");
    assert.deepEqual([...gen.train].flatMap((b) => b.nonTensorBatch.reward_model), [0, 2, 4, 6].map((x) => ({ ground_truth: String(x) })));

    const cls = async (name: string) => loadCustomDatasetClass(data(dir, { custom_cls: { path: join(dir, "gen.ts"), name } }));
    const broken = (await cls("Broken"))!;
    assert.throws(() => createRLDataloaders(data(dir, {}), null, { datasetClass: broken }),
      /data\.train_files: data\.custom_cls \(Broken from .*gen\.ts\): the constructor failed: no rows for you/);
    const bad = createRLDataloaders(data(dir, {}), null, { datasetClass: (await cls("BadRow"))! });
    assert.throws(() => [...bad.train], /data\.custom_cls \(BadRow from .*\): get\(0\) must return a row object .*got 7/);
    await assert.rejects(cls("Nope"), /data\.custom_cls module .*gen\.ts has no export 'Nope' \(exports: BadRow, Broken, Generated/);
    await assert.rejects(loadCustomDatasetClass({ custom_cls: { path: "my_dataset.py", name: "MyDataset" } }), /data\.custom_cls\.path=my_dataset\.py: no such file/);
    await assert.rejects(loadCustomDatasetClass({ custom_cls: { path: join(dir, "shout.mjs"), name: null } }), /data\.custom_cls\.name must name the class exported by .*shout\.mjs, got null/);
    assert.equal(await loadCustomDatasetClass({ custom_cls: { path: null, name: null } }), null, "verl's default: the built-in dataset");
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test("verl train with data.custom_cls: the run's prompts come from the user's class", async () => {
  const ws = await makeWorkspace();
  try {
    writeFileSync(join(ws.dir, "tagged.mjs"), [
      `import { RLHFDataset } from ${JSON.stringify(DATA)};`,
      "export class Tagged extends RLHFDataset {",
      "  get(i) { const r = super.get(i); return { ...r, reward_model: { ...r.reward_model, ground_truth: 'z' } }; }",
      "}",
    ].join("\n"));
    const run = await runTrain([...ws.overrides, ...scratchModel(16, 1), "trainer.logger=console", "algorithm.adv_estimator=grpo", "trainer.total_training_steps=1",
      `data.custom_cls.path=${join(ws.dir, "tagged.mjs")}`, "data.custom_cls.name=Tagged", `trainer.rollout_data_dir=${ws.dir}/d`, `trainer.default_local_dir=${ws.dir}/c`], {});
    assert.equal(run.code, 0, run.stderr);
    const rows = readFileSync(join(ws.dir, "d/1.jsonl"), "utf8").trim().split("\n").map((l) => JSON.parse(l) as { gts: unknown });
    assert.ok(rows.length === 8 && rows.every((r) => r.gts === "z"), "every scored row carries the class's ground truth");
  } finally {
    rmSync(ws.dir, { recursive: true, force: true });
  }
});

test("data.sampler: indices come from the user's sampler a batch at a time, so update() steers the next batch; resume skips what was used", async () => {
  const dir = await workspace();
  try {
    writeFileSync(join(dir, "curriculum.mjs"), [
      "// walks the rows by `step`; update() after a batch jumps to row 3",
      "export class Curriculum {",
      "  constructor(dataSource, dataConfig) { this.n = dataSource.length; this.step = dataConfig.sampler.step ?? 1; this.cursor = 0; this.updates = []; }",
      "  get length() { return 4; }",
      "  *[Symbol.iterator]() { for (let k = 0; k < 4; k++) { const i = this.cursor; this.cursor = (i + this.step) % this.n; yield i; } }",
      "  update(batch) { this.updates.push(batch.length); this.cursor = 3; }",
      "  stateDict() { return { cursor: this.cursor }; }",
      "  loadStateDict(s) { this.cursor = s.cursor; }",
      "}",
      "export class OutOfRange { constructor(d) { this.n = d.length; } *[Symbol.iterator]() { yield this.n; } }",
      "export class Stateless { constructor(d, c) { this.n = d.length; this.step = c.sampler.step; } get length() { return 4; } *[Symbol.iterator]() { for (let k = 0, i = 0; k < 4; k++, i = (i + this.step) % this.n) yield i; } }",
    ].join("\n"));
    const d = data(dir, { sampler: { class_path: join(dir, "curriculum.mjs"), class_name: "Curriculum", step: 2 }, shuffle: true });
    const l = createRLDataloaders(d, null, { samplerClass: await loadSamplerClass(d) });
    assert.equal(l.train.length, 2, "the sampler's length (4) in batches of 2");
    const idx = (b: DataProto) => (b.nonTensorBatch.extra_info as { index: number }[]).map((e) => e.index);
    const it = l.train[Symbol.iterator]();
    const b1 = it.next().value as DataProto;
    assert.deepEqual(idx(b1), [0, 2], "its order, not the seeded shuffle");
    const state = l.train.stateDict();
    assert.deepEqual(state.sampler, { cursor: 4 }, "the sampler's own state is saved");
    await l.train.updateSampler(b1);
    assert.deepEqual(idx(it.next().value as DataProto), [3, 0], "update() between batches changes the next one (without it: 4, 1)");

    // resume mid-epoch: the sampler's own state comes back and it continues from there, as the
    // uninterrupted run would have without update(): 4, 1 (skipping 2 more samples would give 3, 0)
    const again = createRLDataloaders(d, null, { samplerClass: await loadSamplerClass(d) });
    again.train.loadStateDict(state);
    assert.deepEqual([...again.train].map(idx), [[4, 1]], "cursor 4 restored, nothing skipped on top of it");
    // a sampler without state of its own replays the epoch and skips the samples already used
    const stateless = data(dir, { sampler: { class_path: join(dir, "curriculum.mjs"), class_name: "Stateless", step: 2 }, shuffle: true });
    const fresh = createRLDataloaders(stateless, null, { samplerClass: await loadSamplerClass(stateless) });
    fresh.train.loadStateDict({ ...state, sampler: undefined });
    assert.deepEqual([...fresh.train].map(idx), [[4, 1]], "0, 2 skipped from a fresh iterator");

    const bad = data(dir, { sampler: { class_path: join(dir, "curriculum.mjs"), class_name: "OutOfRange" } });
    const lb = createRLDataloaders(bad, null, { samplerClass: await loadSamplerClass(bad) });
    assert.throws(() => [...lb.train], /data\.sampler \(OutOfRange from .*curriculum\.mjs\): yielded 5, not a row index of the dataset's 5 rows/);
    await assert.rejects(loadSamplerClass({ sampler: { class_path: "curriculum.py", class_name: "C" } }), /data\.sampler\.class_path=curriculum\.py: no such file/);
    assert.throws(() => createRLDataloaders({ ...d, dataloader_num_workers: 2 }, null, { samplerClass: { cls: class {} as never, label: "data.sampler (S)" } }),
      /data\.sampler \(S\): a data\.sampler needs data\.dataloader_num_workers=0, as verl requires .*got 2/);
    assert.equal(await loadSamplerClass({ sampler: { class_path: null, class_name: null } }), null);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test("verl train with data.sampler: the curriculum sampler orders the prompts and sees each trained batch, rewards included", async () => {
  const ws = await makeWorkspace();
  try {
    const log = join(ws.dir, "updates.jsonl");
    writeFileSync(join(ws.dir, "rev.mjs"), [
      "import { appendFileSync } from 'node:fs';",
      "export class Reverse {",
      "  constructor(dataSource) { this.n = dataSource.length; }",
      "  *[Symbol.iterator]() { for (let i = this.n - 1; i >= 0; i--) yield i; }",
      `  update(batch) { appendFileSync(${JSON.stringify(log)}, JSON.stringify({ rows: batch.length, scored: 'token_level_scores' in batch.batch, adv: 'advantages' in batch.batch }) + '\\n'); }`,
      "}",
    ].join("\n"));
    const run = await runTrain([...ws.overrides, ...scratchModel(16, 1), "trainer.logger=console", "algorithm.adv_estimator=grpo", "trainer.total_training_steps=2",
      `+data.sampler.class_path=${join(ws.dir, "rev.mjs")}`, "+data.sampler.class_name=Reverse", "data.dataloader_num_workers=0", `trainer.rollout_data_dir=${ws.dir}/d`, `trainer.default_local_dir=${ws.dir}/c`], {});
    assert.equal(run.code, 0, run.stderr);
    const updates = readFileSync(log, "utf8").trim().split("\n").map((l) => JSON.parse(l) as Record<string, unknown>);
    assert.deepEqual(updates, [{ rows: 8, scored: true, adv: true }, { rows: 8, scored: true, adv: true }]);
    const step1 = readFileSync(join(ws.dir, "d/1.jsonl"), "utf8").trim().split("\n").map((l) => JSON.parse(l) as { input: string });
    // the workspace's 8 train prompts in reverse (data.shuffle=true is overridden): the last two first, each twice (n=2)
    assert.match(step1[0]!.input, /Ben and Mia went to/);
    assert.match(step1[2]!.input, /The sun was hot/);
  } finally {
    rmSync(ws.dir, { recursive: true, force: true });
  }
});
