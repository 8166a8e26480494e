// The prime manager's pool for a Python reward function: up to `size` python3
// processes, one sample each at a time, started as samples need them. A sample
// past the timeout has its process killed (the next one starts fresh); outcomes
// match the thread pool's: ok, timeout or error, never a rejection.
import { normalizeScore } from "./scorers/registry.js";
import { PythonCallError, PythonRewardProcess } from "./python_process.js";
import { describeSample, singleKwargs } from "./python_reward.js";
import type { ScoreOutcome } from "./scoring_pool.js";
import type { ScoreTask } from "./prime_worker.js";
import type { RewardFnSource } from "./types.js";

export class PythonScoringPool {
  private readonly idle: PythonRewardProcess[] = [];
  private readonly all: PythonRewardProcess[] = [];
  private readonly waiters: ((p: PythonRewardProcess) => void)[] = [];
  private closed = false;

  constructor(private readonly opts: { size: number; timeoutMs: number; source: RewardFnSource }) {
    if (!(opts.size >= 1)) throw new Error(`python scoring pool size must be >= 1, got ${opts.size}`);
  }

  private create(): PythonRewardProcess {
    const p = new PythonRewardProcess({ module: this.opts.source.path, fn: this.opts.source.name, timeoutMs: this.opts.timeoutMs, key: "custom_reward_function.path" });
    this.all.push(p);
    return p;
  }

  /** One process loads the module first: a load error rejects here, before any sample. */
  async ready(): Promise<void> {
    if (this.all.length > 0) return;
    const p = this.create();
    await p.start();
    this.idle.push(p);
  }

  private acquire(): Promise<PythonRewardProcess> {
    const p = this.idle.pop() ?? (this.all.length < this.opts.size ? this.create() : undefined);
    if (p) return Promise.resolve(p);
    return new Promise((resolve) => this.waiters.push(resolve));
  }

  private release(p: PythonRewardProcess): void {
    const next = this.waiters.shift();
    if (next) next(p);
    else this.idle.push(p);
  }

  async score(task: Omit<ScoreTask, "id">): Promise<ScoreOutcome> {
    if (this.closed) throw new Error("python scoring pool is closed");
    const p = await this.acquire();
    const what = describeSample(task.dataSource, task.solutionStr, task.groundTruth);
    try {
      const raw = await p.call(singleKwargs(this.opts.source, task.dataSource, task.solutionStr, task.groundTruth, task.extraInfo), what);
      return { kind: "ok", value: normalizeScore(raw, `${this.opts.source.name} in ${this.opts.source.path} on ${what}`) };
    } catch (e) {
      if (e instanceof PythonCallError && e.kind === "timeout") return { kind: "timeout" };
      return { kind: "error", message: (e as Error).message };
    } finally {
      this.release(p);
    }
  }

  async close(): Promise<void> {
    this.closed = true;
    for (const p of this.all.splice(0)) p.close();
    this.idle.length = 0;
  }
}
