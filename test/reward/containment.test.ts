// User reward code under naive, dapo and batch runs contained in scoring threads: a
// synchronous endless loop, a promise that never settles, process.exit() and a throw
// from an async callback each fail the call with one clear error naming the reward
// file and the sample, and never hang, kill or silently end the process.
import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { isMainThread } from "node:worker_threads";
import { CharTokenizer } from "../../src/models/tokenizers/char.js";
import { loadRewardManager } from "../../src/reward/load.js";
import type { Config } from "../../src/config/index.js";
import { makeBatch, rowSums } from "./helpers.js";

const tok = new CharTokenizer("0123456789#+=-,.$ abcdefghijklmnopqrstuvwxyz\\{}");

const PER_SAMPLE = `
import { isMainThread } from "node:worker_threads";
export function compute_score(ds, solution, gt) {
  if (solution.includes("hang")) for (;;) { /* a synchronous endless loop */ }
  if (solution.includes("never")) return new Promise(() => {});
  if (solution.includes("exit")) process.exit(7);
  if (solution.includes("async")) { setTimeout(() => { throw new Error("async boom"); }, 5); return new Promise(() => {}); }
  if (solution.includes("throw")) throw new Error("plain boom");
  return { score: solution.endsWith(gt) ? 1 : 0, main: isMainThread };
}
`;
const BATCHED = `
export function compute_score(dss, sols, gts) {
  if (sols.some((s) => s.includes("hang"))) for (;;) {}
  if (sols.some((s) => s.includes("exit"))) process.exit(7);
  return sols.map((s, i) => (s.endsWith(gts[i]) ? 1 : 0));
}
`;

function cfg(manager: string, path: string): Config {
  return {
    custom_reward_function: { path, name: "compute_score", reward_kwargs: {} },
    reward_model: { reward_manager: manager, reward_kwargs: { timeout_s: 0.5, num_workers: 2 } },
    data: { reward_fn_key: "data_source", max_response_length: 12 },
  };
}

const row = (response: string) => ({ prompt: "a", response, dataSource: "d", groundTruth: "1" });

for (const manager of ["naive", "dapo"]) {
  test(`${manager}: user reward code is contained; each fault names the file and the sample`, { timeout: 60_000 }, async () => {
    const dir = mkdtempSync(join(tmpdir(), "verl-contain-"));
    const file = join(dir, "reward.mjs");
    writeFileSync(file, PER_SAMPLE);
    const mgr = await loadRewardManager(cfg(manager, file), tok, { numExamine: 0 });
    try {
      const ok = await mgr.compute(makeBatch(tok, [row("ok 1"), row("ok 2")], 2, 12));
      assert.deepEqual(rowSums(ok.rewardTensor), [1, 0]);
      assert.deepEqual(ok.rewardExtraInfo.main, [false, false], "scored in scoring threads, not the driver");
      const cases: [string, RegExp][] = [
        ["hang", /timed out after 0\.5 s \(reward_model\.reward_kwargs\.timeout_s\)/],
        ["never", /timed out after 0\.5 s/],
        ["exit", /called process\.exit|exited \(code 7\)/],
        ["async", /async boom/],
        ["throw", /plain boom/],
      ];
      for (const [what, reason] of cases) {
        const t0 = Date.now();
        await assert.rejects(mgr.compute(makeBatch(tok, [row("ok 1"), row(`${what} 1`)], 2, 12)), (e: Error) => {
          assert.match(e.message, new RegExp(`^reward function compute_score \\(${file.replace(/[.*+?^${}()|[\]\\/]/g, "\\$&")}\\) failed on sample 1 \\(data_source "d", response "${what} 1"\\): `));
          assert.match(e.message, reason);
          assert.doesNotMatch(e.message, /\n\s+at /, "no raw stack in the message");
          return true;
        }, what);
        assert.ok(Date.now() - t0 < 10_000, `${what}: failed in ${Date.now() - t0} ms`);
      }
      // The threads that were stopped are replaced: scoring goes on.
      assert.deepEqual(rowSums((await mgr.compute(makeBatch(tok, [row("ok 1")], 2, 12))).rewardTensor), [1]);
      assert.ok(isMainThread);
    } finally {
      await mgr.close?.();
      rmSync(dir, { recursive: true, force: true });
    }
  });
}

test("batch: the user's batch function is contained too; a fault names the file and the batch", { timeout: 60_000 }, async () => {
  const dir = mkdtempSync(join(tmpdir(), "verl-contain-"));
  const file = join(dir, "batch.mjs");
  writeFileSync(file, BATCHED);
  const mgr = await loadRewardManager(cfg("batch", file), tok, { numExamine: 0 });
  try {
    assert.deepEqual(rowSums((await mgr.compute(makeBatch(tok, [row("ok 1"), row("ok 2")], 2, 12))).rewardTensor), [1, 0]);
    await assert.rejects(mgr.compute(makeBatch(tok, [row("ok 1"), row("hang")], 2, 12)),
      /reward function compute_score \(.*batch\.mjs\) failed on the batch of 2 samples \(data_source "d"\): timed out after 0\.5 s/);
    await assert.rejects(mgr.compute(makeBatch(tok, [row("exit")], 2, 12)), /batch\.mjs\) failed on the batch of 1 samples .*exited \(code 7\)|called process\.exit/);
  } finally {
    await mgr.close?.();
    rmSync(dir, { recursive: true, force: true });
  }
});
