// User reward code (custom_reward_function.path) runs contained in scoring threads
// under every manager: a synchronous endless loop or a promise that never settles is
// cut off after reward_model.reward_kwargs.timeout_s (default 60 s; 300 s, verl's, under prime) by terminating the
// thread; process.exit() or a throw from a callback ends only that thread. Under
// naive, dapo and batch each of these fails the step with one error naming the reward
// file and the sample (prime instead scores such a sample 0 and goes on).
import { logger } from "../utils/logger.js";
import { scorerModules } from "./scorers/registry.js";
import { ScoringPool, type TaskOutcome } from "./scoring_pool.js";
import { PythonScoringPool } from "./python_pool.js";
import { isPythonModule } from "./python_reward.js";
import type { RewardFnSource } from "./types.js";
import type { RewardLoopSource } from "./reward_loop.js";
import type { ContainmentOptions } from "./timeout.js";

export { containmentOptions, DEFAULT_REWARD_TIMEOUT_S, type ContainmentOptions } from "./timeout.js";

/**
 * A pool of scoring threads, started on first use; `custom` null = the registered scorers only.
 * A Python reward function (custom_reward_function.path=*.py) gets python3 processes instead.
 */
export class LazyScoringPool {
  private pool: ScoringPool | PythonScoringPool | null = null;

  /** `rewardLoop`: each thread builds the user's reward loop class instead (reward_loop.ts). */
  constructor(private readonly custom: RewardFnSource | null, readonly opts: ContainmentOptions, private readonly rewardLoop?: RewardLoopSource) {
    if (!custom && !rewardLoop) {
      const { unreachable } = scorerModules();
      if (unreachable.length > 0) {
        logger().warn({ data_sources: unreachable }, "these scorers were registered without { module: import.meta.url } and are unknown to the scoring threads");
      }
    }
  }

  async get(): Promise<ScoringPool | PythonScoringPool> {
    const size = this.opts.numWorkers, timeoutMs = this.opts.timeoutS * 1000;
    if (!this.pool && this.custom && isPythonModule(this.custom.path)) this.pool = new PythonScoringPool({ size, timeoutMs, source: this.custom });
    this.pool ??= new ScoringPool({
      size,
      timeoutMs,
      workerData: { scorerModules: scorerModules().modules, custom: this.custom, ...(this.rewardLoop ? { rewardLoop: this.rewardLoop } : {}) },
    });
    try {
      await this.pool.ready();
    } catch (e) {
      await this.close();
      throw e;
    }
    return this.pool;
  }

  async close(): Promise<void> {
    const p = this.pool;
    this.pool = null;
    if (p) await p.close();
  }
}

export interface SampleToScore {
  /** The row in the batch. */
  index: number;
  dataSource: string;
  solutionStr: string;
  groundTruth: unknown;
  extraInfo: Record<string, unknown> | null;
}

/** The user's reward function, called in scoring threads; any fault is an error naming the file and the sample. */
export class ContainedRewardFunction {
  private readonly threads: LazyScoringPool;

  constructor(private readonly source: RewardFnSource, opts: ContainmentOptions) {
    this.threads = new LazyScoringPool(source, opts);
  }

  private failure(what: string, o: Exclude<TaskOutcome, { kind: "ok" }>): Error {
    const reason = o.kind === "timeout" ? `timed out after ${this.threads.opts.timeoutS} s (reward_model.reward_kwargs.timeout_s)` : o.message;
    return new Error(`reward function ${this.source.name} (${this.source.path}) failed on ${what}: ${reason}`);
  }

  /** Per-sample scores (numbers or {score, ...}), in order. */
  async scoreSamples(samples: SampleToScore[]): Promise<(number | { score: number; [k: string]: unknown })[]> {
    const pool = await this.threads.get();
    const outcomes = await Promise.all(samples.map((s) => pool.score({
      dataSource: s.dataSource, solutionStr: s.solutionStr, groundTruth: s.groundTruth, extraInfo: s.extraInfo,
    })));
    return outcomes.map((o, i) => {
      if (o.kind === "ok") return o.value;
      const s = samples[i]!;
      throw this.failure(`sample ${s.index} (data_source "${s.dataSource}", response ${JSON.stringify(snippet(s.solutionStr))})`, o);
    });
  }

  /** One call of the batch form with the whole batch's lists. */
  async scoreBatch(batch: { dataSources: string[]; solutionStrs: string[]; groundTruths: unknown[]; extraInfos: (Record<string, unknown> | null)[]; kwargs: Record<string, unknown> }): Promise<unknown> {
    const pool = await this.threads.get();
    // the batch manager calls a Python batch function in its own process (python_reward.ts), never here
    if (!(pool instanceof ScoringPool)) throw new Error(`reward function ${this.source.name} (${this.source.path}): the batch form runs in-process for Python files`);
    const o = await pool.scoreBatch(batch);
    if (o.kind === "ok") return o.value;
    const sources = [...new Set(batch.dataSources)].map((d) => JSON.stringify(d)).join(", ");
    throw this.failure(`the batch of ${batch.dataSources.length} samples (data_source ${sources})`, o);
  }

  close(): Promise<void> {
    return this.threads.close();
  }
}

function snippet(s: string): string {
  return s.length > 60 ? `${s.slice(0, 60)}…` : s;
}
