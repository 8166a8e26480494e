// The driver of `verl sft` (verl's fsdp_sft_trainer.fit, and its engine trainer
// verl.trainer.sft_trainer under --config-name sft_trainer_engine): batches of
// data.train_batch_size prompt/response pairs or conversations, each step dispatched over the
// ranks of the worker group (data parallel, gradients all-reduced), validation
// loss every trainer.test_freq steps and at the end, checkpoints every
// trainer.save_freq steps and at the end (global_step_N/ with the weights, the
// optimizer, the dataloader position and a Hugging Face export that `verl train`
// loads as actor_rollout_ref.model.path), resumable with trainer.resume_mode.
import { join } from "node:path";
import type { Config } from "../../config/index.js";
import { dataFiles, maxSamples, StatefulDataLoader } from "../../data/index.js";
import type { Tokenizer } from "../../models/index.js";
import type { DataProto } from "../../protocol/index.js";
import { ClassWithInitArgs, ResourcePool, WorkerGroup } from "../../single_controller/index.js";
import { writeFileAtomic } from "../../utils/fs.js";
import { logger } from "../../utils/logger.js";
import { Tracking } from "../../utils/tracking.js";
import { ConfigView } from "../../workers/config_view.js";
import type { SftEvalResult, SftStepResult } from "../../workers/sft/sft_worker.js";
import { CheckpointManager } from "../checkpoint/checkpoint_manager.js";
import { requireTensor, rowSums } from "../ppo/step_batch.js";
import { restoreLoaderState } from "../checkpoint/loader_state.js";
import { SFTDataset, type SftExample } from "./sft_dataset.js";
import { MultiTurnSFTDataset, readMultiTurnConfig } from "./multiturn_sft_dataset.js";
import { isEngineSftLayout, isMultiTurnSft } from "./sft_layout.js";
import { loadSftTokenizer } from "./sft_model.js";

const SFT_WORKER = new URL("../../workers/sft/sft_worker.js", import.meta.url);

export interface SftResult {
  /** The last step trained (the resumed step when there was nothing left to do). */
  globalStep: number;
  totalSteps: number;
  /** The last val/loss, if validation ran. */
  valLoss?: number;
  /** The last step's train/loss, if a step ran. */
  trainLoss?: number;
  /** global_step_N/huggingface of the final checkpoint. */
  hfDir: string;
}

interface RoleGroup {
  call<R = unknown>(method: string, ...args: unknown[]): PromiseLike<R>;
}

/** The rows of either dataset the trainer reads. */
interface SftRows {
  readonly length: number;
  get(i: number): SftExample;
  collate(rows: SftExample[]): DataProto;
}

/** The first `max` rows of a dataset (verl's {train,val}_max_samples without shuffling); all when max < 1. */
function firstRows(rows: SftRows, max: number): SftRows {
  if (max < 1 || max >= rows.length) return rows;
  return { length: max, get: (i) => rows.get(i), collate: (r) => rows.collate(r) };
}

/** SFTDataset (prompt/response pairs) or MultiTurnSFTDataset (conversations), as the layout says. */
function sftRows(config: Config, split: "train" | "val", tokenizer: Tokenizer): SftRows {
  const data = new ConfigView(config).section("data");
  const files = dataFiles(data[`${split}_files`], `${split}_files`);
  const max = maxSamples(data[`${split}_max_samples`], `${split}_max_samples`);
  if (!isMultiTurnSft(config)) return firstRows(new SFTDataset(files, tokenizer, data), max);
  const engine = isEngineSftLayout(config);
  const keys = engine ? data : (data.multiturn as Record<string, unknown> | undefined) ?? {};
  return firstRows(new MultiTurnSFTDataset(files, tokenizer, readMultiTurnConfig(data, keys, engine ? "data" : "data.multiturn")), max);
}

/** One step's metrics under the names each of verl's SFT trainers logs. */
function stepMetrics(engine: boolean, r: SftStepResult, seconds: number, tokens: { step: number; total: number }): Record<string, number> {
  if (engine) {
    return {
      "train/loss": r.loss, "train/grad_norm": r.gradNorm, "train/lr": r.lr, ...(r.mfu === undefined ? {} : { "train/mfu": r.mfu }),
      "train/global_tokens": tokens.step, "train/total_tokens(B)": tokens.total / 1e9,
    };
  }
  return { "train/loss": r.loss, "train/lr(1e-3)": r.lr * 1e3, "train/time(s)": seconds };
}

export class SFTTrainer {
  readonly cfg: ConfigView;
  private tokenizer!: Tokenizer;
  private trainLoader!: StatefulDataLoader<SftExample>;
  private readonly engine: boolean;
  private valSet: SftRows | undefined;
  private readonly batchSize: number;

  constructor(readonly config: Config) {
    this.cfg = new ConfigView(config);
    this.engine = isEngineSftLayout(config);
    this.batchSize = this.cfg.int("data.train_batch_size");
    if (this.batchSize < 1) throw new Error(`data.train_batch_size must be >= 1, got ${this.batchSize}`);
  }

  private async loadData(): Promise<void> {
    const cfg = this.cfg;
    this.tokenizer = await loadSftTokenizer(this.config);
    const train = sftRows(this.config, "train", this.tokenizer);
    const valFiles = cfg.raw("data.val_files");
    this.valSet = valFiles === null || valFiles === undefined ? undefined : sftRows(this.config, "val", this.tokenizer);
    // verl's sampler drops the last partial batch of an epoch.
    this.trainLoader = new StatefulDataLoader(train, { batchSize: this.batchSize, shuffle: true, seed: cfg.int("trainer.seed", 1), dropLast: true });
    if (this.trainLoader.length === 0) {
      throw new Error(`data.train_batch_size=${this.batchSize} is larger than the training set (${train.length} rows)`);
    }
  }

  /**
   * The learning-rate schedule spans batches per epoch x trainer.total_epochs; the run stops
   * there, or earlier at trainer.total_training_steps (verl's semantics: the step limit cuts
   * the run short without compressing the schedule).
   */
  plan(): { runSteps: number; scheduleSteps: number } {
    const epochs = this.cfg.int("trainer.total_epochs", 1);
    if (epochs < 1) throw new Error(`trainer.total_epochs must be >= 1, got ${epochs}`);
    const scheduleSteps = this.trainLoader.length * epochs;
    const explicit = this.cfg.optInt("trainer.total_training_steps");
    if (explicit !== null && explicit < 1) throw new Error(`trainer.total_training_steps must be >= 1, got ${explicit}`);
    if (explicit !== null && explicit > scheduleSteps) {
      logger().warn(`trainer.total_training_steps=${explicit} is more than trainer.total_epochs x ${this.trainLoader.length} batches: the run stops at step ${scheduleSteps} (raise trainer.total_epochs)`);
    }
    return { runSteps: Math.min(explicit ?? scheduleSteps, scheduleSteps), scheduleSteps };
  }

  async fit(): Promise<SftResult> {
    const cfg = this.cfg;
    await this.loadData();
    const { runSteps: totalSteps, scheduleSteps } = this.plan();
    const cm = new CheckpointManager(cfg.str("trainer.default_local_dir"), { maxActorCkptToKeep: cfg.optInt("trainer.max_ckpt_to_keep") });
    const pool = await ResourcePool.launch(this.config, { name: "sft_pool" });
    const tracking = new Tracking({
      projectName: cfg.str("trainer.project_name"), experimentName: cfg.str("trainer.experiment_name"),
      config: this.config, totalSteps, backends: cfg.raw("trainer.logger"),
    });
    try {
      const group = (await WorkerGroup.create(pool, new ClassWithInitArgs(SFT_WORKER, "SFTWorker", this.config))) as unknown as RoleGroup;
      const info = await group.call<{ backend: string; numParams: number }[]>("initModel", scheduleSteps);
      logger().info({ ranks: pool.worldSize, params: info[0]?.numParams, backend: info[0]?.backend, totalSteps, scheduleSteps, stepsPerEpoch: this.trainLoader.length }, "SFT model ready");
      let step = await this.resume(cm, group);
      tracking.begin(step);
      const result: SftResult = { globalStep: step, totalSteps, hfDir: join(cm.stepDir(step), "huggingface") };
      if (step >= totalSteps) {
        logger().info({ step, totalSteps }, "nothing to train: the checkpoint is already at the last step");
        pool.markRunSucceeded();
        return result;
      }
      const testFreq = this.frequency("trainer.test_freq"), saveFreq = this.frequency("trainer.save_freq");
      let totalTokens = 0;
      while (step < totalSteps) {
        for (const batch of this.trainLoader) {
          step += 1;
          // each sequence's attended tokens (verl's _get_batch_seqlens, gathered over ranks there: the driver
          // holds the whole batch here); the engine trainer sends them for its train/mfu
          const seqlens = rowSums(requireTensor(batch, "attention_mask"));
          if (this.engine) batch.metaInfo.global_token_num = seqlens;
          const t0 = performance.now();
          const ranks = await group.call<SftStepResult[]>("trainStep", batch);
          const r = ranks[0]!;
          if (r.skipped) logger().warn({ step, gradNorm: r.gradNorm }, "gradient norm is not finite: update skipped");
          result.trainLoss = r.loss;
          const stepTokens = seqlens.reduce((a, b) => a + b, 0);
          totalTokens += stepTokens;
          tracking.log(stepMetrics(this.engine, r, (performance.now() - t0) / 1000, { step: stepTokens, total: totalTokens }), step);
          const last = step >= totalSteps;
          if (this.valSet && (last || (testFreq > 0 && step % testFreq === 0))) {
            result.valLoss = await this.validate(group);
            tracking.log({ "val/loss": result.valLoss }, step);
          }
          if (last || (saveFreq > 0 && step % saveFreq === 0)) {
            const dir = await cm.save(step, async (tmp) => {
              await group.call("saveCheckpoint", tmp);
              writeFileAtomic(join(tmp, "data.json"), JSON.stringify(this.trainLoader.stateDict()));
            });
            logger().info({ dir }, "checkpoint saved");
          }
          if (last) break;
        }
      }
      result.globalStep = step;
      result.hfDir = join(cm.stepDir(step), "huggingface");
      pool.markRunSucceeded();
      return result;
    } finally {
      tracking.finish();
      await pool.destroy();
    }
  }

  /** trainer.test_freq / save_freq in steps: a number (-1 = off), or verl's "after_each_epoch". */
  private frequency(key: string): number {
    return this.cfg.raw(key) === "after_each_epoch" ? this.trainLoader.length : this.cfg.int(key, -1);
  }

  /** Restore weights, optimizer, scheduler and the dataloader position; the step to continue after. */
  private async resume(cm: CheckpointManager, group: RoleGroup): Promise<number> {
    cm.removeStaleTemporaries();
    const point = cm.resolveResume(this.cfg.str("trainer.resume_mode", "auto"), this.cfg.optStr("trainer.resume_from_path"));
    if (!point) return 0;
    logger().info({ dir: point.dir, step: point.step }, "resuming SFT from checkpoint");
    await group.call("loadCheckpoint", point.dir);
    restoreLoaderState(this.trainLoader, point.dir);
    return point.step;
  }

  /** Token-weighted mean loss over the whole validation set. */
  private async validate(group: RoleGroup): Promise<number> {
    const set = this.valSet!;
    let lossSum = 0, tokens = 0;
    for (let s = 0; s < set.length; s += this.batchSize) {
      const rows: SftExample[] = [];
      for (let i = s; i < Math.min(set.length, s + this.batchSize); i++) rows.push(set.get(i));
      const batch: DataProto = set.collate(rows);
      for (const r of await group.call<SftEvalResult[]>("evalLoss", batch)) {
        lossSum += r.lossSum;
        tokens += r.tokens;
      }
    }
    return tokens > 0 ? lossSum / tokens : 0;
  }
}

/** `verl sft`: train and return where the final model is. */
export async function runSft(config: Config): Promise<SftResult> {
  return new SFTTrainer(config).fit();
}
