// A damaged step folder fails the resume naming the file (and the way out), not with a bare
// "Unexpected end of JSON input". The workers are left out: these files are the driver's own.
import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { Config } from "../../../src/config/index.js";
import { CheckpointManager } from "../../../src/trainer/checkpoint/checkpoint_manager.js";
import { loadTrainerCheckpoint, type Resumable } from "../../../src/trainer/ppo/trainer_checkpoint.js";
import { ConfigView } from "../../../src/workers/config_view.js";
import { StatefulDataLoader } from "../../../src/data/dataloader.js";
import { Rng } from "../../../src/utils/rng.js";

async function stepFolder(files: Record<string, string>): Promise<{ root: string; resume: () => Promise<unknown>; loader: StatefulDataLoader<number> }> {
  const root = mkdtempSync(join(tmpdir(), "verl-resume-files-"));
  const cm = new CheckpointManager(root);
  await cm.save(3, async (tmp) => { for (const [name, text] of Object.entries(files)) writeFileSync(join(tmp, name), text); });
  const loader = new StatefulDataLoader<number>({ length: 8, get: (i: number) => i }, { batchSize: 2, shuffle: false, seed: 1, dropLast: true });
  const noWorkers = { actorRollout: { call: async () => [] }, critic: null } as unknown as Resumable["workers"];
  const cfg = new ConfigView({ trainer: { resume_mode: "auto", default_local_dir: root } } as unknown as Config);
  return { root, loader, resume: () => loadTrainerCheckpoint(cm, cfg, { workers: noWorkers, trainLoader: loader, rng: new Rng(1), klCtrl: null }) };
}

const goodLoader = JSON.stringify({ epoch: 0, position: 4, seed: 1, shuffle: false, datasetLength: 8 });

test("a cut-off data.json fails the resume naming the file and what to do", async () => {
  const s = await stepFolder({ "data.json": '{"epoch": 0, "posi' });
  try {
    await assert.rejects(s.resume(), (e: Error) => {
      assert.match(e.message, /checkpoint: .*global_step_3\/data\.json is not valid JSON \(.*\); the checkpoint is damaged: resume from another step \(trainer\.resume_mode=resume_path/);
      return true;
    });
  } finally { rmSync(s.root, { recursive: true, force: true }); }
});

test("a data.json of the wrong shape and a damaged trainer_state.json name their files", async () => {
  const wrong = await stepFolder({ "data.json": JSON.stringify({ epoch: -1 }) });
  try {
    await assert.rejects(wrong.resume(), /checkpoint: .*global_step_3\/data\.json: dataloader state: 'epoch' must be a non-negative integer/);
  } finally { rmSync(wrong.root, { recursive: true, force: true }); }
  const state = await stepFolder({ "data.json": goodLoader, "trainer_state.json": "" });
  try {
    await assert.rejects(state.resume(), /checkpoint: .*global_step_3\/trainer_state\.json is not valid JSON/);
  } finally { rmSync(state.root, { recursive: true, force: true }); }
});

test("an intact step folder resumes at its step with the loader's position", async () => {
  const s = await stepFolder({ "data.json": goodLoader });
  try {
    assert.equal(((await s.resume()) as { step: number }).step, 3);
    assert.equal(s.loader.stateDict().position, 4);
  } finally { rmSync(s.root, { recursive: true, force: true }); }
});
