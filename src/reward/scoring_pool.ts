// A pool of scoring threads with a per-sample timeout. One sample per thread
// at a time, so a timeout is pinned on the right sample: the pool terminates
// that thread (which stops even a synchronous endless loop) and starts a
// fresh one. Exceptions, timeouts and crashed threads come back as outcomes,
// never as rejections. Idle threads are unref'd so they never keep the
// process alive.
import { Worker } from "node:worker_threads";
import { fileURLToPath } from "node:url";
import type { BatchScoreTask, LoopTask, PrimeWorkerData, ScoreTask, WorkerReply } from "./prime_worker.js";

/** How a task ended: its value, a timeout, or an error (a throw, a crashed or exited thread). */
export type TaskOutcome<T = unknown> =
  | { kind: "ok"; value: T }
  | { kind: "timeout" }
  | { kind: "error"; message: string };

export type ScoreOutcome = TaskOutcome<number | { score: number; [k: string]: unknown }>;

interface Pending {
  task: ScoreTask | BatchScoreTask | LoopTask;
  resolve: (o: TaskOutcome) => void;
}

interface Slot {
  worker: Worker;
  ready: boolean;
  current: Pending | null;
  timer: NodeJS.Timeout | null;
}

export interface ScoringPoolOptions {
  size: number;
  timeoutMs: number;
  workerData: PrimeWorkerData;
}

/** The worker script beside this module: compiled .js, or .ts when running under tsx. */
function workerScript(): { file: string; execArgv: string[] } {
  const here = fileURLToPath(import.meta.url);
  if (here.endsWith(".ts")) return { file: here.replace(/scoring_pool\.ts$/, "prime_worker.ts"), execArgv: ["--import", "tsx"] };
  return { file: here.replace(/scoring_pool\.js$/, "prime_worker.js"), execArgv: [] };
}

export class ScoringPool {
  private readonly slots: Slot[] = [];
  private readonly queue: Pending[] = [];
  private nextId = 0;
  private closed = false;
  private initError: string | null = null;
  private firstReady: Promise<void>;
  private resolveFirstReady!: () => void;
  private rejectFirstReady!: (e: Error) => void;
  /** Threads replaced after a timeout, an uncaught error or an exit. */
  restarts = 0;

  constructor(private readonly opts: ScoringPoolOptions) {
    if (!(opts.size >= 1)) throw new Error(`scoring pool size must be >= 1, got ${opts.size}`);
    if (!(opts.timeoutMs > 0)) throw new Error(`scoring timeout must be > 0 ms, got ${opts.timeoutMs}`);
    this.firstReady = new Promise((res, rej) => { this.resolveFirstReady = res; this.rejectFirstReady = rej; });
    this.firstReady.catch(() => undefined);
    for (let i = 0; i < opts.size; i++) this.slots.push(this.spawn());
  }

  /** Resolves once a thread has loaded the scorers; rejects with the loading error (a bad module path, say). */
  ready(): Promise<void> {
    return this.firstReady;
  }

  private spawn(): Slot {
    const { file, execArgv } = workerScript();
    const worker = new Worker(file, { workerData: this.opts.workerData, execArgv });
    worker.unref();
    const slot: Slot = { worker, ready: false, current: null, timer: null };
    worker.on("message", (msg: WorkerReply) => this.onMessage(slot, msg));
    worker.on("error", (e: Error) => this.replace(slot, { kind: "error", message: `uncaught error in the scoring thread (a throw from a callback?): ${e.message}` }));
    worker.on("exit", (code) => {
      if (!this.closed && this.slots.includes(slot)) {
        this.replace(slot, { kind: "error", message: `the scoring thread exited (code ${code}): the reward code called process.exit or ended its thread` });
      }
    });
    return slot;
  }

  private onMessage(slot: Slot, msg: WorkerReply): void {
    if ("type" in msg) {
      if (msg.type === "ready") {
        slot.ready = true;
        this.resolveFirstReady();
        this.dispatch();
      } else {
        this.initError = msg.message;
        this.rejectFirstReady(new Error(`reward manager: a scoring thread could not load its scorers: ${msg.message}`));
        this.dispatch(); // fails what waits
      }
      return;
    }
    const pending = slot.current;
    if (!pending || pending.task.id !== msg.id) return; // a late reply for a sample already timed out
    this.finish(slot);
    pending.resolve(msg.ok ? { kind: "ok", value: msg.value } : { kind: "error", message: msg.error });
    this.dispatch();
  }

  private finish(slot: Slot): void {
    if (slot.timer) clearTimeout(slot.timer);
    slot.timer = null;
    slot.current = null;
  }

  /** Threads hold the process open only while samples wait or run. */
  private updateRefs(): void {
    const busy = this.queue.length > 0 || this.slots.some((s) => s.current !== null);
    for (const s of this.slots) {
      if (busy) s.worker.ref();
      else s.worker.unref();
    }
  }

  /** Drop a thread (timeout, crash, exit), settle its sample, start a fresh thread. */
  private replace(slot: Slot, outcome: TaskOutcome): void {
    const idx = this.slots.indexOf(slot);
    if (idx < 0 || this.closed) return;
    const pending = slot.current;
    if (slot.timer) clearTimeout(slot.timer);
    this.slots.splice(idx, 1);
    void slot.worker.terminate();
    this.restarts++;
    if (pending) pending.resolve(outcome);
    if (this.initError === null) this.slots.push(this.spawn());
    this.dispatch();
  }

  private failAll(message: string): void {
    for (const p of this.queue.splice(0)) p.resolve({ kind: "error", message });
    for (const s of this.slots) {
      if (s.current) {
        const p = s.current;
        this.finish(s);
        p.resolve({ kind: "error", message });
      }
    }
  }

  private dispatch(): void {
    if (this.initError !== null) {
      this.failAll(`scoring thread could not load its scorers: ${this.initError}`);
      return this.updateRefs();
    }
    for (const slot of this.slots) {
      if (this.queue.length === 0) break;
      if (!slot.ready || slot.current) continue;
      const pending = this.queue.shift()!;
      slot.current = pending;
      slot.timer = setTimeout(() => this.replace(slot, { kind: "timeout" }), this.opts.timeoutMs);
      slot.worker.postMessage(pending.task);
    }
    this.updateRefs();
  }

  /** Scores one sample (the value is normalized to a number or {score, ...}). */
  score(task: Omit<ScoreTask, "id">): Promise<ScoreOutcome> {
    return this.submit({ ...task, id: this.nextId++ }) as Promise<ScoreOutcome>;
  }

  /** Runs the custom reward module's function once on a whole batch (the batch manager's form). */
  scoreBatch(batch: BatchScoreTask["batch"]): Promise<TaskOutcome> {
    return this.submit({ batch, id: this.nextId++ });
  }

  /** Runs the reward loop class's run_single on one row (a one-row DataProto payload). */
  runLoopRow(row: LoopTask["row"]): Promise<TaskOutcome> {
    return this.submit({ row, id: this.nextId++ });
  }

  private submit(task: ScoreTask | BatchScoreTask | LoopTask): Promise<TaskOutcome> {
    if (this.closed) return Promise.reject(new Error("scoring pool is closed"));
    return new Promise((resolve) => {
      this.queue.push({ task, resolve });
      this.dispatch();
    });
  }

  async close(): Promise<void> {
    this.closed = true;
    this.failAll("scoring pool closed");
    await Promise.all(this.slots.splice(0).map((s) => s.worker.terminate()));
  }
}
