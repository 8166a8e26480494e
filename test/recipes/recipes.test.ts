// The recipes as files: every script parses, the smoke runner covers every recipe,
// a recipe whose model or data is absent skips with a clear line, and the stories
// recipe's reward module scores as documented.
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { readdirSync, readFileSync, statSync } from "node:fs";
import { join, relative } from "node:path";
import { fileURLToPath } from "node:url";
import { loadRewardFunction } from "../../src/reward/custom.js";

const ROOT = fileURLToPath(new URL("../../../", import.meta.url));
const RECIPES = join(ROOT, "recipes");

function scripts(dir: string): string[] {
  return readdirSync(dir).flatMap((name) => {
    const p = join(dir, name);
    return statSync(p).isDirectory() ? scripts(p) : name.endsWith(".sh") ? [p] : [];
  });
}

function sh(args: string[], env: Record<string, string> = {}): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    execFile("bash", args, { encoding: "utf8", env: { ...process.env, ...env }, timeout: 60_000 }, (err, stdout, stderr) => {
      resolve({ code: err ? (typeof err.code === "number" ? err.code : 1) : 0, stdout, stderr });
    });
  });
}

test("every recipe script parses (bash -n)", async () => {
  const all = scripts(RECIPES);
  assert.ok(all.length >= 8, `found ${all.length} scripts`);
  for (const s of all) {
    const r = await sh(["-n", s]);
    assert.equal(r.code, 0, `${relative(ROOT, s)}: ${r.stderr}`);
  }
});

test("run_all_smoke.sh runs every recipe (all scripts but the sourced helpers)", () => {
  const runner = readFileSync(join(RECIPES, "run_all_smoke.sh"), "utf8");
  const helpers = new Set(["common.sh", "run_all_smoke.sh"]);
  for (const s of scripts(RECIPES)) {
    const rel = relative(RECIPES, s);
    if (helpers.has(rel.split("/").pop()!)) continue;
    assert.ok(runner.includes(rel), `run_all_smoke.sh does not run ${rel}`);
  }
});

test("a recipe whose model is absent skips with one clear line and exit 0", async () => {
  for (const recipe of ["gsm8k_grpo/run.sh", "gsm8k_ppo/run.sh", "stories_grpo/run.sh"]) {
    const r = await sh([join(RECIPES, recipe)], { SMOKE: "1", MODEL_PATH: "/nonexistent/model.bin", VERL: "false" });
    assert.equal(r.code, 0, `${recipe}: ${r.stderr}`);
    assert.match(r.stderr, new RegExp(`^SKIP ${recipe.replace(".", "\\.")}: model /nonexistent/model\\.bin is absent`), recipe);
  }
});

test("the stories reward: 1 when the story mentions the word (whole word, any case), optionally within max_chars", async () => {
  const fn = await loadRewardFunction({ path: join(RECIPES, "stories_grpo", "reward.ts"), name: "compute_score", kwargs: {} });
  const score = async (text: string, word = "dog", kw: Record<string, unknown> = {}) =>
    (await fn.raw("tinystories/mention", text, word, null, kw)) as { score: number; mentions: number };
  assert.equal((await score("Tom saw a Dog. The dog ran.")).score, 1);
  assert.equal((await score("Tom saw a Dog. The dog ran.")).mentions, 2);
  assert.equal((await score("The doghouse was red and the hotdog was hot.")).score, 0);
  assert.equal((await score("A dog.", "dog", { max_chars: 3 })).score, 0);
  assert.equal((await score("A dog.", "dog", { max_chars: 10 })).score, 1);
  await assert.rejects(async () => score("x", "two words"), /ground_truth must be one word/);
});
