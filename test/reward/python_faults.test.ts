// Issue 28 item 10: Python reward files under naive, dapo and batch obey
// reward_model.reward_kwargs.timeout_s (a loop, a hung async def, a hang at import),
// a stdin read cannot hang, a list is not a score, NaN follows the same rule as in
// JS (accepted as verl does, then counted by the trainer's guard), and a VERL_PYTHON
// that is no Python says so. Skipped where this machine has no python3.
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { CharTokenizer } from "../../src/models/tokenizers/char.js";
import { loadCustomRewardFunction } from "../../src/reward/custom.js";
import { loadRewardManager } from "../../src/reward/load.js";
import type { RewardManager } from "../../src/reward/types.js";
import type { Config, ConfigNode } from "../../src/config/index.js";
import { makeBatch } from "./helpers.js";

const skip = spawnSync("python3", ["--version"], { stdio: "ignore" }).status === 0 ? false : "python3 is not installed here";
const hasNumpy = !skip && spawnSync("python3", ["-c", "import numpy"], { stdio: "ignore" }).status === 0;
const tok = new CharTokenizer("0123456789#+=-,.$ abcdefghijklmnopqrstuvwxyz");
process.env.VERL_LOG_LEVEL ??= "fatal";

const REWARD = `
import asyncio, sys
def loop(data_source, solution_str, ground_truth, extra_info=None):
    if "hang" in solution_str:
        while True:
            pass
    return 1.0

def reads_stdin(data_source, solution_str, ground_truth, extra_info=None):
    return float(len(input()))

async def hung_async(data_sources, solution_strs, ground_truths, extra_infos, **kw):
    await asyncio.Event().wait()

def as_list(data_source, solution_str, ground_truth, extra_info=None):
    return [0.5, 1.0] if "two" in solution_str else 1.0

def as_array(data_source, solution_str, ground_truth, extra_info=None):
    import numpy as np
    return np.array([0.5]) if "arr" in solution_str else np.float32(1.0)

def nan(data_source, solution_str, ground_truth, extra_info=None):
    return float("nan") if "nan" in solution_str else {"score": float("inf"), "x": float("-inf")}
`;

function cfg(path: string, name: string, manager = "naive", managerKwargs: ConfigNode = {}): Config {
  return {
    custom_reward_function: { path, name, reward_kwargs: {} },
    reward_model: { reward_manager: manager, reward_kwargs: managerKwargs },
    data: { reward_fn_key: "data_source", max_response_length: 12 },
  };
}

async function withDir<T>(fn: (dir: string, py: string) => Promise<T>): Promise<T> {
  const dir = mkdtempSync(join(tmpdir(), "verl-pyfaults-"));
  const py = join(dir, "reward.py");
  writeFileSync(py, REWARD);
  try {
    return await fn(dir, py);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

const batch = (response: string) => makeBatch(tok, [
  { prompt: "q", response: "fine", dataSource: "a", groundTruth: "1" },
  { prompt: "q", response, dataSource: "my/set", groundTruth: "1" },
], 2, 12);

async function using<T>(m: RewardManager, fn: (m: RewardManager) => Promise<T>): Promise<T> {
  try {
    return await fn(m);
  } finally {
    await m.close?.();
  }
}

async function within(ms: number, p: Promise<unknown>, re: RegExp): Promise<void> {
  const t0 = Date.now();
  await assert.rejects(p, re);
  assert.ok(Date.now() - t0 < ms, `took ${Date.now() - t0} ms`);
}

test("reward_model.reward_kwargs.timeout_s stops a Python loop under naive and dapo", { skip }, () => withDir(async (_d, py) => {
  for (const manager of ["naive", "dapo"]) {
    await using(await loadRewardManager(cfg(py, "loop", manager, { timeout_s: 1.5 }), tok, { numExamine: 0 }), async (m) => {
      await within(10_000, m.compute(batch("hang")), /reward\.py.*"hang".*1\.5 s.*reward_model\.reward_kwargs\.timeout_s/);
    });
  }
}));

test("reward_model.reward_kwargs.timeout_s stops a hung async def under batch", { skip }, () => withDir(async (_d, py) => {
  await using(await loadRewardManager(cfg(py, "hung_async", "batch", { timeout_s: 1.5 }), tok, { numExamine: 0 }), async (m) => {
    await within(10_000, m.compute(batch("x")), /hung_async in .*reward\.py.*1\.5 s.*reward_model\.reward_kwargs\.timeout_s/);
  });
}));

test("a hang at import obeys reward_model.reward_kwargs.timeout_s", { skip }, () => withDir(async (dir) => {
  const slow = join(dir, "slow.py");
  writeFileSync(slow, "import time\ntime.sleep(3600)\ndef compute_score(**kw):\n    return 1.0\n");
  await within(10_000, loadRewardManager(cfg(slow, "compute_score", "naive", { timeout_s: 1.5 }), tok, { numExamine: 0 }),
    /loading .*slow\.py.*1\.5 s.*reward_model\.reward_kwargs\.timeout_s/);
}));

test("a Python reward reading stdin fails at once instead of hanging", { skip }, () => withDir(async (_d, py) => {
  await using(await loadRewardManager(cfg(py, "reads_stdin", "naive"), tok, { numExamine: 0 }), async (m) => {
    await within(10_000, m.compute(batch("x")), /EOFError/);
  });
}));

test("VERL_PYTHON_REWARD_TIMEOUT_S is gone: setting it is refused, naming the config key", { skip }, () => withDir(async (_d, py) => {
  process.env.VERL_PYTHON_REWARD_TIMEOUT_S = "5";
  try {
    await assert.rejects(loadCustomRewardFunction(cfg(py, "loop")), /VERL_PYTHON_REWARD_TIMEOUT_S is no longer read: set reward_model\.reward_kwargs\.timeout_s/);
  } finally {
    delete process.env.VERL_PYTHON_REWARD_TIMEOUT_S;
  }
}));

test("a list or an array is not a score: the error names the file and the row", { skip }, () => withDir(async (_d, py) => {
  await using(await loadRewardManager(cfg(py, "as_list"), tok, { numExamine: 0 }), async (m) => {
    await assert.rejects(m.compute(batch("two")), (e: Error) => {
      assert.match(e.message, /reward\.py/);
      assert.match(e.message, /row 1 \(data_source "my\/set"\)/);
      assert.match(e.message, /a list \(\[0\.5,1\]\) is not a score/);
      return true;
    });
  });
  if (hasNumpy) {
    await using(await loadRewardManager(cfg(py, "as_array"), tok, { numExamine: 0 }), async (m) => {
      await assert.rejects(m.compute(batch("arr")), /reward\.py.*row 1 .*a list \(\[0\.5\]\) is not a score/s);
      // numpy scalars are scores
      const ok = await m.compute(batch("one"));
      assert.equal(Array.from(ok.rewardTensor.data).filter((x) => x === 1).length, 2);
    });
  }
}));

test("Python NaN and infinity are carried as in JS (verl's rule: placed in the reward tensor; the trainer counts them)", { skip }, () => withDir(async (_d, py) => {
  await using(await loadRewardManager(cfg(py, "nan"), tok, { numExamine: 0 }), async (m) => {
    const r = await m.compute(batch("nan"));
    const placed = [3, 12 + 2].map((i) => r.rewardTensor.data[i]!);
    assert.equal(placed[0], Infinity);
    assert.ok(Number.isNaN(placed[1]), `row 1: ${placed[1]}`);
    assert.deepEqual(r.rewardExtraInfo.x, [-Infinity]);
  });
}));

test("VERL_PYTHON that is not a Python interpreter says so, naming it", { skip }, () => withDir(async (_d, py) => {
  process.env.VERL_PYTHON = "/bin/false";
  try {
    await assert.rejects(loadCustomRewardFunction(cfg(py, "loop")),
      /VERL_PYTHON=\/bin\/false exited \(code 1\) before it loaded .*reward\.py: it does not look like a working Python 3 interpreter/);
  } finally {
    delete process.env.VERL_PYTHON;
  }
}));
