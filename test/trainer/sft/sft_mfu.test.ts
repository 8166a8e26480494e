// train/mfu of verl's engine SFT trainer (sft_trainer_engine) with data.use_dynamic_bsz: each step's
// MFU from the batch's per-sequence token counts; the legacy trainer (verl's fsdp_sft_trainer) logs none.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { loadConfig } from "../../../src/config/index.js";
import { runSft } from "../../../src/trainer/sft/index.js";
import { setLogLevel } from "../../../src/utils/logger.js";
import { makeMultiTurnSftData } from "../../cli/verl_examples_sft_data.js";

let dir = "";
let data: { model: string; train: string; test: string };
setLogLevel("warn");

before(async () => {
  dir = mkdtempSync(join(tmpdir(), "verl-sft-mfu-"));
  data = await makeMultiTurnSftData(dir);
});
after(() => rmSync(dir, { recursive: true, force: true }));

test("sft_trainer_engine with use_dynamic_bsz logs train/mfu each step, in (0, 1] on the CPU and consistent with the tokens", async () => {
  const log = join(dir, "engine.jsonl");
  process.env.VERL_FILE_LOGGER_PATH = log;
  const config = loadConfig({
    configName: "sft_trainer_engine",
    overrides: [
      `data.train_files=${data.train}`, `data.val_files=${data.test}`, `model.path=${data.model}`, "data.messages_key=messages",
      "data.train_batch_size=4", "data.use_dynamic_bsz=True", "data.max_token_len_per_gpu=300", "data.max_length=256",
      "trainer.total_training_steps=2", "trainer.device=wasm", "trainer.logger=['file']", "trainer.n_gpus_per_node=2",
      `trainer.default_local_dir=${join(dir, "ckpt")}`, "trainer.resume_mode=disable", "trainer.test_freq=-1",
    ],
  });
  const t0 = performance.now();
  await runSft(config);
  const seconds = (performance.now() - t0) / 1000;
  const steps = readFileSync(log, "utf8").trim().split("\n").map((l) => JSON.parse(l) as { step: number; data: Record<string, number> })
    .filter((l) => "train/loss" in l.data);
  assert.deepEqual(steps.map((s) => s.step), [1, 2]);
  for (const { step, data: m } of steps) {
    const mfu = m["train/mfu"];
    assert.ok(typeof mfu === "number" && mfu > 0 && mfu <= 1, `step ${step}: train/mfu = ${mfu}`);
    // The tiny Qwen2 (hidden 32, 2 layers, 4 heads of 8, 2 kv heads, intermediate 64) has per layer
    // 32 x (32 + 16 + 16 + 32) = 3072 attention and 32 x 64 x 3 = 6144 MLP weights: at least 6 x 18432
    // FLOPs per token; a step takes less than the whole run, and 2 ranks halve the MFU (verl's world size).
    const floor = (6 * 18432 * m["train/global_tokens"]!) / seconds / 448e9 / 2;
    assert.ok(mfu >= floor, `step ${step}: train/mfu ${mfu} below ${floor}`);
  }
});
