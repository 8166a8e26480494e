import { test } from "node:test";
import assert from "node:assert/strict";
import { getLrSchedule } from "../../../../src/trainer/ppo/core_algos/index.js";
import { close } from "../helpers.js";

test("constant with warmup: step/warmup, then 1; warmup from the ratio when lr_warmup_steps < 0", () => {
  const s = getLrSchedule({ lr: 1e-3, lr_scheduler_type: "constant", lr_warmup_steps: -1, lr_warmup_steps_ratio: 0.25 }, 20);
  assert.equal(s.numWarmupSteps, 5);
  assert.deepEqual([0, 1, 4, 5, 19].map(s.ratio), [0, 0.2, 0.8, 1, 1]);
  close(s.lr(2), 4e-4, 1e-12);
  assert.equal(getLrSchedule({ lr_warmup_steps: 3, lr_warmup_steps_ratio: 0.5 }, 100).numWarmupSteps, 3);
  assert.equal(getLrSchedule({ lr_warmup_steps: null }, 100).ratio(0), 1);
});

test("cosine: linear warmup, half-cosine to min_lr_ratio", () => {
  const s = getLrSchedule({ lr_scheduler_type: "cosine", lr_warmup_steps: 2, min_lr_ratio: 0.1, num_cycles: 0.5 }, 12);
  assert.deepEqual([0, 1].map(s.ratio), [0, 0.5]);
  close(s.ratio(2), 1, 1e-12);
  // p = (7 − 2)/10 = 0.5: cos(π/2)=0 → (1+m)/2
  close(s.ratio(7), 0.55, 1e-12);
  close(s.ratio(12), 0.1, 1e-12);
  const p = 3 / 10;
  close(s.ratio(5), Math.cos(Math.PI * p) * 0.45 + 0.55, 1e-12);
  assert.throws(() => getLrSchedule({ lr_scheduler_type: "wsd" }), /'wsd' is not supported/);
  assert.throws(() => getLrSchedule({ lr_scheduler_type: "cosine", min_lr_ratio: 2 }, 10), /min_lr_ratio/);
});
