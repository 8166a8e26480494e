// `verl sft` end to end in rank threads: a run interrupted after a checkpoint and
// resumed ends with the weights and metrics of the uninterrupted run, two ranks
// train like one, and the final Hugging Face export loads back.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { cpSync, existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { writeParquet } from "../../../src/data/parquet.js";
import { arithmeticRow } from "../../../src/data/preprocess/index.js";
import { loadHfModel } from "../../../src/models/index.js";
import { runSft } from "../../../src/trainer/sft/index.js";
import { readSafetensors } from "../../../src/models/index.js";
import { setLogLevel } from "../../../src/utils/logger.js";
import { maxAbsDiff, tinySftConfig } from "./helpers.js";

let dir = "";
setLogLevel("warn");

before(async () => {
  dir = mkdtempSync(join(tmpdir(), "verl-sft-"));
  const rows = Array.from({ length: 26 }, (_, i) => arithmeticRow((i * 37) % 100, (i * 11) % 100, "train", i));
  await writeParquet(join(dir, "train.parquet"), rows.slice(0, 20));
  await writeParquet(join(dir, "val.parquet"), rows.slice(20));
});
after(() => rmSync(dir, { recursive: true, force: true }));

function config(run: string, extra: string[] = []) {
  return tinySftConfig([
    "trainer.device=wasm", `data.train_files=${join(dir, "train.parquet")}`, `data.val_files=${join(dir, "val.parquet")}`,
    "data.prompt_key=extra_info", "data.response_key=extra_info", "data.prompt_dict_keys=[question]", "data.response_dict_keys=[answer]",
    "data.max_length=36", "data.train_batch_size=8", "data.micro_batch_size_per_gpu=3",
    "trainer.total_epochs=3", "trainer.save_freq=3", "trainer.test_freq=3", "trainer.n_gpus_per_node=1",
    "optim.lr_scheduler=cosine", "optim.lr_warmup_steps_ratio=0.2", `trainer.default_local_dir=${join(dir, run)}`,
    'trainer.logger=["file"]', ...extra,
  ]);
}

const weightsAt = (run: string, step: number) => readSafetensors(join(dir, run, `global_step_${step}`, "model.safetensors")).tensors;
const metricLines = (path: string) => readFileSync(path, "utf8").trim().split("\n").map((l) => JSON.parse(l) as { step: number; data: Record<string, number> });

test("an interrupted run resumes from its checkpoint and ends where the uninterrupted run ends", async () => {
  process.env.VERL_FILE_LOGGER_PATH = join(dir, "full.jsonl");
  const full = await runSft(config("full"));
  // 20 rows / batch 8 = 2 steps per epoch (the partial batch is dropped) x 3 epochs
  assert.equal(full.globalStep, 6);
  assert.equal(full.totalSteps, 6);
  assert.ok(full.valLoss !== undefined && Number.isFinite(full.valLoss));
  const lines = metricLines(join(dir, "full.jsonl"));
  const losses = lines.filter((l) => "train/loss" in l.data).map((l) => l.data["train/loss"]!);
  assert.deepEqual(lines.filter((l) => "val/loss" in l.data).map((l) => l.step), [3, 6]);
  // verl's legacy name and scale, and the rate after the step's scheduler step: the 1 warmup step is over
  assert.ok(Math.abs(lines.find((l) => l.step === 1)!.data["train/lr(1e-3)"]! - 0.01 * 1e3) < 1e-6, "train/lr(1e-3) after warmup");
  assert.ok(!("train/lr" in lines[0]!.data) && !("train/grad_norm" in lines[0]!.data), "only verl's legacy names");
  assert.ok(!("train/mfu" in lines[0]!.data), "verl's legacy trainer logs no MFU (a TODO in fsdp_sft_trainer.py)");
  assert.ok(losses[5]! < losses[0]!, `train/loss falls: ${losses}`);

  // The crash: only step 3 was saved. A new run in a fresh folder from that checkpoint.
  cpSync(join(dir, "full", "global_step_3"), join(dir, "resumed", "global_step_3"), { recursive: true });
  writeFileSync(join(dir, "resumed", "latest_checkpointed_iteration.txt"), "3\n");
  writeFileSync(join(dir, "resumed.jsonl"), readFileSync(join(dir, "full.jsonl"), "utf8"));
  process.env.VERL_FILE_LOGGER_PATH = join(dir, "resumed.jsonl");
  const resumed = await runSft(config("resumed"));
  assert.equal(resumed.globalStep, 6);
  const a = weightsAt("full", 6), b = weightsAt("resumed", 6);
  for (const [k, v] of a) assert.ok(maxAbsDiff(v.data, b.get(k)!.data) < 1e-6, `${k} differs after resuming`);
  const again = metricLines(join(dir, "resumed.jsonl"));
  assert.deepEqual(again.map((l) => l.step), lines.map((l) => l.step), "the resumed file keeps steps <= 3 and appends 4..6");
  for (let i = 0; i < lines.length; i++) {
    for (const [k, v] of Object.entries(lines[i]!.data)) {
      if (k !== "train/time(s)") assert.ok(Math.abs(v - again[i]!.data[k]!) < 1e-5, `step ${lines[i]!.step} ${k}: ${v} vs ${again[i]!.data[k]}`);
    }
  }
  // Nothing left to do: a third call returns at once.
  const done = await runSft(config("resumed"));
  assert.equal(done.globalStep, 6);

  const hf = await loadHfModel(full.hfDir);
  assert.ok(maxAbsDiff(hf.params.get("model.norm.weight")!.dataSync(), a.get("model.norm.weight")!.data) === 0);
  assert.ok(existsSync(join(full.hfDir, "tokenizer.json")), "the export carries the char tokenizer");
  hf.dispose();
  delete process.env.VERL_FILE_LOGGER_PATH;
});

test("two ranks (rows split, gradients all-reduced) take the same steps as one", async () => {
  const extra = ["trainer.total_training_steps=3", "trainer.test_freq=-1"];
  await runSft(config("one", extra));
  await runSft(config("two", [...extra, "trainer.n_gpus_per_node=2"]));
  const a = weightsAt("one", 3), b = weightsAt("two", 3);
  for (const [k, v] of a) assert.ok(maxAbsDiff(v.data, b.get(k)!.data) < 1e-5, `${k} differs between 1 and 2 ranks`);
});
