// `verl preprocess gsm8k` with verl's flags and verl's meanings (examples/data_preprocess/gsm8k.py):
// --local_dataset_path is the input, --local_save_dir the output, --local_dir verl's deprecated
// name of the output (verl-ts's old --local-dir, the input, now means the output too).
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { readParquet } from "../../../src/data/parquet.js";

const MAIN = fileURLToPath(new URL("../../../src/cli/main.js", import.meta.url));

function verl(...args: string[]): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    execFile(process.execPath, [MAIN, ...args], { encoding: "utf8", env: { ...process.env, CI: "1", HF_HUB_OFFLINE: "1", HF_HOME: join(tmpdir(), "verl-preprocess-test-no-hf-cache") }, timeout: 60_000 }, (err, stdout, stderr) => {
      resolve({ code: err ? (typeof err.code === "number" ? err.code : null) : 0, stdout, stderr });
    });
  });
}

const QA = (q: string, a: number) => JSON.stringify({ question: q, answer: `so it is ${a}\n#### ${a}` });

test("preprocess gsm8k: verl's flags, hyphenated spellings, --local_dir deprecated as the output, old --local-dir usage refused", async () => {
  const dir = mkdtempSync(join(tmpdir(), "verl-preprocess-flags-"));
  try {
    const raw = join(dir, "raw");
    mkdirSync(raw);
    writeFileSync(join(raw, "train.jsonl"), [QA("1+1?", 2), QA("2+2?", 4), QA("3+3?", 6)].join("\n") + "\n");
    writeFileSync(join(raw, "test.jsonl"), QA("5+5?", 10) + "\n");
    const out = (n: string) => join(dir, n);
    const [verlFlags, hyphens, deprecated, oldUsage, noInput, hdfs] = await Promise.all([
      verl("preprocess", "gsm8k", "--local_dataset_path", raw, "--local_save_dir", out("a")),
      verl("preprocess", "gsm8k", "--local-dataset-path", raw, "--local-save-dir", out("b")),
      verl("preprocess", "gsm8k", "--local_dataset_path", raw, "--local_dir", out("c")),
      verl("preprocess", "gsm8k", "--local-dir", raw, "--output-dir", out("d")),
      verl("preprocess", "gsm8k", "--local-dir", out("e")),
      verl("preprocess", "gsm8k", "--local_dataset_path", raw, "--hdfs_dir", "hdfs://x"),
    ]);
    for (const r of [verlFlags, hyphens, deprecated]) assert.equal(r.code, 0, r.stderr);
    const train = await readParquet(join(out("a"), "train.parquet"));
    assert.equal(train.length, 3);
    assert.deepEqual(train[2]!.reward_model, { style: "rule", ground_truth: "6" });
    assert.equal((await readParquet(join(out("a"), "test.parquet"))).length, 1);
    assert.ok(existsSync(join(out("b"), "train.parquet")), "hyphenated spellings");
    assert.ok(existsSync(join(out("c"), "train.parquet")), "--local_dir is the output, as in verl");
    assert.match(deprecated.stderr, /--local_dir is deprecated \(as in verl\): use --local_save_dir/);
    assert.equal(verlFlags.stderr.includes("deprecated"), false);

    assert.equal(oldUsage.code, 2);
    assert.match(oldUsage.stderr, /--local-dir .*raw and --output-dir .*d each name the output directory .*the raw data set is --local_dataset_path/);
    assert.equal(existsSync(out("d")), false);
    assert.equal(noInput.code, 1);
    assert.match(noInput.stderr, /--local_dir is deprecated/);
    // without --local_dataset_path: openai/gsm8k from the Hub; offline with an empty cache, that is one clear error
    assert.match(noInput.stderr, /dataset openai\/gsm8k@main is not in the Hugging Face cache .* and HF_HUB_OFFLINE is set/);
    assert.equal(hdfs.code, 2);
    assert.match(hdfs.stderr, /--hdfs_dir is not available in verl-ts/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
