import { test } from "node:test";
import assert from "node:assert/strict";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { CheckpointManager, stepFromPath, TRACKER_FILE } from "../../../src/trainer/checkpoint/checkpoint_manager.js";

function scratch(): string {
  return mkdtempSync(join(tmpdir(), "verl-ckpt-"));
}

test("save writes the step folder atomically, then the tracker; auto-resume picks it", async () => {
  const root = scratch();
  try {
    const cm = new CheckpointManager(root);
    assert.equal(cm.resolveResume("auto"), undefined);
    await cm.save(2, async (tmp) => { writeFileSync(join(tmp, "data.json"), "{}"); });
    assert.equal(readFileSync(join(root, TRACKER_FILE), "utf8").trim(), "2");
    assert.deepEqual(cm.resolveResume("auto"), { step: 2, dir: join(root, "global_step_2") });
    assert.equal(cm.resolveResume("disable"), undefined);
    // A save that dies half-way leaves step 2 in charge and no step-4 folder.
    await assert.rejects(cm.save(4, async (tmp) => {
      writeFileSync(join(tmp, "data.json"), "{}");
      throw new Error("disk full");
    }), /disk full/);
    assert.ok(!existsSync(cm.stepDir(4)));
    assert.equal(cm.resolveResume("auto")!.step, 2);
  } finally {
    rmSync(root, { recursive: true, force: true });
  }
});

test("a temporary folder left by a killed process is cleaned and never resumed", () => {
  const root = scratch();
  try {
    mkdirSync(join(root, "global_step_1"));
    writeFileSync(join(root, TRACKER_FILE), "1\n");
    mkdirSync(join(root, ".global_step_2.tmp-123-456"));
    const cm = new CheckpointManager(root);
    cm.removeStaleTemporaries();
    assert.ok(!existsSync(join(root, ".global_step_2.tmp-123-456")));
    assert.equal(cm.resolveResume("auto")!.step, 1);
  } finally {
    rmSync(root, { recursive: true, force: true });
  }
});

test("retention keeps the newest N, including folders from before a restart", async () => {
  const root = scratch();
  try {
    for (const s of [1, 2, 3]) mkdirSync(join(root, `global_step_${s}`), { recursive: true });
    const cm = new CheckpointManager(root, { maxActorCkptToKeep: 2, maxCriticCkptToKeep: null });
    await cm.save(4, async () => undefined);
    assert.deepEqual(cm.savedSteps(), [3, 4]);
    const tighter = new CheckpointManager(root, { maxActorCkptToKeep: 3, maxCriticCkptToKeep: 1 });
    await tighter.save(5, async () => undefined);
    assert.deepEqual(tighter.savedSteps(), [5]);
    const all = new CheckpointManager(root, {});
    await all.save(6, async () => undefined);
    assert.deepEqual(all.savedSteps(), [5, 6]);
  } finally {
    rmSync(root, { recursive: true, force: true });
  }
});

test("resume_path parses the step; bad paths and modes fail naming the key", () => {
  const root = scratch();
  try {
    mkdirSync(join(root, "global_step_7"));
    const cm = new CheckpointManager(join(root, "elsewhere"));
    assert.deepEqual(cm.resolveResume("resume_path", join(root, "global_step_7")), { step: 7, dir: join(root, "global_step_7") });
    assert.throws(() => cm.resolveResume("resume_path", null), /trainer.resume_from_path/);
    assert.throws(() => cm.resolveResume("resume_path", join(root, "global_step_9")), /does not exist/);
    assert.throws(() => cm.resolveResume("sometimes"), /resume_mode must be auto, disable or resume_path/);
    assert.equal(stepFromPath("/a/global_step_12/"), 12);
    assert.throws(() => stepFromPath("/a/step_12"), /does not end in global_step_<N>/);
    mkdirSync(join(root, "elsewhere"));
    writeFileSync(join(root, "elsewhere", TRACKER_FILE), "banana");
    assert.throws(() => cm.resolveResume("auto"), /expected a step number, found 'banana'/);
  } finally {
    rmSync(root, { recursive: true, force: true });
  }
});
