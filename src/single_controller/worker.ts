// The base class of every worker: it knows its rank and world size and holds
// the collective shared by all worker instances in its thread (colocated roles
// share it). Inside a pool thread the runtime sets the thread context before
// constructing instances; a worker built anywhere else (a test, a single-process
// run) is rank 0 of a world of one, or follows RANK/WORLD_SIZE/LOCAL_RANK.
import { Collective, type RankCollective } from "./collective.js";

export interface ThreadContext {
  rank: number;
  worldSize: number;
  localRank: number;
  collective: RankCollective;
  /** One map per thread, shared by every worker instance in it (colocated roles). */
  shared: Map<string, unknown>;
}

let threadContext: ThreadContext | undefined;
let localContext: ThreadContext | undefined;

const threadClosers: (() => Promise<void> | void)[] = [];

/**
 * Runs `fn` in this thread when its pool shuts down, before the thread is stopped (a worker's
 * backend registers its GPU teardown here). Once per thread is enough; it never runs outside a pool.
 */
export function onThreadClose(fn: () => Promise<void> | void): void {
  if (!threadClosers.includes(fn)) threadClosers.push(fn);
}

/** Called by the pool runtime when the pool shuts down: every closer, in order, errors collected. */
export async function runThreadClosers(): Promise<void> {
  const errors: unknown[] = [];
  for (const fn of threadClosers.splice(0)) {
    try {
      await fn();
    } catch (e) {
      errors.push(e);
    }
  }
  if (errors.length === 1) throw errors[0];
  if (errors.length > 1) throw new AggregateError(errors, `${errors.length} thread closers failed`);
}

/** Called by the pool runtime in each worker thread. */
export function setThreadContext(ctx: ThreadContext): void {
  threadContext = ctx;
}

function envInt(name: string, fallback: number): number {
  const raw = process.env[name];
  if (raw === undefined || raw === "") return fallback;
  const v = Number(raw);
  if (!Number.isInteger(v) || v < 0) throw new Error(`environment variable ${name}='${raw}' is not a non-negative integer`);
  return v;
}

function currentContext(): ThreadContext {
  if (threadContext) return threadContext;
  if (!localContext) {
    const worldSize = envInt("WORLD_SIZE", 1);
    if (worldSize !== 1) {
      throw new Error(
        `Worker: WORLD_SIZE=${worldSize} but this worker was not created by a ResourcePool thread; ` +
          "create workers through a WorkerGroup to get working collectives",
      );
    }
    localContext = { rank: 0, worldSize: 1, localRank: 0, collective: Collective.single(), shared: new Map() };
  }
  return localContext;
}

export class Worker {
  readonly rank: number;
  readonly worldSize: number;
  readonly localRank: number;
  /** This thread's environment (RANK, WORLD_SIZE, LOCAL_RANK are set per rank). */
  readonly env: NodeJS.ProcessEnv;
  /** barrier / allReduce / broadcast among the ranks of this worker's pool (blocking). */
  readonly collective: RankCollective;
  /** State shared with the other worker instances in the same thread (colocated roles). */
  readonly threadShared: Map<string, unknown>;

  constructor() {
    const ctx = currentContext();
    this.rank = ctx.rank;
    this.worldSize = ctx.worldSize;
    this.localRank = ctx.localRank;
    this.env = process.env;
    this.collective = ctx.collective;
    this.threadShared = ctx.shared;
  }
}
