import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import {
  Tracking, fileLoggerPath, formatConsoleLine, knownTrackingBackends, loggerList, registerTrackingBackend,
} from "../../src/utils/tracking.js";

test("console line follows verl: step first, numeric values only", () => {
  assert.equal(formatConsoleLine({ "actor/pg_loss": 0.5, note: "x", "training/global_step": 3 }, 3),
    "step:3 - actor/pg_loss:0.5 - training/global_step:3");
});

test("trainer.logger accepts a string or a list; unknown backends fail clearly, verl's service backends become file", () => {
  assert.deepEqual(loggerList("console"), ["console"]);
  assert.deepEqual(loggerList(["console", "file"]), ["console", "file"]);
  assert.deepEqual(loggerList(null), []);
  assert.throws(() => loggerList(3), /trainer.logger must be a backend name or a list/);
  assert.throws(() => new Tracking({ projectName: "p", experimentName: "e", backends: ["nope"] }),
    /unknown backend 'nope'; known backends: .*console.*file/);
  assert.throws(() => new Tracking({ projectName: "p", experimentName: "e", backends: ["nope"] }), /known backends: .*tensorboard.*wandb/);
  const t = new Tracking({ projectName: "p", experimentName: "e", backends: ["console", "wandb", "mlflow", "tracking"] });
  assert.deepEqual(t.backendNames, ["console", "file"]);
  assert.deepEqual(t.replaced, ["wandb", "mlflow", "tracking"]);
  const f = new Tracking({ projectName: "p", experimentName: "e", backends: ["file", "swanlab"] });
  assert.deepEqual(f.backendNames, ["file"]);
});

test("file backend writes {step, data} lines, and a resumed run drops the steps after the checkpoint", () => {
  const dir = mkdtempSync(join(tmpdir(), "verl-track-"));
  const prev = { ...process.env };
  try {
    process.env.VERL_FILE_LOGGER_ROOT = dir;
    delete process.env.VERL_FILE_LOGGER_PATH;
    const path = fileLoggerPath("proj", "exp");
    assert.equal(path, join(dir, "proj", "exp.jsonl"));
    const t = new Tracking({ projectName: "proj", experimentName: "exp", backends: "file" });
    for (let s = 1; s <= 4; s++) t.log({ "critic/score/mean": s / 10, tag: "a" }, s);
    t.finish();
    const lines = readFileSync(path, "utf8").trim().split("\n").map((l) => JSON.parse(l) as { step: number; data: Record<string, unknown> });
    assert.deepEqual(lines.map((l) => l.step), [1, 2, 3, 4]);
    assert.deepEqual(lines[1]!.data, { "critic/score/mean": 0.2, tag: "a" });
    // Resume from step 2: steps 3 and 4 will be redone, so their old lines go.
    const r = new Tracking({ projectName: "proj", experimentName: "exp", backends: ["file"] });
    r.begin(2);
    r.log({ x: 1 }, 3);
    const after = readFileSync(path, "utf8").trim().split("\n").map((l) => (JSON.parse(l) as { step: number }).step);
    assert.deepEqual(after, [1, 2, 3]);
    process.env.VERL_FILE_LOGGER_PATH = join(dir, "direct.jsonl");
    assert.equal(fileLoggerPath("a", "b"), join(dir, "direct.jsonl"));
  } finally {
    process.env = prev;
    rmSync(dir, { recursive: true, force: true });
  }
});

test("a fresh run with the same names keeps the earlier run's metrics: the old file moves to <experiment>.<n>.jsonl", () => {
  const dir = mkdtempSync(join(tmpdir(), "verl-track-"));
  const prev = { ...process.env };
  const steps = (p: string) => readFileSync(p, "utf8").trim().split("\n").map((l) => (JSON.parse(l) as { step: number; data: { run: number } }));
  try {
    process.env.VERL_FILE_LOGGER_ROOT = dir;
    delete process.env.VERL_FILE_LOGGER_PATH;
    const path = fileLoggerPath("proj", "exp");
    const run = (n: number, stepsRun: number) => {
      const t = new Tracking({ projectName: "proj", experimentName: "exp", backends: ["file"] });
      t.begin(0);
      for (let s = 1; s <= stepsRun; s++) t.log({ run: n }, s);
      t.finish();
    };
    run(1, 3);
    run(2, 2);
    assert.deepEqual(steps(path).map((l) => [l.step, l.data.run]), [[1, 2], [2, 2]]);
    assert.deepEqual(steps(join(dir, "proj", "exp.1.jsonl")).map((l) => [l.step, l.data.run]), [[1, 1], [2, 1], [3, 1]]);
    run(3, 1);
    assert.deepEqual(steps(join(dir, "proj", "exp.2.jsonl")).map((l) => l.data.run), [2, 2]);
    assert.deepEqual(steps(join(dir, "proj", "exp.1.jsonl")).map((l) => l.data.run), [1, 1, 1]);
    assert.deepEqual(readdirSync(join(dir, "proj")).sort(), ["exp.1.jsonl", "exp.2.jsonl", "exp.jsonl"]);
    // An empty file from a run that logged nothing is simply reused.
    writeFileSync(path, "");
    run(4, 1);
    assert.deepEqual(readdirSync(join(dir, "proj")).sort(), ["exp.1.jsonl", "exp.2.jsonl", "exp.jsonl"]);
  } finally {
    process.env = prev;
    rmSync(dir, { recursive: true, force: true });
  }
});

test("user backends register by name; a different factory under a taken name is refused", () => {
  const seen: Array<[number, Record<string, unknown>]> = [];
  const factory = () => ({ log: (d: Record<string, unknown>, s: number) => void seen.push([s, d]) });
  registerTrackingBackend("memory_test", factory);
  registerTrackingBackend("memory_test", factory);
  assert.throws(() => registerTrackingBackend("memory_test", () => ({ log: () => undefined })), /already registered/);
  assert.ok(knownTrackingBackends().includes("memory_test"));
  const t = new Tracking({ projectName: "p", experimentName: "e", backends: ["memory_test"] });
  t.log({ a: 1 }, 7);
  assert.deepEqual(seen, [[7, { a: 1 }]]);
});
