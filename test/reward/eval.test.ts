import { test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { writeParquet } from "../../src/data/parquet.js";
import { evaluateGenerations } from "../../src/reward/evaluate.js";
import { defaultComputeScore } from "../../src/reward/scorers/registry.js";

const cli = fileURLToPath(new URL("../../src/cli/main.js", import.meta.url));
const cols = { responseKey: "responses", dataSourceKey: "data_source", rewardModelKey: "reward_model" };

const ROWS = [
  { data_source: "openai/gsm8k", responses: ["#### 3", "#### 4"], reward_model: { style: "rule", ground_truth: "3" }, extra_info: { index: 0 } },
  { data_source: "openai/gsm8k", responses: ["so #### 10", "#### 1,0"], reward_model: { style: "rule", ground_truth: "10" }, extra_info: { index: 1 } },
  { data_source: "lighteval/MATH", responses: ["\\boxed{\\dfrac{1}{2}}"], reward_model: { style: "rule", ground_truth: "\\frac12" }, extra_info: { index: 2 } },
];

test("evaluateGenerations: per-row mean over responses, then per data source mean", async () => {
  const m = await evaluateGenerations(ROWS, cols, defaultComputeScore);
  assert.deepEqual(m, { "test_score/lighteval/MATH": 1, "test_score/openai/gsm8k": 0.75 });
  await assert.rejects(evaluateGenerations([{ ...ROWS[0]!, responses: "#### 3" }], cols, defaultComputeScore), /row 0: column 'responses' \(data.response_key\) must be a non-empty list of strings/);
  await assert.rejects(evaluateGenerations([{ ...ROWS[0]!, reward_model: null }], cols, defaultComputeScore), /row 0: column 'reward_model'/);
});

test("verl eval: reads a generated parquet and prints test_score JSON, with built-in scorers or a custom function", async () => {
  const dir = mkdtempSync(join(tmpdir(), "verl-eval-"));
  try {
    const path = join(dir, "gen.parquet");
    await writeParquet(path, ROWS);
    {
      const env = { ...process.env, VERL_LOG_LEVEL: "warn" };
      const res = spawnSync(process.execPath, [cli, "eval", `data.path=${path}`], { encoding: "utf8", env });
      assert.equal(res.status, 0, res.stderr);
      assert.deepEqual(JSON.parse(res.stdout.trim()), { "test_score/lighteval/MATH": 1, "test_score/openai/gsm8k": 0.75 });

      writeFileSync(join(dir, "len.mjs"), "export const by_length = (ds, s, gt, extra, kw) => ({ score: s.length >= kw.min ? 1 : 0 });");
      const custom = spawnSync(process.execPath, [cli, "eval", `data.path=${path}`, `custom_reward_function.path=${join(dir, "len.mjs")}`,
        "custom_reward_function.name=by_length", "+custom_reward_function.reward_kwargs.min=8"], { encoding: "utf8", env });
      assert.equal(custom.status, 0, custom.stderr);
      assert.deepEqual(JSON.parse(custom.stdout.trim()), { "test_score/lighteval/MATH": 1, "test_score/openai/gsm8k": 0.5 });

      // The same function in Python, as a verl user has it; the CLI exits with its python3 process still idle.
      if (spawnSync("python3", ["--version"]).status === 0) {
        writeFileSync(join(dir, "len.py"), "def by_length(data_source, solution_str, ground_truth, extra_info=None, min=0):\n    return {'score': 1.0 if len(solution_str) >= min else 0.0}\n");
        const py = spawnSync(process.execPath, [cli, "eval", `data.path=${path}`, `custom_reward_function.path=${join(dir, "len.py")}`,
          "custom_reward_function.name=by_length", "+custom_reward_function.reward_kwargs.min=8"], { encoding: "utf8", env, timeout: 60_000 });
        assert.equal(py.status, 0, py.stderr);
        assert.deepEqual(JSON.parse(py.stdout.trim()), { "test_score/lighteval/MATH": 1, "test_score/openai/gsm8k": 0.5 });
      }

      const missing = spawnSync(process.execPath, [cli, "eval", `data.path=${join(dir, "none.parquet")}`], { encoding: "utf8", env });
      assert.notEqual(missing.status, 0);
      assert.match(missing.stderr, /none\.parquet/);
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
