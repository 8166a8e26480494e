// Disk full (ENOSPC) while writing the metrics file or a rollout dump: the error names the file
// and the fix. The kernel's own ENOSPC comes from /dev/full: writes aimed at the file under test
// are sent there (node's fs exports are patched and re-synced into the ESM bindings).
import { test } from "node:test";
import assert from "node:assert/strict";
import fs, { existsSync, mkdtempSync, readdirSync, rmSync } from "node:fs";
import { syncBuiltinESMExports } from "node:module";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Tracking } from "../../src/utils/tracking.js";
import { dumpGenerations } from "../../src/trainer/ppo/validation.js";

const haveDevFull = existsSync("/dev/full");

/** Run `body` with writes to paths matching `hit` going to /dev/full. */
function withFullDisk<T>(hit: (path: string) => boolean, body: () => T): T {
  const { appendFileSync, writeFileSync } = fs;
  const route = (p: unknown) => (typeof p === "string" && hit(p) ? "/dev/full" : p) as fs.PathOrFileDescriptor;
  fs.appendFileSync = ((p: fs.PathOrFileDescriptor, d: string | Uint8Array, o?: fs.WriteFileOptions) => appendFileSync(route(p), d, o)) as typeof fs.appendFileSync;
  fs.writeFileSync = ((p: fs.PathOrFileDescriptor, d: string | NodeJS.ArrayBufferView, o?: fs.WriteFileOptions) => writeFileSync(route(p), d, o)) as typeof fs.writeFileSync;
  syncBuiltinESMExports();
  try {
    return body();
  } finally {
    fs.appendFileSync = appendFileSync;
    fs.writeFileSync = writeFileSync;
    syncBuiltinESMExports();
  }
}

test("a full disk under the metrics file names the file", { skip: !haveDevFull && "no /dev/full" }, () => {
  const dir = mkdtempSync(join(tmpdir(), "verl-full-"));
  const prev = process.env.VERL_FILE_LOGGER_PATH;
  try {
    const path = join(dir, "metrics.jsonl");
    process.env.VERL_FILE_LOGGER_PATH = path;
    const t = new Tracking({ projectName: "p", experimentName: "e", backends: "file" });
    t.log({ "critic/score/mean": 0.5 }, 1);
    withFullDisk((p) => p === path, () => {
      assert.throws(() => t.log({ "critic/score/mean": 0.6 }, 2), (e: Error & { code?: string }) => {
        assert.equal(e.code, "ENOSPC");
        assert.equal(e.message, `cannot write the metrics file ${path}: ENOSPC: no space left on device, write; the disk is full: free space there or point this output elsewhere`);
        return true;
      });
    });
  } finally {
    if (prev === undefined) delete process.env.VERL_FILE_LOGGER_PATH; else process.env.VERL_FILE_LOGGER_PATH = prev;
    rmSync(dir, { recursive: true, force: true });
  }
});

test("a full disk under the rollout dump names the file and the setting, and leaves no temporary file", { skip: !haveDevFull && "no /dev/full" }, () => {
  const dir = mkdtempSync(join(tmpdir(), "verl-full-"));
  try {
    withFullDisk((p) => p.startsWith(join(dir, ".7.jsonl.tmp-")), () => {
      assert.throws(() => dumpGenerations(dir, 7, [{ input: "1+1=", output: "2", score: 1 }]),
        new RegExp(`^Error: trainer\\.rollout_data_dir: cannot write ${join(dir, "7.jsonl").replace(/[.]/g, "\\.")}: ENOSPC: no space left on device, write; the disk is full: .*\\(or unset trainer\\.rollout_data_dir to stop the dump\\)$`));
    });
    assert.deepEqual(readdirSync(dir), []);
    dumpGenerations(dir, 8, [{ input: "a", output: "b", score: 0 }]);
    assert.deepEqual(readdirSync(dir), ["8.jsonl"]);
  } finally { rmSync(dir, { recursive: true, force: true }); }
});
