// data.custom_cls: a user's JS/TS dataset class in RLHFDataset's place, its failures named, a
// Python class refused with the reason; and `verl train` running on one.
import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createRLDataloaders, loadCustomDatasetClass, writeParquet } from "../../src/data/index.js";
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
  train_files: [join(dir, "d.parquet")], val_files: [join(dir, "d.parquet")], train_batch_size: 2, max_prompt_length: 16, shuffle: false, filter_overlong_prompts: false, ...extra,
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
    await assert.rejects(cls("Nope"), /data\.custom_cls: .*gen\.ts has no export 'Nope' \(exports: BadRow, Broken, Generated/);
    await assert.rejects(loadCustomDatasetClass({ custom_cls: { path: "my_dataset.py", name: "MyDataset" } }),
      /data\.custom_cls\.path=my_dataset\.py: verl's dataset classes are Python \(they take a Hugging Face tokenizer object .*JavaScript or TypeScript/);
    await assert.rejects(loadCustomDatasetClass({ custom_cls: { path: join(dir, "shout.mjs"), name: null } }), /data\.custom_cls\.name must name the dataset class/);
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
