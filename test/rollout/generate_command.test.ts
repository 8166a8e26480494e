import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { loadConfig } from "../../src/config/index.js";
import { readParquet, writeParquet } from "../../src/data/parquet.js";
import { run } from "../../src/cli/commands/generate.js";
import { storiesBin, STORIES_MISSING } from "../models/stories.js";

async function runGenerate(overrides: string[]): Promise<void> {
  await run({ config: loadConfig({ configName: "generation", overrides }), overrides, options: {} });
}

test("verl generate writes n_samples responses per row and keeps every column", async (t) => {
  const bin = storiesBin();
  if (!bin) return t.skip(STORIES_MISSING);
  const dir = mkdtempSync(join(tmpdir(), "gen-"));
  const input = join(dir, "in.parquet"), output = join(dir, "out.parquet");
  await writeParquet(input, [
    { prompt: [{ role: "user", content: "Once upon a time" }], data_source: "a", extra_info: { index: 0 } },
    { prompt: [{ role: "user", content: "Tom had a dog" }], data_source: "b", extra_info: { index: 1 } },
    { prompt: [{ role: "user", content: "The sun" }], data_source: "a", extra_info: { index: 2 } },
  ]);
  const base = [`data.path=${input}`, `data.output_path=${output}`, `model.path=${bin}`, "trainer.device=wasm", "rollout.response_length=24", "data.batch_size=2"];
  await runGenerate([...base, "data.n_samples=3"]);
  const rows = await readParquet(output);
  assert.equal(rows.length, 3);
  rows.forEach((r, i) => {
    assert.equal(r["data_source"], ["a", "b", "a"][i]);
    assert.deepEqual(r["extra_info"], { index: i });
    const resp = r["responses"] as string[];
    assert.equal(resp.length, 3);
    assert.ok(resp.every((s) => typeof s === "string" && s.length > 0));
  });
  // greedy: one sample, the README continuation for the first row
  await runGenerate([...base, "data.n_samples=1", "rollout.temperature=0"]);
  const greedy = await readParquet(output);
  assert.ok((greedy[0]!["responses"] as string[])[0]!.startsWith(", there was a little girl named Lily."));
  await assert.rejects(runGenerate([...base, "data.n_samples=2", "rollout.temperature=0"]), /set data.n_samples=1/);
  await assert.rejects(runGenerate([...base, "data.prompt_key=question"]), /in.parquet row 0: no column 'question'/);
});
