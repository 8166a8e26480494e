// A scoring thread (prime manager, and user reward code under every manager). It
// imports the modules that registered scorers (and the custom reward module, if
// any) once, then scores one sample (or, for the batch manager, one whole batch)
// per message. The pool terminates this thread when a task runs past its timeout,
// so a scorer stuck in a synchronous loop cannot stall training.
import { parentPort, workerData } from "node:worker_threads";
import { defaultComputeScore, normalizeScore } from "./scorers/registry.js";
import { loadRewardFunction } from "./custom.js";
import type { BatchComputeScoreFn, ComputeScoreFn, RewardFnSource } from "./types.js";
import type { DataProtoPayload } from "../protocol/index.js";
import type { RewardLoopInstance, RewardLoopSource } from "./reward_loop.js";

export interface PrimeWorkerData {
  scorerModules: string[];
  custom: RewardFnSource | null;
  /** A user's reward loop class (reward_model.reward_loop_source=importlib): this thread builds one instance. */
  rewardLoop?: RewardLoopSource;
}

/** One row (a one-row DataProto as toTransfer packs it) for the reward loop's run_single. */
export interface LoopTask {
  id: number;
  row: DataProtoPayload;
}

export interface ScoreTask {
  id: number;
  dataSource: string;
  solutionStr: string;
  groundTruth: unknown;
  extraInfo: Record<string, unknown> | null;
}

/** The batch manager's form: one call with the lists of the whole batch (needs a custom reward module). */
export interface BatchScoreTask {
  id: number;
  batch: {
    dataSources: string[];
    solutionStrs: string[];
    groundTruths: unknown[];
    extraInfos: (Record<string, unknown> | null)[];
    kwargs: Record<string, unknown>;
  };
}

export type WorkerReply =
  | { type: "ready" }
  | { type: "init-error"; message: string }
  | { id: number; ok: true; value: unknown }
  | { id: number; ok: false; error: string };

const port = parentPort;
if (!port) throw new Error("prime_worker.js must run in a worker thread");

interface Loaded {
  computeScore: ComputeScoreFn;
  computeBatch: BatchComputeScoreFn | null;
  loop?: RewardLoopInstance;
  runLoopRow?: typeof import("./reward_loop.js").runRewardLoopRow;
}

async function init(): Promise<Loaded> {
  const data = workerData as PrimeWorkerData;
  for (const m of data.scorerModules) await import(m);
  // loaded only here, so plain scoring threads do not pay for the tokenizer and DataProto modules
  if (data.rewardLoop) {
    const rl = await import("./reward_loop.js");
    return { computeScore: defaultComputeScore, computeBatch: null, loop: await rl.buildRewardLoop(data.rewardLoop), runLoopRow: rl.runRewardLoopRow };
  }
  if (data.custom) return loadRewardFunction(data.custom);
  return { computeScore: defaultComputeScore, computeBatch: null };
}

async function run(task: ScoreTask | BatchScoreTask | LoopTask, fns: Loaded): Promise<unknown> {
  if ("row" in task) {
    if (!fns.loop || !fns.runLoopRow) throw new Error("a reward loop task needs a reward loop class");
    return fns.runLoopRow(fns.loop, task.row);
  }
  if ("batch" in task) {
    if (!fns.computeBatch) throw new Error("a batch scoring task needs a custom reward module");
    const b = task.batch;
    return fns.computeBatch(b.dataSources, b.solutionStrs, b.groundTruths, b.extraInfos, b.kwargs);
  }
  const raw = await fns.computeScore(task.dataSource, task.solutionStr, task.groundTruth, task.extraInfo);
  return normalizeScore(raw, `compute_score (data_source "${task.dataSource}")`);
}

init().then(
  (fns) => {
    port.on("message", async (task: ScoreTask | BatchScoreTask | LoopTask) => {
      let reply: WorkerReply;
      try {
        reply = { id: task.id, ok: true, value: await run(task, fns) };
      } catch (e) {
        reply = { id: task.id, ok: false, error: e instanceof Error ? e.message : String(e) };
      }
      try {
        port.postMessage(reply);
      } catch (e) {
        port.postMessage({ id: task.id, ok: false, error: `the score cannot be sent back from the worker: ${(e as Error).message}` });
      }
    });
    port.postMessage({ type: "ready" } satisfies WorkerReply);
  },
  (e: unknown) => port.postMessage({ type: "init-error", message: e instanceof Error ? e.message : String(e) } satisfies WorkerReply),
);
