// Saving and resuming a PPO run (verl's _save_checkpoint / _load_checkpoint): the
// workers write actor/ and critic/ into the step folder, the driver adds the
// dataloader position (data.json) and its own state (trainer_state.json: step,
// RNG, KL controller) and the step's metrics (metrics.json: replayed into the
// metrics file on resume when a kill came between the commit and the metrics
// line); the checkpoint manager makes the whole folder appear atomically and
// prunes old ones.
import { existsSync, rmSync } from "node:fs";
import { join } from "node:path";
import type { DataLoaderState } from "../../data/index.js";
import { readCheckpointJson, writeFileAtomic } from "../../utils/fs.js";
import { logger } from "../../utils/logger.js";
import type { Rng, RngState } from "../../utils/rng.js";
import type { ConfigView } from "../../workers/config_view.js";
import { CheckpointManager } from "../checkpoint/checkpoint_manager.js";
import { restoreLoaderState } from "../checkpoint/loader_state.js";
import type { KlController } from "./core_algos/index.js";
import type { PpoWorkers } from "./resources.js";

export interface DriverState {
  global_step: number;
  rng: RngState;
  kl_coef: number | null;
}

export interface Resumable {
  workers: PpoWorkers;
  trainLoader: { stateDict(): DataLoaderState; loadStateDict(s: DataLoaderState): void };
  rng: Rng;
  klCtrl: KlController | null;
}

export function checkpointManagerFor(cfg: ConfigView): CheckpointManager {
  return new CheckpointManager(cfg.str("trainer.default_local_dir"), {
    maxActorCkptToKeep: cfg.optInt("trainer.max_actor_ckpt_to_keep"),
    maxCriticCkptToKeep: cfg.optInt("trainer.max_critic_ckpt_to_keep"),
  });
}

/** What a resume restores besides the workers' and the dataloader's state. */
export interface ResumedRun {
  /** The step training resumes after (0 = fresh start). */
  step: number;
  /** That step's metrics as saved with its checkpoint (without the checkpoint's own save time), if any. */
  metrics: Record<string, number> | null;
}

const METRICS_FILE = "metrics.json";

export async function saveTrainerCheckpoint(cm: CheckpointManager, step: number, r: Resumable, metrics?: Record<string, number>): Promise<string> {
  return cm.save(step, async (tmp) => {
    await r.workers.actorRollout.call("saveCheckpoint", join(tmp, "actor"));
    if (r.workers.critic) await r.workers.critic.call("saveCheckpoint", join(tmp, "critic"));
    writeFileAtomic(join(tmp, "data.json"), JSON.stringify(r.trainLoader.stateDict()));
    const state: DriverState = { global_step: step, rng: r.rng.getState(), kl_coef: r.klCtrl ? r.klCtrl.value : null };
    writeFileAtomic(join(tmp, "trainer_state.json"), JSON.stringify(state));
    if (metrics) writeFileAtomic(join(tmp, METRICS_FILE), JSON.stringify(metrics));
  });
}

/** Restores the run named by trainer.resume_mode; returns the step it resumes after (0 = fresh start) and that step's metrics. */
export async function loadTrainerCheckpoint(cm: CheckpointManager, cfg: ConfigView, r: Resumable): Promise<ResumedRun> {
  cm.removeStaleTemporaries();
  const point = cm.resolveResume(cfg.str("trainer.resume_mode", "auto"), cfg.optStr("trainer.resume_from_path"));
  if (!point) {
    logger().info("training from scratch (no checkpoint to resume)");
    return { step: 0, metrics: null };
  }
  logger().info({ dir: point.dir, step: point.step }, "resuming from checkpoint");
  await r.workers.actorRollout.call("loadCheckpoint", join(point.dir, "actor"));
  if (r.workers.critic) {
    const criticDir = join(point.dir, "critic");
    if (!existsSync(criticDir)) throw new Error(`checkpoint ${point.dir} has no critic/ but this run trains a critic`);
    await r.workers.critic.call("loadCheckpoint", criticDir);
  }
  restoreLoaderState(r.trainLoader, point.dir);
  const statePath = join(point.dir, "trainer_state.json");
  if (existsSync(statePath)) {
    const s = readCheckpointJson<DriverState>(statePath);
    r.rng.setState(s.rng);
    if (r.klCtrl && typeof s.kl_coef === "number") r.klCtrl.value = s.kl_coef;
  }
  const metricsPath = join(point.dir, METRICS_FILE);
  const metrics = existsSync(metricsPath) ? readCheckpointJson<Record<string, number>>(metricsPath) : null;
  if (cfg.bool("trainer.del_local_ckpt_after_load", false)) rmSync(point.dir, { recursive: true, force: true });
  return { step: point.step, metrics };
}
