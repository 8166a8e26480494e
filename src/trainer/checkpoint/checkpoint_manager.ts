// The driver's side of checkpoints: the `global_step_N/` folders under
// trainer.default_local_dir, the `latest_checkpointed_iteration.txt` tracker, which
// folder to resume from, and retention. Each save builds the whole step folder
// under a temporary name and renames it into place, then rewrites the tracker
// atomically, so a crash at any point leaves the previous checkpoint usable.
import { existsSync, readdirSync, readFileSync, rmSync, statSync } from "node:fs";
import { basename, isAbsolute, join, resolve } from "node:path";
import { logger } from "../../utils/logger.js";
import { writeDirAtomic, writeFileAtomic } from "../../utils/fs.js";

export const TRACKER_FILE = "latest_checkpointed_iteration.txt";
const STEP_DIR = /^global_step_(\d+)$/;
const STALE_TMP = /^\.global_step_\d+\.tmp-/;

export type ResumeMode = "auto" | "disable" | "resume_path";

export interface RetentionLimits {
  maxActorCkptToKeep?: number | null;
  maxCriticCkptToKeep?: number | null;
}

export interface ResumePoint {
  step: number;
  dir: string;
}

/** The step number in a `.../global_step_N` path. */
export function stepFromPath(path: string): number {
  const tail = path.replace(/[\\/]+$/, "").split("global_step_").pop() ?? "";
  const step = Number(tail);
  if (!path.includes("global_step_") || !Number.isInteger(step) || step < 0) {
    throw new Error(`checkpoint path '${path}' does not end in global_step_<N>`);
  }
  return step;
}

export class CheckpointManager {
  readonly root: string;

  constructor(root: string, private readonly limits: RetentionLimits = {}) {
    this.root = resolve(root);
  }

  stepDir(step: number): string {
    return join(this.root, `global_step_${step}`);
  }

  /** Steps with a complete folder on disk, ascending. */
  savedSteps(): number[] {
    if (!existsSync(this.root)) return [];
    return readdirSync(this.root)
      .map((name) => STEP_DIR.exec(name))
      .filter((m): m is RegExpExecArray => m !== null && statSync(join(this.root, m[0])).isDirectory())
      .map((m) => Number(m[1]))
      .sort((a, b) => a - b);
  }

  /** The step in the tracker file, or undefined when there is none. */
  trackedStep(): number | undefined {
    const p = join(this.root, TRACKER_FILE);
    if (!existsSync(p)) return undefined;
    const text = readFileSync(p, "utf8").trim();
    const step = Number(text);
    if (!Number.isInteger(step) || step < 0) throw new Error(`${p}: expected a step number, found '${text}'`);
    return step;
  }

  /** Remove half-written step folders a crash left behind (they were never renamed into place). */
  removeStaleTemporaries(): void {
    if (!existsSync(this.root)) return;
    for (const name of readdirSync(this.root)) {
      if (STALE_TMP.test(name)) {
        logger().warn({ dir: join(this.root, name) }, "removing an unfinished checkpoint left by an interrupted save");
        rmSync(join(this.root, name), { recursive: true, force: true });
      }
    }
  }

  /**
   * Where to resume from (verl's `_load_checkpoint`): `disable` -> nowhere; `auto` -> the tracker's
   * step (a fresh start when there is no tracker); `resume_path` -> `resumeFromPath`.
   */
  resolveResume(mode: string, resumeFromPath?: string | null): ResumePoint | undefined {
    if (mode === "disable") return undefined;
    if (mode === "resume_path") {
      if (typeof resumeFromPath !== "string" || !resumeFromPath) {
        throw new Error("trainer.resume_mode=resume_path needs trainer.resume_from_path (a .../global_step_<N> folder)");
      }
      const dir = isAbsolute(resumeFromPath) ? resumeFromPath : resolve(process.cwd(), resumeFromPath);
      const step = stepFromPath(dir);
      if (!existsSync(dir)) throw new Error(`trainer.resume_from_path: ${dir} does not exist`);
      return { step, dir };
    }
    if (mode !== "auto") throw new Error(`trainer.resume_mode must be auto, disable or resume_path, got '${mode}'`);
    const tracked = this.trackedStep();
    if (tracked === undefined) return undefined;
    const dir = this.stepDir(tracked);
    if (existsSync(dir)) return { step: tracked, dir };
    // The tracker points at a folder that is gone (deleted by hand): fall back to the newest one on disk.
    const steps = this.savedSteps();
    const newest = steps[steps.length - 1];
    if (newest === undefined) throw new Error(`${join(this.root, TRACKER_FILE)} names step ${tracked} but ${dir} is missing and no other checkpoint exists`);
    logger().warn({ tracked, newest }, "tracked checkpoint folder is missing; resuming from the newest one on disk");
    return { step: newest, dir: this.stepDir(newest) };
  }

  /**
   * Save step `step`: `fill(tmpDir)` writes everything (workers write actor/ and critic/ into it);
   * the folder is renamed into place, the tracker updated, and old checkpoints pruned.
   */
  async save(step: number, fill: (tmpDir: string) => Promise<void>): Promise<string> {
    const dir = this.stepDir(step);
    await writeDirAtomic(dir, fill);
    writeFileAtomic(join(this.root, TRACKER_FILE), `${step}\n`);
    this.prune(step);
    return dir;
  }

  /** The number of step folders to keep: the tightest of the actor and critic limits (null/<=0 = all). */
  keepCount(): number | undefined {
    const ks = [this.limits.maxActorCkptToKeep, this.limits.maxCriticCkptToKeep]
      .filter((k): k is number => typeof k === "number" && k > 0);
    return ks.length ? Math.min(...ks) : undefined;
  }

  /**
   * Delete whole step folders beyond the newest `keepCount()`, including ones written before a
   * restart (verl prunes only what it saved in the same process). The folder just saved is
   * never removed.
   */
  prune(justSaved: number): void {
    const keep = this.keepCount();
    if (keep === undefined) return;
    const steps = this.savedSteps().filter((s) => s !== justSaved);
    const excess = steps.length + 1 - keep;
    for (const s of steps.slice(0, Math.max(0, excess))) {
      logger().info({ dir: basename(this.stepDir(s)) }, "removing old checkpoint (max_*_ckpt_to_keep)");
      rmSync(this.stepDir(s), { recursive: true, force: true });
    }
  }
}
