// Python reward functions as verl users write them, run by a real python3:
// keyword calls with reward_kwargs, dicts and floats, async functions, prints
// that must not break the reply stream, the batch and prime managers, and the
// failures: an exception, a hang, an import error, no python3. Skipped where
// this machine has no python3.
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { CharTokenizer } from "../../src/models/tokenizers/char.js";
import { loadCustomRewardFunction } from "../../src/reward/custom.js";
import { loadRewardManager } from "../../src/reward/load.js";
import { PrimeRewardManager } from "../../src/reward/managers/index.js";
import type { Config, ConfigNode } from "../../src/config/index.js";
import { makeBatch, rowSums } from "./helpers.js";

const skip = spawnSync("python3", ["--version"], { stdio: "ignore" }).status === 0 ? false : "python3 is not installed here";
const tok = new CharTokenizer("0123456789#+=-,.$ abcdefghijklmnopqrstuvwxyz");

// verl's signature; prints on stdout (must land on stderr), a dict with extra fields, reward_kwargs by keyword.
const VERL_STYLE = `
import re
def compute_score(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):
    print("scoring", solution_str)
    m = re.search(r"#### (\\d+)", solution_str)
    ok = m is not None and m.group(1) == ground_truth
    return {"score": (1.0 if ok else 0.0) + bonus, "acc": ok, "split": (extra_info or {}).get("split")}

async def async_score(data_source, solution_str, ground_truth, extra_info=None):
    return float(len(solution_str))

def batch_score(data_sources, solution_strs, ground_truths, extra_infos, scale=1):
    return [scale * float(s.endswith(g)) for s, g in zip(solution_strs, ground_truths)]

def nasty(data_source, solution_str, ground_truth, extra_info=None):
    if "hang" in solution_str:
        while True:
            pass
    if "raise" in solution_str:
        raise ValueError("cannot parse " + solution_str)
    if "nan" in solution_str:
        return float("nan")
    return 1.0
`;

function cfg(path: string, name: string, rewardKwargs: ConfigNode = {}, manager = "naive", managerKwargs: ConfigNode = {}): Config {
  return {
    custom_reward_function: { path, name, reward_kwargs: rewardKwargs },
    reward_model: { reward_manager: manager, reward_kwargs: managerKwargs },
    data: { reward_fn_key: "data_source" },
  };
}

function withDir<T>(fn: (dir: string, py: string) => Promise<T>): Promise<T> {
  const dir = mkdtempSync(join(tmpdir(), "verl-pyreward-"));
  const py = join(dir, "reward.py");
  writeFileSync(py, VERL_STYLE);
  return fn(dir, py).finally(() => rmSync(dir, { recursive: true, force: true }));
}

test("python compute_score through the naive manager: keyword call, reward_kwargs, dict extras, prints kept off the reply stream", { skip }, () => withDir(async (_dir, py) => {
  const mgr = await loadRewardManager(cfg(py, "compute_score", { bonus: 0.5 }), tok, { numExamine: 0 });
  const data = makeBatch(tok, [
    { prompt: "q", response: "so #### 42", dataSource: "openai/gsm8k", groundTruth: "42", extraInfo: { split: "train" } },
    { prompt: "q", response: "so #### 41", dataSource: "openai/gsm8k", groundTruth: "42", extraInfo: { split: "test" } },
  ], 2, 12);
  const r = await mgr.compute(data);
  assert.deepEqual(rowSums(r.rewardTensor), [1.5, 0.5]);
  assert.deepEqual(r.rewardExtraInfo.acc, [true, false]);
  assert.deepEqual(r.rewardExtraInfo.split, ["train", "test"]);
  const asyncFn = await loadCustomRewardFunction(cfg(py, "async_score"));
  assert.equal(await asyncFn!.computeScore("d", "abcd", "x"), 4);
}));

test("python batch compute_score: one call with the lists, manager reward_kwargs as keywords", { skip }, () => withDir(async (_dir, py) => {
  const mgr = await loadRewardManager(cfg(py, "batch_score", {}, "batch", { scale: 3 }), tok, { numExamine: 0 });
  const data = makeBatch(tok, [
    { prompt: "q", response: "is 7", dataSource: "a", groundTruth: "7" },
    { prompt: "q", response: "is 8", dataSource: "a", groundTruth: "7" },
  ], 2, 8);
  assert.deepEqual(rowSums((await mgr.compute(data)).rewardTensor), [3, 0]);
}));

test("python failures: an exception names file, function, row and sample; a hang times out and the next call runs", { skip }, () => withDir(async (_dir, py) => {
  {
    const mgr = await loadRewardManager(cfg(py, "nasty", {}, "naive", { timeout_s: 1.5 }), tok, { numExamine: 0 });
    const batch = (response: string) => makeBatch(tok, [
      { prompt: "q", response: "fine", dataSource: "a", groundTruth: "1" },
      { prompt: "q", response, dataSource: "my/set", groundTruth: "1" },
    ], 2, 12);
    await assert.rejects(mgr.compute(batch("raise it")), (e: Error) => {
      assert.match(e.message, /reward: compute_score failed on row 1 \(data_source "my\/set"\): nasty in .*reward\.py raised on the sample with data_source "my\/set", ground_truth "1", solution "raise it": ValueError: cannot parse raise it/);
      assert.match(e.message, /Traceback \(most recent call last\):[\s\S]*line \d+, in nasty/);
      return true;
    });
    const t0 = Date.now();
    await assert.rejects(mgr.compute(batch("hang")), /row 1 .*nasty in .*reward\.py on the sample .*"hang".* ran past its 1\.5 s timeout \(reward_model\.reward_kwargs\.timeout_s; the Python process was killed\)/);
    assert.ok(Date.now() - t0 < 10_000);
    assert.ok(Number.isNaN(Math.max(...rowSums((await mgr.compute(batch("nan"))).rewardTensor))), "NaN is carried, as from JS");
    assert.deepEqual(rowSums((await mgr.compute(batch("ok"))).rewardTensor), [1, 1], "a fresh process after the kill");
  }
}));

test("python prime manager: processes score in parallel; timeouts and exceptions score 0 and are counted", { skip }, () => withDir(async (_dir, py) => {
  const mgr = (await loadRewardManager(cfg(py, "nasty", {}, "prime", { num_workers: 2, timeout_s: 1.5 }), tok, { numExamine: 0 })) as PrimeRewardManager;
  try {
    const data = makeBatch(tok, [
      { prompt: "q", response: "fine", dataSource: "a", groundTruth: "1" },
      { prompt: "q", response: "hang", dataSource: "a", groundTruth: "1" },
      { prompt: "q", response: "raise", dataSource: "a", groundTruth: "1" },
      { prompt: "q", response: "good", dataSource: "a", groundTruth: "1" },
    ], 2, 8);
    const r = await mgr.compute(data);
    assert.deepEqual(rowSums(r.rewardTensor), [1, 0, 0, 1]);
    assert.deepEqual(r.metrics, { "reward/timeout_count": 1, "reward/error_count": 1 });
  } finally {
    await mgr.close();
  }
}));

test("python load errors: import failure, missing function, pkg:// modules, no python3 on PATH", { skip }, () => withDir(async (dir, py) => {
  writeFileSync(join(dir, "broken.py"), "import no_such_module_here\n");
  await assert.rejects(loadCustomRewardFunction(cfg(join(dir, "broken.py"), "compute_score")),
    /cannot load custom_reward_function\.path=.*broken\.py: ModuleNotFoundError: No module named 'no_such_module_here'/);
  await assert.rejects(loadCustomRewardFunction(cfg(py, "nope")), /reward\.py has no function 'nope' \(callables: async_score, batch_score, compute_score, nasty\)/);
  const cwd = process.cwd();
  process.chdir(dir);
  try {
    const f = await loadCustomRewardFunction(cfg("pkg://reward", "async_score"));
    assert.equal(await f!.computeScore("d", "xyz", ""), 3);
  } finally {
    process.chdir(cwd);
  }
  const path = process.env.PATH;
  process.env.PATH = join(dir, "no-bin");
  try {
    await assert.rejects(loadCustomRewardFunction(cfg(py, "compute_score")),
      /custom_reward_function\.path=.*reward\.py is a Python reward function, which needs `python3`: not found on PATH/);
  } finally {
    process.env.PATH = path;
  }
}));
