// A scoring thread (prime manager, and user reward code under every manager). It
// imports the modules that registered scorers (and the custom reward module, if
// any) once, then scores one sample (or, for the batch manager, one whole batch)
// per message. The pool terminates this thread when a task runs past its timeout,
// so a scorer stuck in a synchronous loop cannot stall training.
import { parentPort, workerData } from "node:worker_threads";
import { defaultComputeScore, normalizeScore } from "./scorers/registry.js";
import { loadRewardFunction } from "./custom.js";
import type { BatchComputeScoreFn, ComputeScoreFn, RewardFnSource } from "./types.js";

export interface PrimeWorkerData {
  scorerModules: string[];
  custom: RewardFnSource | null;
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

async function init(): Promise<{ computeScore: ComputeScoreFn; computeBatch: BatchComputeScoreFn | null }> {
  const data = workerData as PrimeWorkerData;
  for (const m of data.scorerModules) await import(m);
  if (data.custom) return loadRewardFunction(data.custom);
  return { computeScore: defaultComputeScore, computeBatch: null };
}

async function run(task: ScoreTask | BatchScoreTask, fns: Awaited<ReturnType<typeof init>>): Promise<unknown> {
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
    port.on("message", async (task: ScoreTask | BatchScoreTask) => {
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
