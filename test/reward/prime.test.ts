import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { pathToFileURL } from "node:url";
import { CharTokenizer } from "../../src/models/tokenizers/char.js";
import { loadRewardManager } from "../../src/reward/load.js";
import { PrimeRewardManager } from "../../src/reward/managers/index.js";
import type { Config, ConfigNode } from "../../src/config/index.js";
import { makeBatch, rowSums } from "./helpers.js";

const tok = new CharTokenizer("0123456789#+=-,.$ abcdefghijklmnopqrstuvwxyz\\{}");

// A reward function that hangs in a synchronous loop, throws, never settles, or answers, depending on the text.
const NASTY_JS = `
export function compute_score(ds, solution, gt) {
  if (solution.includes("hang")) { for (;;) { /* never returns: only terminating the thread stops it */ } }
  if (solution.includes("throw")) throw new Error("scorer blew up");
  if (solution.includes("never")) return new Promise(() => {});
  return { score: solution.endsWith(gt) ? 1 : 0, n: solution.length };
}
`;
const TYPED_TS = `
interface Result { score: number; worker: boolean }
export async function compute_score(ds: string, solution: string, gt: string): Promise<Result> {
  const { isMainThread } = await import("node:worker_threads");
  return { score: solution.endsWith(gt) ? 1 : 0, worker: !isMainThread };
}
`;

function cfg(path: string | null, kwargs: ConfigNode): Config {
  return {
    custom_reward_function: { path, name: "compute_score", reward_kwargs: {} },
    reward_model: { reward_manager: "prime", reward_kwargs: kwargs },
    data: { reward_fn_key: "data_source" },
  };
}

test("prime: built-in scorers in worker threads match the naive result; acc stored", async () => {
  const rows = [
    { prompt: "1", response: "#### 2", dataSource: "openai/gsm8k", groundTruth: "2" },
    { prompt: "1", response: "#### 3", dataSource: "openai/gsm8k", groundTruth: "2" },
    { prompt: "1", response: "\\boxed{4}", dataSource: "lighteval/MATH", groundTruth: "4" },
  ];
  const mgr = (await loadRewardManager(cfg(null, { num_workers: 2 }), tok, { numExamine: 0 })) as PrimeRewardManager;
  try {
    assert.equal(mgr.numWorkers, 2);
    const data = makeBatch(tok, rows, 2, 10);
    const r = await mgr.compute(data);
    assert.deepEqual(rowSums(r.rewardTensor), [1, 0, 1]);
    assert.deepEqual(Array.from(data.batch.acc!.data), [1, 0, 1]);
    assert.deepEqual(r.metrics, { "reward/timeout_count": 0, "reward/error_count": 0 });
    const unknown = makeBatch(tok, [{ ...rows[0]!, dataSource: "my/set" }], 2, 10);
    const u = await mgr.compute(unknown);
    assert.deepEqual(u.metrics, { "reward/timeout_count": 0, "reward/error_count": 1 }, "an unknown data_source scores 0 and is counted");
  } finally {
    await mgr.close();
  }
});

test("prime: a TypeScript reward module runs in the worker threads", async () => {
  const dir = mkdtempSync(join(tmpdir(), "verl-prime-"));
  writeFileSync(join(dir, "typed.ts"), TYPED_TS);
  const mgr = (await loadRewardManager(cfg(join(dir, "typed.ts"), { num_workers: 1 }), tok, { numExamine: 0 })) as PrimeRewardManager;
  try {
    const r = await mgr.compute(makeBatch(tok, [{ prompt: "a", response: "x 1", dataSource: "d", groundTruth: "1" }, { prompt: "a", response: "x 2", dataSource: "d", groundTruth: "1" }], 2, 6));
    assert.deepEqual(rowSums(r.rewardTensor), [1, 0]);
    assert.deepEqual(r.rewardExtraInfo.worker, [true, true]);
  } finally {
    await mgr.close();
    rmSync(dir, { recursive: true, force: true });
  }
});

test("prime: a hanging or throwing reward function is cut off and counted while scoring goes on", { timeout: 60_000 }, async () => {
  const dir = mkdtempSync(join(tmpdir(), "verl-prime-"));
  writeFileSync(join(dir, "nasty.mjs"), NASTY_JS);
  const mgr = (await loadRewardManager(cfg(join(dir, "nasty.mjs"), { num_workers: 2, timeout_s: 0.5 }), tok, { numExamine: 0 })) as PrimeRewardManager;
  try {
    const rows = [
      { prompt: "a", response: "ok 1", dataSource: "d", groundTruth: "1" },
      { prompt: "a", response: "hang", dataSource: "d", groundTruth: "1" },
      { prompt: "a", response: "throw", dataSource: "d", groundTruth: "1" },
      { prompt: "a", response: "hang again", dataSource: "d", groundTruth: "1" },
      { prompt: "a", response: "never", dataSource: "d", groundTruth: "1" },
      { prompt: "a", response: "ok 2", dataSource: "d", groundTruth: "1" },
      { prompt: "a", response: "ok 1", dataSource: "d", groundTruth: "1" },
    ];
    // Without cutting off the hung threads this call would never return (the test's timeout would fail it).
    const r = await mgr.compute(makeBatch(tok, rows, 2, 12));
    assert.deepEqual(rowSums(r.rewardTensor), [1, 0, 0, 0, 0, 0, 1]);
    assert.deepEqual(r.metrics, { "reward/timeout_count": 3, "reward/error_count": 1 });
    assert.deepEqual(r.rewardExtraInfo.score, [1, 0, 0, 0, 0, 0, 1]);
    assert.deepEqual(r.rewardExtraInfo.n, [4, null, null, null, null, 4, 4]);
    // The replaced threads serve the next batch.
    const again = await mgr.compute(makeBatch(tok, [rows[0]!, rows[5]!], 2, 12));
    assert.deepEqual(rowSums(again.rewardTensor), [1, 0]);
    assert.deepEqual(again.metrics, { "reward/timeout_count": 0, "reward/error_count": 0 });
  } finally {
    await mgr.close();
    rmSync(dir, { recursive: true, force: true });
  }
});

test("prime: scorers registered with { module: import.meta.url } are loaded by the worker threads", async () => {
  const dir = mkdtempSync(join(tmpdir(), "verl-prime-"));
  const registry = new URL("../../src/reward/scorers/registry.js", import.meta.url).href;
  writeFileSync(join(dir, "scorer.mjs"), `
import { registerScorer } from ${JSON.stringify(registry)};
import { isMainThread } from "node:worker_threads";
registerScorer("test/module-scorer", (s, gt) => ({ score: s === gt ? 1 : 0, in_worker: !isMainThread }), { module: import.meta.url });
`);
  try {
    await import(pathToFileURL(join(dir, "scorer.mjs")).href);
    const mgr = (await loadRewardManager(cfg(null, { num_workers: 1 }), tok, { numExamine: 0 })) as PrimeRewardManager;
    try {
      const r = await mgr.compute(makeBatch(tok, [{ prompt: "a", response: "7", dataSource: "test/module-scorer", groundTruth: "7" }], 2, 4));
      assert.deepEqual(rowSums(r.rewardTensor), [1]);
      assert.deepEqual(r.rewardExtraInfo.in_worker, [true]);
    } finally {
      await mgr.close();
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test("prime: a reward module that fails to load is a clear error, not zeros", async () => {
  const dir = mkdtempSync(join(tmpdir(), "verl-prime-"));
  writeFileSync(join(dir, "bad.mjs"), "throw new Error('cannot start');");
  try {
    await assert.rejects(loadRewardManager(cfg(join(dir, "bad.mjs"), {}), tok, { numExamine: 0 }), /cannot load reward module .*bad\.mjs: cannot start/);
    assert.throws(() => new PrimeRewardManager({ tokenizer: tok, numExamine: 0, rewardFnKey: "data_source", rewardKwargs: {}, computeScore: () => 1 }), /cannot receive a function object/);
    assert.throws(() => new PrimeRewardManager({ tokenizer: tok, numExamine: 0, rewardFnKey: "data_source", rewardKwargs: { timeout_s: -1 } }), /timeout_s must be a positive number/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
