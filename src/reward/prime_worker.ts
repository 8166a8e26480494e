// A scoring thread of the prime reward manager. It imports the modules that
// registered scorers (and the custom reward module, if any) once, then scores
// one sample per message. The pool terminates this thread when a sample runs
// past its timeout, so a scorer stuck in a synchronous loop cannot stall training.
import { parentPort, workerData } from "node:worker_threads";
import { defaultComputeScore, normalizeScore } from "./scorers/registry.js";
import { loadRewardFunction } from "./custom.js";
import type { ComputeScoreFn, RewardFnSource } from "./types.js";

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

export type WorkerReply =
  | { type: "ready" }
  | { type: "init-error"; message: string }
  | { id: number; ok: true; value: number | { score: number; [k: string]: unknown } }
  | { id: number; ok: false; error: string };

const port = parentPort;
if (!port) throw new Error("prime_worker.js must run in a worker thread");

async function init(): Promise<ComputeScoreFn> {
  const data = workerData as PrimeWorkerData;
  for (const m of data.scorerModules) await import(m);
  if (data.custom) return (await loadRewardFunction(data.custom)).computeScore;
  return defaultComputeScore;
}

init().then(
  (computeScore) => {
    port.on("message", async (task: ScoreTask) => {
      let reply: WorkerReply;
      try {
        const raw = await computeScore(task.dataSource, task.solutionStr, task.groundTruth, task.extraInfo);
        reply = { id: task.id, ok: true, value: normalizeScore(raw, `compute_score (data_source "${task.dataSource}")`) };
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
