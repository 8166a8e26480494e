// Errors a worker group raises on the driver. Each names the rank and the
// method in a one-paragraph message; the worker's own stack is kept out of the
// message (the CLI prints it only with VERL_DEBUG=1) but sits in `.stack`, above
// the driver's, so a failure deep inside a worker thread still reads like a local one.

/** What a failed call looked like inside the worker thread (crosses threads as plain data). */
export interface RemoteErrorInfo {
  name: string;
  message: string;
  stack: string;
  /** Set when the error came from a collective (timeout or abort), so the driver can tell root causes from their echoes. */
  collective?: "timeout" | "aborted";
}

/** A worker method threw: `rank`, `method` and the worker's stack (`workerStack`). */
export class WorkerError extends Error {
  override name = "WorkerError";
  constructor(
    readonly rank: number,
    readonly method: string,
    readonly remote: RemoteErrorInfo,
    /** Errors from the other ranks of the same call, if any failed too. */
    readonly otherRanks: { rank: number; error: Error }[] = [],
  ) {
    super(`${method} failed on rank ${rank}: ${remote.name}: ${remote.message}` + alsoRanks(otherRanks));
    this.stack = withWorkerStack(this, rank, remote.stack);
  }
  get workerStack(): string {
    return this.remote.stack;
  }
}

/** A worker thread died (exit, uncaught error, out of memory). The whole pool is failed after this. */
export class WorkerDiedError extends Error {
  override name = "WorkerDiedError";
  constructor(readonly rank: number, readonly reason: string, readonly workerStack?: string, readonly method?: string) {
    // A rank on another host is lost with its host (the reason names the host), not as a thread.
    const what = reason.startsWith("host '") ? `rank ${rank} was lost` : `worker thread of rank ${rank} died`;
    super(
      `${what}${method ? ` during ${method}` : ""}: ${reason}; ` +
        "the worker group is failed (its state is lost) and all its threads were stopped",
    );
    if (workerStack) this.stack = withWorkerStack(this, rank, workerStack);
  }
}

/**
 * A rank stopped making progress (no heartbeat) for longer than the pool's heartbeat timeout:
 * a busy loop, a deadlock, an allocation loop. Its thread was terminated and the pool failed.
 */
export class WorkerUnresponsiveError extends WorkerDiedError {
  override name = "WorkerUnresponsiveError";
  /** silentMs: trainer.heartbeat_timeout; grace: how many of it the rank had (more inside a marked native call, heartbeat.ts) */
  constructor(rank: number, method: string, readonly silentMs: number, grace = 1) {
    super(rank, `no progress for ${(grace * silentMs) / 1000} s`, undefined, method);
    this.message =
      `rank ${rank} stopped responding during ${method}: no progress for ${(grace * silentMs) / 1000} s ` +
      (grace > 1 ? `inside a native call (a GPU pipeline compile), ${grace} x trainer.heartbeat_timeout=${silentMs / 1000}` : `(trainer.heartbeat_timeout=${silentMs / 1000})`) +
      `; its thread was terminated and the worker group is failed`;
    this.stack = `${this.name}: ${this.message}`;
  }
}

/** "(also rank N: ...)" lines for the other ranks of a failed call. */
export function alsoRanks(others: { rank: number; error: Error }[]): string {
  return others.map((o) => `\n  (also rank ${o.rank}: ${o.error.message.split("\n")[0]})`).join("");
}

/** The error's own stack with the worker's stack spliced in after the message. */
function withWorkerStack(e: Error, rank: number, workerStack: string): string {
  const driverFrames = (e.stack ?? "").split("\n").filter((l) => /^\s+at /.test(l)).join("\n");
  return `${e.name}: ${e.message}\n--- worker stack (rank ${rank}) ---\n${workerStack}\n--- driver stack ---\n${driverFrames}`;
}

/** A collective did not complete: a timeout (names the ranks that did not arrive) or an abort. */
export class CollectiveError extends Error {
  override name = "CollectiveError";
  constructor(message: string, readonly kind: "timeout" | "aborted") {
    super(message);
  }
}

/** Calls on a pool that failed or was shut down. */
export class WorkerGroupClosedError extends Error {
  override name = "WorkerGroupClosedError";
  constructor(message: string, override readonly cause?: Error) {
    super(message);
  }
}

/** Turns anything thrown in a worker into plain data that survives postMessage. */
export function toRemoteError(e: unknown): RemoteErrorInfo {
  if (e instanceof Error) {
    const info: RemoteErrorInfo = { name: e.name, message: e.message, stack: e.stack ?? `${e.name}: ${e.message}` };
    if (e instanceof CollectiveError) info.collective = e.kind;
    return info;
  }
  const text = typeof e === "string" ? e : safeString(e);
  return { name: "NonErrorThrown", message: text, stack: `(a non-Error value was thrown: ${text})` };
}

function safeString(v: unknown): string {
  try {
    return JSON.stringify(v) ?? String(v);
  } catch {
    return String(v);
  }
}
