// A ResourcePool is one long-lived thread per device slot (one per core on a
// CPU host), each a rank with RANK / WORLD_SIZE / LOCAL_RANK in its env. Piscina
// cannot pin a task to a thread, so every rank is its own single-thread piscina
// pool (engine-notes: ~50 us a call): state stays in the thread and calls run in
// the order they were sent. atomics 'disabled' keeps the thread's event loop
// alive between tasks. A thread that dies fails the whole pool loudly: the
// collective is aborted (peers blocked in it are released), every pending call
// rejects, and all threads are stopped; piscina's silent replacement thread is
// never used. A thread that stops making progress during a call (heartbeat.ts) for
// longer than the heartbeat timeout fails the pool the same way: terminating the
// threads stops even a synchronous busy loop.
import os from "node:os";
import { existsSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { Piscina } from "piscina";
import type { ResourceLimits } from "node:worker_threads";
import { Collective, createCollectiveBuffers, type CollectiveBuffers, type CollectiveOptions } from "./collective.js";
import { WorkerDiedError, WorkerGroupClosedError, WorkerUnresponsiveError } from "./errors.js";
import { NATIVE_CALL_GRACE, createHeartbeatBuffer, inNativeCall } from "./heartbeat.js";
import type { HostLayout } from "./distributed/host_collective.js";
import type { Task, TaskResult, ThreadInit } from "./messages.js";
import { logger } from "../utils/logger.js";

export interface ResourcePoolOptions extends CollectiveOptions {
  /** Number of ranks (threads). Default: the number of cores. */
  worldSize?: number;
  /** Used in logs and errors. */
  name?: string;
  /** Extra environment for every thread (RANK, WORLD_SIZE, LOCAL_RANK are set per rank). */
  env?: Record<string, string>;
  /**
   * Per-thread V8 heap limits (a thread over them dies with ERR_WORKER_OUT_OF_MEMORY, an error naming
   * the rank). Default: maxOldGenerationSizeMb = DEFAULT_RANK_HEAP_LIMIT_MB; {} = V8's own limits.
   */
  resourceLimits?: ResourceLimits;
  execArgv?: string[];
  /**
   * How long a rank may go without progress (no heartbeat) during a call before the pool is
   * failed and its threads terminated (default DEFAULT_HEARTBEAT_TIMEOUT_MS; 0 = never).
   */
  heartbeatTimeoutMs?: number;
  /** This pool is one host's share of a pool spanning hosts (the host agent): ranks get global numbers. */
  host?: HostLayout;
  /** The ranks live on other hosts (the driver of a multi-host run): tasks go through this. */
  remote?: RemoteRanks;
}

/** Where one rank's tasks run: its own piscina thread, or a thread on another host. */
export interface RankBackend {
  run(task: Task, transferList: ArrayBuffer[]): Promise<TaskResult>;
  destroy(): Promise<void>;
}

/** The driver's handle on the collectives of its ranks: abort when one fails, reset when idle. */
export interface CollectiveControl {
  abort(reason: string): void;
  brokenReason(): string | undefined;
  reset(): void;
}

/** Ranks on other hosts, seen from the driver (distributed/cluster.ts). */
export interface RemoteRanks {
  worldSize: number;
  backends: RankBackend[];
  control: CollectiveControl;
  /** Called once with the pool's fail(rank, reason) so a lost host fails the pool. */
  onRankLost(fail: (rank: number, reason: string) => void): void;
  /** The run's outcome, sent to every host with the shutdown (an agent exits 0 only when ok). */
  setOutcome(ok: boolean, reason: string): void;
}

class ThreadRank implements RankBackend {
  constructor(readonly pool: Piscina) {}
  run(task: Task, transferList: ArrayBuffer[]): Promise<TaskResult> {
    return this.pool.run(task, { transferList }) as Promise<TaskResult>;
  }
  destroy(): Promise<void> {
    return this.pool.destroy();
  }
}

/**
 * 60 s: the longest gap between progress ticks measured (VERL_HEARTBEAT_STATS=1) was 4.1 s in a
 * stories260K GRPO step and 4.0 s in stories260K SFT on 2 CPU cores; a whole 0.5B GRPO step on
 * the H200 took 6.9-9.4 s, which bounds its longest gap (docs/configuration.md).
 */
export const DEFAULT_HEARTBEAT_TIMEOUT_MS = 60_000;

/**
 * 2 GiB of V8 heap per rank thread: the peak measured was 45 MiB (stories260K GRPO and SFT);
 * weights and tensors live outside the V8 heap (typed-array and native memory), so the limit
 * stops a runaway JS allocation long before the host runs out of memory.
 */
export const DEFAULT_RANK_HEAP_LIMIT_MB = 2048;

const ENTRY = new URL("./worker_entry.js", import.meta.url);

/** trainer.heartbeat_timeout (seconds; 0 or null = no watchdog) in ms, or undefined for the default. */
export function heartbeatTimeoutFromConfig(config: unknown): number | undefined {
  const v = ((config as { trainer?: Record<string, unknown> } | null)?.trainer ?? {}).heartbeat_timeout;
  if (v === undefined) return undefined;
  if (v === null) return 0;
  if (typeof v !== "number" || !(v >= 0)) throw new Error(`trainer.heartbeat_timeout must be a number of seconds >= 0 (0 or null: no watchdog), got ${JSON.stringify(v)}`);
  return v * 1000;
}

/** trainer.rank_heap_limit_mb (MiB of V8 heap per rank thread; 0 or null = V8's own limit), or undefined for the default. */
export function rankHeapLimitFromConfig(config: unknown): number | undefined {
  const v = ((config as { trainer?: Record<string, unknown> } | null)?.trainer ?? {}).rank_heap_limit_mb;
  if (v === undefined) return undefined;
  if (v === null || v === 0) return 0;
  if (typeof v !== "number" || !Number.isInteger(v) || v < 16) {
    throw new Error(`trainer.rank_heap_limit_mb must be an integer number of MiB >= 16 (0 or null: V8's own limit), got ${JSON.stringify(v)}`);
  }
  return v;
}

/** Reads trainer.nnodes (hosts) and trainer.n_gpus_per_node (ranks per host) from a composed config. */
export function poolShapeFromConfig(config: unknown): { nnodes: number; perNode: number } {
  const trainer = (config as { trainer?: unknown } | null)?.trainer;
  if (trainer === null || typeof trainer !== "object") throw new Error("ResourcePool.fromConfig: config has no 'trainer' section");
  const t = trainer as Record<string, unknown>;
  const nnodes = t.nnodes ?? 1;
  if (typeof nnodes !== "number" || !Number.isInteger(nnodes) || nnodes < 1) {
    throw new Error(`trainer.nnodes must be a positive integer (hosts), got ${JSON.stringify(nnodes)}`);
  }
  const n = t.n_gpus_per_node;
  if (typeof n !== "number" || !Number.isInteger(n) || n < 1) {
    throw new Error(`trainer.n_gpus_per_node must be a positive integer (ranks on each host), got ${JSON.stringify(n)}`);
  }
  return { nnodes, perNode: n };
}

/** Ranks of a one-host pool (trainer.nnodes=1). */
export function poolSizeFromConfig(config: unknown): number {
  const { nnodes, perNode } = poolShapeFromConfig(config);
  if (nnodes !== 1) {
    throw new Error(`trainer.nnodes=${nnodes}: a pool over several hosts is made by ResourcePool.launch(config), which waits for the hosts' agents (verl worker --join; docs/distributed.md)`);
  }
  return perNode;
}

export class ResourcePool {
  readonly worldSize: number;
  readonly name: string;
  readonly collectiveBuffers: CollectiveBuffers;
  private readonly rankPools: RankBackend[];
  /** The driver's handle on the collective: abort on death, reset when idle. */
  private readonly collective: CollectiveControl;
  private failure: Error | undefined;
  private destroying: Promise<void> | undefined;
  private closing: Promise<void> | undefined;
  private inFlight = 0;
  private callCounter = 0;
  private groupCounter = 0;
  /** Calls are submitted in the order they were made, even when some wait for future arguments. */
  private submitChain: Promise<void> = Promise.resolve();
  private readonly heartbeats: Int32Array;
  private readonly heartbeatTimeoutMs: number;
  /** The V8 old-generation limit of each rank thread in MiB (undefined: V8's own). */
  readonly rankHeapLimitMb: number | undefined;
  /** Per rank: the methods of its calls in flight, oldest (running) first. */
  private readonly outstanding: string[][];
  /** Per rank: the counter value last seen and when it last moved. */
  private readonly lastBeat: { count: number; at: number }[];
  private watchdog: NodeJS.Timeout | undefined;
  private readonly remote: RemoteRanks | undefined;

  constructor(opts: ResourcePoolOptions | number = {}) {
    const o: ResourcePoolOptions = typeof opts === "number" ? { worldSize: opts } : opts;
    this.name = o.name ?? "global_pool";
    const worldSize = o.remote ? o.remote.worldSize : o.worldSize ?? os.availableParallelism();
    if (!Number.isInteger(worldSize) || worldSize < 1) throw new Error(`ResourcePool: worldSize must be a positive integer, got ${worldSize}`);
    this.worldSize = worldSize;
    const heartbeatBuffer = createHeartbeatBuffer(worldSize);
    this.heartbeats = new Int32Array(heartbeatBuffer);
    this.outstanding = Array.from({ length: worldSize }, () => []);
    this.lastBeat = Array.from({ length: worldSize }, () => ({ count: 0, at: Date.now() }));
    this.remote = o.remote;
    if (o.remote) {
      this.collectiveBuffers = createCollectiveBuffers(1);
      this.collective = o.remote.control;
      this.rankPools = o.remote.backends;
      // Each host agent's own pool watches its threads' heartbeats; a stuck rank there fails that host.
      this.heartbeatTimeoutMs = 0;
      this.rankHeapLimitMb = undefined;
      o.remote.onRankLost((rank, reason) => this.fail(rank, reason));
      return;
    }
    if (!existsSync(fileURLToPath(ENTRY))) {
      throw new Error(`ResourcePool: the compiled worker script ${fileURLToPath(ENTRY)} is missing; build with tsc and run from the compiled output (dist/), not from .ts sources`);
    }
    this.collectiveBuffers = createCollectiveBuffers(worldSize, o);
    this.collective = new Collective(this.collectiveBuffers, worldSize);
    this.heartbeatTimeoutMs = o.heartbeatTimeoutMs ?? DEFAULT_HEARTBEAT_TIMEOUT_MS;
    if (!(this.heartbeatTimeoutMs >= 0)) throw new Error(`ResourcePool: heartbeatTimeoutMs must be >= 0, got ${this.heartbeatTimeoutMs}`);
    const limits = o.resourceLimits ?? { maxOldGenerationSizeMb: DEFAULT_RANK_HEAP_LIMIT_MB };
    this.rankHeapLimitMb = limits.maxOldGenerationSizeMb;
    this.rankPools = [];
    for (let rank = 0; rank < worldSize; rank++) this.rankPools.push(this.startRank(rank, { ...o, resourceLimits: limits }, heartbeatBuffer));
    if (this.heartbeatTimeoutMs > 0) {
      this.watchdog = setInterval(() => this.checkHeartbeats(), Math.min(1000, Math.max(20, this.heartbeatTimeoutMs / 5)));
      this.watchdog.unref();
    }
  }

  /** One rank per `trainer.n_gpus_per_node` (a core each on a CPU host). */
  static fromConfig(config: unknown, opts: Omit<ResourcePoolOptions, "worldSize"> = {}): ResourcePool {
    const worldSize = poolSizeFromConfig(config);
    const cores = os.availableParallelism();
    if (worldSize > cores) {
      logger().warn({ ranks: worldSize, cores }, "trainer.n_gpus_per_node asks for more ranks than this host has cores; ranks will share cores");
    }
    const heartbeatTimeoutMs = opts.heartbeatTimeoutMs ?? heartbeatTimeoutFromConfig(config);
    const heapMb = rankHeapLimitFromConfig(config);
    const resourceLimits = opts.resourceLimits ?? (heapMb === undefined ? undefined : heapMb === 0 ? {} : { maxOldGenerationSizeMb: heapMb });
    return new ResourcePool({
      ...opts, worldSize,
      ...(heartbeatTimeoutMs !== undefined ? { heartbeatTimeoutMs } : {}),
      ...(resourceLimits ? { resourceLimits } : {}),
    });
  }

  /**
   * A pool of trainer.nnodes x trainer.n_gpus_per_node ranks: on this host when nnodes is 1, else on
   * the hosts whose agents join this driver (it listens on MASTER_ADDR:MASTER_PORT and waits for them).
   */
  static async launch(config: unknown, opts: Omit<ResourcePoolOptions, "worldSize" | "remote" | "host"> = {}): Promise<ResourcePool> {
    const { nnodes, perNode } = poolShapeFromConfig(config);
    if (nnodes === 1) return ResourcePool.fromConfig(config, opts);
    const { joinCluster } = await import("./distributed/cluster.js");
    const { clusterTimeoutsFromConfig } = await import("./distributed/settings.js");
    const t = clusterTimeoutsFromConfig(config);
    const remote = await joinCluster({
      nnodes, perNode, name: opts.name ?? "global_pool", env: opts.env, timeoutMs: opts.timeoutMs ?? t.collectiveTimeoutMs, chunkElems: opts.chunkElems,
      ...(t.keepaliveMs !== undefined ? { link: { keepaliveMs: t.keepaliveMs } } : {}),
    });
    return new ResourcePool({ ...opts, remote });
  }

  private startRank(localRank: number, o: ResourcePoolOptions, heartbeat: SharedArrayBuffer): ThreadRank {
    const L = this.collectiveBuffers.worldSize;
    const host = o.host;
    const rank = host ? host.hostIndex * L + localRank : localRank;
    const worldSize = host ? host.nnodes * L : L;
    const workerData: ThreadInit = { rank, worldSize, localRank, collective: this.collectiveBuffers, heartbeat, ...(host ? { host } : {}) };
    const env: Record<string, string> = {};
    for (const [k, v] of Object.entries(process.env)) if (v !== undefined) env[k] = v;
    Object.assign(env, o.env ?? {}, { RANK: String(rank), WORLD_SIZE: String(worldSize), LOCAL_RANK: String(localRank), LOCAL_WORLD_SIZE: String(L) });
    if (host) Object.assign(env, { NODE_RANK: String(host.hostIndex), NNODES: String(host.nnodes) });
    const pool = new Piscina({
      filename: ENTRY.href,
      minThreads: 1,
      maxThreads: 1,
      idleTimeout: Number.MAX_SAFE_INTEGER,
      atomics: "disabled",
      concurrentTasksPerWorker: 1,
      // Without it piscina puts a task it could not hand out at the tail of its queue, reordering calls.
      stricterFIFO: true,
      recordTiming: false,
      workerData,
      env,
      ...(o.resourceLimits ? { resourceLimits: o.resourceLimits } : {}),
      ...(o.execArgv ? { execArgv: o.execArgv } : {}),
    });
    let created = 0;
    pool.on("workerCreate", () => {
      created += 1;
      if (created > 1) this.fail(localRank, "piscina replaced the thread after it died");
    });
    // Without an 'error' listener piscina's error event would crash the driver.
    const onError = (err: unknown) => this.fail(localRank, this.describeDeath(err), err instanceof Error ? err.stack : undefined);
    pool.on("error", onError);
    const thread = pool.threads[0];
    if (!thread) throw new Error(`ResourcePool: piscina started no thread for rank ${rank}`);
    thread.on("error", onError);
    thread.on("exit", (code: number) => this.fail(localRank, `thread exited with code ${code}`));
    return new ThreadRank(pool);
  }

  /** Why a thread died; running out of heap names the limit and the key that sets it. */
  private describeDeath(err: unknown): string {
    const what = describe(err);
    if ((err as { code?: unknown } | null)?.code !== "ERR_WORKER_OUT_OF_MEMORY") return what;
    const limit = this.rankHeapLimitMb === undefined
      ? "V8's own limit (trainer.rank_heap_limit_mb=null)"
      : `trainer.rank_heap_limit_mb=${this.rankHeapLimitMb} (MiB)`;
    return `ran out of memory: its V8 heap reached ${limit}; a runaway allocation in the worker's code, or raise the limit (${what})`;
  }

  /** Releases every rank blocked in a collective with `reason` (a host agent, told that another host failed). */
  abortCollective(reason: string): void {
    this.collective.abort(reason);
  }

  /** Undefined while the pool works; the error that failed it otherwise. */
  get error(): Error | undefined {
    return this.failure;
  }

  get alive(): boolean {
    return this.failure === undefined;
  }

  /** A unique id for a worker group created on this pool. */
  nextGroupId(): number {
    return ++this.groupCounter;
  }

  /** Ids for calls, in submission order. */
  nextCallId(): number {
    return ++this.callCounter;
  }

  /** Runs `fn` after every earlier submission (keeps per-rank call order equal to call order). */
  enqueueSubmission(fn: () => Promise<void> | void): Promise<void> {
    const next = this.submitChain.then(fn);
    this.submitChain = next.catch(() => undefined);
    return next;
  }

  /** Throws if the pool failed or was shut down. */
  checkUsable(): void {
    if (this.failure) {
      throw new WorkerGroupClosedError(`resource pool '${this.name}' is not usable: ${this.failure.message.split("\n")[0]}`, this.failure);
    }
  }

  /**
   * Sends one task to one rank. Rejects with WorkerDiedError when that rank's
   * thread dies, WorkerGroupClosedError when another rank's death or a shutdown
   * stopped it. A broken collective is reset first when nothing is in flight.
   */
  async run(rank: number, task: Task, transferList: ArrayBuffer[] = [], method = "call"): Promise<TaskResult> {
    this.checkUsable();
    const pool = this.rankPools[rank];
    if (!pool) throw new Error(`ResourcePool '${this.name}': rank ${rank} is not in [0, ${this.worldSize})`);
    if (this.inFlight === 0 && this.collective.brokenReason() !== undefined) this.collective.reset();
    this.inFlight++;
    const calls = this.outstanding[rank]!;
    if (calls.length === 0) this.lastBeat[rank] = { count: Atomics.load(this.heartbeats, rank), at: Date.now() };
    calls.push(method);
    try {
      return await pool.run(task, transferList);
    } catch (e) {
      const failure = this.failure as Error | undefined;
      if (failure instanceof WorkerUnresponsiveError && failure.rank === rank) throw failure;
      if (failure instanceof WorkerDiedError && failure.rank === rank) {
        throw new WorkerDiedError(rank, failure.reason, failure.workerStack, method);
      }
      if (failure) throw new WorkerGroupClosedError(`rank ${rank} was stopped during ${method}: ${failure.message.split("\n")[0]}`, failure);
      throw e;
    } finally {
      this.inFlight--;
      // A rank runs its calls in order, so the one that settles is the oldest.
      calls.shift();
      this.lastBeat[rank] = { count: Atomics.load(this.heartbeats, rank), at: Date.now() };
    }
  }

  /** The watchdog: a rank with a call in flight whose counter stood still too long is stuck. */
  private checkHeartbeats(): void {
    if (this.failure) return;
    const now = Date.now();
    for (let rank = 0; rank < this.worldSize; rank++) {
      const count = Atomics.load(this.heartbeats, rank);
      const last = this.lastBeat[rank]!;
      if (count !== last.count || this.outstanding[rank]!.length === 0) {
        this.lastBeat[rank] = { count, at: now };
      } else {
        const grace = inNativeCall(this.heartbeats, rank) ? NATIVE_CALL_GRACE : 1;
        if (now - last.at < this.heartbeatTimeoutMs * grace) continue;
        const method = this.outstanding[rank]![0]!;
        this.failWith(new WorkerUnresponsiveError(rank, method, this.heartbeatTimeoutMs, grace), `rank ${rank} stopped responding during ${method}`);
        return;
      }
    }
  }

  /**
   * The run this pool served finished well: the hosts of a pool spanning hosts are told so with
   * their shutdown and exit 0; without this call (an error, a signal) they exit 1, so a cluster
   * engine restarts the run as a whole. No effect on a pool of this host's threads.
   */
  markRunSucceeded(): void {
    if (!this.failure || this.failure instanceof WorkerGroupClosedError) this.remote?.setOutcome(true, "the run succeeded");
  }

  private fail(rank: number, reason: string, stack?: string): void {
    this.failWith(new WorkerDiedError(rank, reason, stack), `rank ${rank} died: ${reason}`);
  }

  private failWith(err: WorkerDiedError, abortReason: string): void {
    if (this.failure || this.destroying) return;
    this.failure = err;
    this.remote?.setOutcome(false, abortReason);
    logger().error({ pool: this.name, rank: err.rank, reason: err.reason }, err instanceof WorkerUnresponsiveError ? "a rank stopped responding; failing the resource pool" : "worker thread died; failing the resource pool");
    this.collective.abort(abortReason);
    void this.stopThreads();
  }

  /**
   * Stops every thread (pending calls reject); the process can exit afterwards. Idempotent.
   * An idle, healthy pool first lets each thread run its closers (onThreadClose: a WebGPU rank
   * destroys its Dawn device), waiting at most closeTimeoutMs; a failed or busy pool is stopped
   * at once.
   */
  destroy(closeTimeoutMs = 30_000): Promise<void> {
    this.closing ??= (async () => {
      const healthy = !this.failure && this.inFlight === 0;
      logger().debug({ pool: this.name, healthy, inFlight: this.inFlight }, "shutting the pool down");
      if (!this.failure) this.failure = new WorkerGroupClosedError(`resource pool '${this.name}' was shut down`);
      if (healthy) await this.closeThreads(closeTimeoutMs);
      await this.stopThreads();
      logger().debug({ pool: this.name }, "pool threads stopped");
    })();
    return this.closing;
  }

  private async closeThreads(timeoutMs: number): Promise<void> {
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<"timeout">((resolve) => {
      timer = setTimeout(() => resolve("timeout"), timeoutMs);
      timer.unref();
    });
    const closes = this.rankPools.map((p) => p.run({ kind: "close" } satisfies Task, []));
    const settled = await Promise.race([Promise.allSettled(closes), timeout]);
    clearTimeout(timer);
    logger().debug({ pool: this.name, settled: settled === "timeout" ? settled : settled.map((x) => x.status) }, "thread closers done");
    if (settled === "timeout") {
      logger().warn({ pool: this.name, timeoutMs }, "rank threads did not finish their closers in time; stopping them anyway");
      return;
    }
    settled.forEach((s, rank) => {
      const error = s.status === "rejected" ? describe(s.reason) : s.value.ok ? undefined : `${s.value.error.name}: ${s.value.error.message}`;
      if (error) logger().warn({ pool: this.name, rank, error }, "a rank thread's closer failed; stopping it anyway");
    });
  }

  private stopThreads(): Promise<void> {
    this.destroying ??= (async () => {
      clearInterval(this.watchdog);
      this.collective.abort(`resource pool '${this.name}' is shutting down`);
      // One thread after the other: two WebGPU rank threads tearing their Dawn devices down at
      // the same time crashed the process about every other run on the H200 (docs/gpu.md).
      for (const p of this.rankPools) await p.destroy().catch(() => undefined);
    })();
    return this.destroying;
  }
}

function describe(err: unknown): string {
  if (err instanceof Error) {
    const code = (err as { code?: unknown }).code;
    return `${err.name}${typeof code === "string" ? ` [${code}]` : ""}: ${err.message}`;
  }
  return String(err);
}
