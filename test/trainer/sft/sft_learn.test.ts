// SFT learns: a from-scratch model on a fixed set of addition problems drives the
// response loss well below its starting value (wasm, the default CPU backend).
import { test } from "node:test";
import assert from "node:assert/strict";
import { SFTWorker } from "../../../src/workers/sft/sft_worker.js";
import { tinySftConfig, toyBatch } from "./helpers.js";

test("the response loss on a tiny task falls to under a third of its start in 40 steps", async () => {
  const w = new SFTWorker(tinySftConfig(["trainer.device=wasm", "data.micro_batch_size_per_gpu=8", "model.override_config.hidden_size=32", "optim.lr=0.02"]));
  await w.initModel(40);
  const pairs: [number, number][] = Array.from({ length: 16 }, (_, i) => [(i * 7) % 10, (i * 3) % 10]);
  const batch = toyBatch(pairs);
  const start = await w.evalLoss(batch);
  const losses: number[] = [];
  for (let i = 0; i < 40; i++) losses.push((await w.trainStep(batch)).loss);
  const end = await w.evalLoss(batch);
  const first = start.lossSum / start.tokens, last = end.lossSum / end.tokens;
  assert.ok(Math.abs(losses[0]! - first) < 1e-4, "the first step's loss is the loss before training");
  assert.ok(last < first / 3, `loss ${first.toFixed(3)} -> ${last.toFixed(3)} (per step: ${losses.map((l) => l.toFixed(2)).join(" ")})`);
});
