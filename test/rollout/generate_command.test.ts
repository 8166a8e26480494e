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

test("on a terminal, verl generate's progress line advances while the tokens are decoded", async (t) => {
  const bin = storiesBin();
  if (!bin) return t.skip(STORIES_MISSING);
  const dir = mkdtempSync(join(tmpdir(), "gen-tty-"));
  const input = join(dir, "in.parquet"), output = join(dir, "out.parquet");
  await writeParquet(input, [{ prompt: [{ role: "user", content: "Once upon a time" }] }, { prompt: [{ role: "user", content: "The sun" }] }]);
  const stderr = process.stderr as NodeJS.WriteStream & { isTTY: boolean };
  const { isTTY, write } = stderr;
  const lines: string[] = [];
  stderr.isTTY = true;
  stderr.write = ((s: string | Uint8Array) => { lines.push(String(s)); return true; }) as typeof stderr.write;
  try {
    await runGenerate([`data.path=${input}`, `data.output_path=${output}`, `model.path=${bin}`, "trainer.device=wasm", "rollout.response_length=16", "data.batch_size=2", "data.n_samples=1", "rollout.temperature=0"]);
  } finally {
    stderr.isTTY = isTTY;
    stderr.write = write;
  }
  const during = lines.findIndex((l) => /^\rgenerate: 0\/2 \(0%\) rows 1-2: token \d+\/16/.test(l));
  const finished = lines.findIndex((l) => /^\rgenerate: 2\/2 \(100%\)/.test(l));
  assert.ok(lines[0]!.startsWith("\rgenerate: 0/2 (0%)"), `the line shows before decoding starts: ${JSON.stringify(lines.slice(0, 3))}`);
  assert.ok(during >= 0 && during < finished, `a token-level line before the rows are done: ${JSON.stringify(lines)}`);
});
