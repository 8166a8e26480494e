import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { CharTokenizer } from "../../src/models/tokenizers/char.js";
import { loadCustomRewardFunction } from "../../src/reward/custom.js";
import { loadRewardManager } from "../../src/reward/load.js";
import { NaiveRewardManager } from "../../src/reward/managers/index.js";
import type { Config, ConfigNode } from "../../src/config/index.js";
import { makeBatch, rowSums } from "./helpers.js";

const tok = new CharTokenizer("0123456789#+=-,.$ abcdefghijklmnopqrstuvwxyz");

// Real TypeScript (interfaces, annotations, a type-only import) that Node cannot run without a loader.
const TS_MODULE = `
import type { Stats } from "node:fs";
interface Kwargs { bonus?: number; [k: string]: unknown }
type Extra = Record<string, unknown> | null;
export function compute_score(dataSource: string, solution: string, groundTruth: string, extra: Extra, kwargs: Kwargs): { score: number; source: string; saw_extra: boolean } {
  const unused: Stats | undefined = undefined;
  void unused;
  const hit: boolean = solution.trim().endsWith(groundTruth);
  return { score: (hit ? 1 : 0) + (kwargs.bonus ?? 0), source: dataSource, saw_extra: extra !== null };
}
`;
const JS_MODULE = `
export async function my_score(dataSource, solution, groundTruth, extraInfo, kwargs) {
  await new Promise((r) => setTimeout(r, 1));
  return solution.includes(groundTruth) ? kwargs.scale : 0;
}
export const not_a_function = 3;
`;
const CJS_MODULE = `module.exports = { compute_score: (ds, s, gt) => (s === gt ? 1 : 0) };`;

function cfg(path: string | null, name = "compute_score", reward_kwargs: ConfigNode = {}, manager = "naive"): Config {
  return { custom_reward_function: { path, name, reward_kwargs }, reward_model: { reward_manager: manager }, data: { reward_fn_key: "data_source" } };
}

test("custom reward function: TypeScript module from config through tsx, kwargs appended", async () => {
  const dir = mkdtempSync(join(tmpdir(), "verl-reward-"));
  try {
    writeFileSync(join(dir, "reward.ts"), TS_MODULE);
    const mgr = await loadRewardManager(cfg(join(dir, "reward.ts"), "compute_score", { bonus: 0.5 }), tok, { numExamine: 0 });
    assert.ok(mgr instanceof NaiveRewardManager);
    const data = makeBatch(tok, [
      { prompt: "q", response: "it is 42", dataSource: "any/source", groundTruth: "42" },
      { prompt: "q", response: "it is 41", dataSource: "any/source", groundTruth: "42" },
    ], 2, 10);
    const r = await mgr.compute(data);
    assert.deepEqual(rowSums(r.rewardTensor), [1.5, 0.5]);
    assert.deepEqual(r.rewardExtraInfo.source, ["any/source", "any/source"]);
    assert.deepEqual(r.rewardExtraInfo.saw_extra, [true, true]);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test("custom reward function: plain JS (ESM, async) and CommonJS modules; relative paths resolve from cwd", async () => {
  const dir = mkdtempSync(join(tmpdir(), "verl-reward-"));
  try {
    writeFileSync(join(dir, "reward.mjs"), JS_MODULE);
    writeFileSync(join(dir, "reward.cjs"), CJS_MODULE);
    const js = await loadCustomRewardFunction(cfg(join(dir, "reward.mjs"), "my_score", { scale: 3 }));
    assert.equal(await js!.computeScore("d", "x 7 y", "7"), 3);
    const mgr = await loadRewardManager(cfg(join(dir, "reward.mjs"), "my_score", { scale: 2 }), tok, { numExamine: 0 });
    const data = makeBatch(tok, [{ prompt: "q", response: "7", dataSource: "a", groundTruth: "7" }], 2, 4);
    assert.deepEqual(rowSums((await mgr.compute(data)).rewardTensor), [2]);
    const cjs = await loadCustomRewardFunction(cfg(join(dir, "reward.cjs")));
    assert.equal(await cjs!.computeScore("d", "7", "7"), 1);
    const cwd = process.cwd();
    process.chdir(dir);
    try {
      assert.ok(await loadCustomRewardFunction(cfg("./reward.mjs", "my_score")));
    } finally {
      process.chdir(cwd);
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test("custom reward function: clear errors for a missing file, a missing export, a non-function", async () => {
  const dir = mkdtempSync(join(tmpdir(), "verl-reward-"));
  try {
    writeFileSync(join(dir, "reward.mjs"), JS_MODULE);
    assert.equal(await loadCustomRewardFunction(cfg(null)), null);
    await assert.rejects(loadCustomRewardFunction(cfg(join(dir, "nope.ts"))), /reward module .*nope\.ts does not exist/);
    await assert.rejects(loadCustomRewardFunction(cfg(join(dir, "reward.mjs"), "compute_score")), /reward module .*reward\.mjs has no export 'compute_score' \(exports: my_score, not_a_function\)/);
    await assert.rejects(loadCustomRewardFunction(cfg(join(dir, "reward.mjs"), "not_a_function")), /export 'not_a_function' is a number, not a function/);
    writeFileSync(join(dir, "broken.ts"), "export const = ;");
    await assert.rejects(loadCustomRewardFunction(cfg(join(dir, "broken.ts"))), /cannot load reward module .*broken\.ts/);
    await assert.rejects(loadRewardManager({ ...cfg(null), reward_model: { reward_manager: "fancy" } }, tok, { numExamine: 0 }), /unknown reward manager "fancy"/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
