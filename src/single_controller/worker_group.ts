// A WorkerGroup is one worker instance per rank of a ResourcePool (or one per
// role when the class is colocated), with every @register-ed method bound on
// the driver: `group.updateActor(data)` dispatches the arguments, runs the
// method on every rank (or rank zero), and collects the per-rank results, all
// as the method's registration says (verl's func_generator).
import { DataProto, unpadDataProto } from "../protocol/index.js";
import { ClassWithInitArgs, ColocatedWorkerClass } from "./class_with_init_args.js";
import { executeModeOf, registeredMethods, type MethodAttrs } from "./decorator.js";
import { Execute, getDispatchMode, normalizeDispatch, type WorkerGroupInfo } from "./dispatch.js";
import { alsoRanks, CollectiveError, WorkerDiedError, WorkerError, WorkerGroupClosedError } from "./errors.js";
import { DataProtoFuture, isThenable } from "./future.js";
import { instanceKey, type TaskResult } from "./messages.js";
import type { ResourcePool } from "./resource_pool.js";
import { collectDataProtoBuffers, decodeResult, encodeValue, importModule, transferable } from "./transport.js";
import { Worker } from "./worker.js";

/** A bound remote method: returns a future of the collected result (await it, or call .get()). */
export type RemoteMethod = <R = unknown>(...args: unknown[]) => DataProtoFuture<R>;

type MethodKeys<W> = {
  [K in keyof W]: K extends keyof Worker ? never : W[K] extends (...args: never[]) => unknown ? K : never;
}[keyof W] & string;

/** A group whose worker class is W: each method of W is a RemoteMethod (only @register-ed ones exist at run time). */
export type BoundWorkerGroup<W = unknown> = WorkerGroup & { [K in MethodKeys<W>]: RemoteMethod };

type WorkerClass = abstract new (...args: never[]) => unknown;

async function loadWorkerClass(spec: ClassWithInitArgs): Promise<WorkerClass> {
  const mod = await importModule(spec.moduleUrl);
  const cls = mod[spec.exportName];
  if (typeof cls !== "function") throw new Error(`${spec.moduleUrl} has no exported class '${spec.exportName}'`);
  if (!(cls.prototype instanceof Worker)) throw new Error(`${spec.exportName} (${spec.moduleUrl}) does not extend Worker`);
  return cls as WorkerClass;
}

// Internals are #private so that worker methods may use any name but the few public members.
export class WorkerGroup implements WorkerGroupInfo {
  readonly worldSize: number;
  readonly pool: ResourcePool;
  readonly groupId: number;
  /** The role inside a colocated class ("" for a plain class). */
  readonly role: string;
  readonly #methods: Map<string, MethodAttrs>;
  /** Per-role method tables when this group holds a colocated class. */
  readonly #roleMethods: Map<string, Map<string, MethodAttrs>>;

  private constructor(pool: ResourcePool, groupId: number, role: string, methods: Map<string, MethodAttrs>, roleMethods: Map<string, Map<string, MethodAttrs>>) {
    this.pool = pool;
    this.groupId = groupId;
    this.role = role;
    this.worldSize = pool.worldSize;
    this.#methods = methods;
    this.#roleMethods = roleMethods;
    for (const [name, attrs] of methods) {
      if (name in this) throw new Error(`worker method '${name}' clashes with the WorkerGroup member of that name; rename the method`);
      const bound: RemoteMethod = <R>(...args: unknown[]) => this.#invoke<R>(name, attrs, args);
      Object.defineProperty(this, name, { value: bound, enumerable: true });
    }
  }

  /**
   * Constructs the class in every rank's thread and binds its registered methods
   * (verl's RayWorkerGroup(resource_pool, ray_cls_with_init)).
   */
  static async create<W = unknown>(pool: ResourcePool, cls: ClassWithInitArgs | ColocatedWorkerClass): Promise<BoundWorkerGroup<W>> {
    pool.checkUsable();
    const roles = cls instanceof ColocatedWorkerClass ? Object.entries(cls.roles) : [["", cls] as [string, ClassWithInitArgs]];
    if (!(cls instanceof ColocatedWorkerClass) && !(cls instanceof ClassWithInitArgs)) {
      throw new Error("WorkerGroup.create: pass a ClassWithInitArgs or a ColocatedWorkerClass");
    }
    const roleMethods = new Map<string, Map<string, MethodAttrs>>();
    for (const [role, spec] of roles) roleMethods.set(role, registeredMethods(await loadWorkerClass(spec)));
    const groupId = pool.nextGroupId();
    const specs = roles.map(([role, spec]) => {
      const enc = encodeValue(spec.initArgs, `${spec.exportName} init args`);
      return { role, moduleUrl: spec.moduleUrl, exportName: spec.exportName, initArgs: enc.value };
    });
    const group = new WorkerGroup(pool, groupId, "", cls instanceof ColocatedWorkerClass ? new Map() : roleMethods.get("")!, roleMethods);
    const what = `init(${roles.map(([, s]) => s.exportName).join(", ")})`;
    try {
      await pool.enqueueSubmission(() => {
        const calls = Array.from({ length: pool.worldSize }, (_, rank) => pool.run(rank, { kind: "init", groupId, roles: specs }, [], what));
        return settleAll(what, calls).then(() => undefined);
      });
    } catch (e) {
      // Drop the instances the ranks that succeeded built (without waiting: a rank may still be busy in its init).
      if (pool.alive) {
        await pool.enqueueSubmission(() => {
          for (let rank = 0; rank < pool.worldSize; rank++) pool.run(rank, { kind: "dispose", groupId }).catch(() => undefined);
        });
      }
      throw e;
    }
    return group as BoundWorkerGroup<W>;
  }

  /** Names of the methods bound on this group. */
  methodNames(): string[] {
    return [...this.#methods.keys()].sort();
  }

  /** Calls a registered method by name (the untyped form of `group.name(...)`). */
  call<R = unknown>(method: string, ...args: unknown[]): DataProtoFuture<R> {
    const attrs = this.#methods.get(method);
    if (!attrs) {
      const known = this.methodNames();
      throw new Error(`worker group has no registered method '${method}'; registered: ${known.join(", ") || "none"}`);
    }
    return this.#invoke<R>(method, attrs, args);
  }

  /**
   * Per-role groups of a colocated class (verl's spawn(prefix_set)): each routes
   * calls to its role's instance in the same threads.
   */
  spawn<M extends Record<string, unknown> = Record<string, unknown>>(roles: (keyof M & string)[]): { [K in keyof M]: BoundWorkerGroup<M[K]> } {
    if (this.#roleMethods.has("")) throw new Error("spawn: this group holds a single worker class, not a colocated one");
    const out: Record<string, WorkerGroup> = {};
    for (const role of roles) {
      const methods = this.#roleMethods.get(role);
      if (!methods) throw new Error(`spawn: no role '${role}'; roles: ${[...this.#roleMethods.keys()].join(", ")}`);
      out[role] = new WorkerGroup(this.pool, this.groupId, role, methods, new Map([[role, methods]]));
    }
    return out as { [K in keyof M]: BoundWorkerGroup<M[K]> };
  }

  /** Stops every thread of the pool (all groups on it); the process can exit afterwards. */
  async shutdown(): Promise<void> {
    await this.pool.destroy();
  }

  #invoke<R>(method: string, attrs: MethodAttrs, args: unknown[]): DataProtoFuture<R> {
    const result = new Promise<R>((resolve, reject) => {
      this.pool
        .enqueueSubmission(async () => {
          this.pool.checkUsable();
          const ready = attrs.materializeFutures && args.some(isThenable) ? await Promise.all(args.map((a) => (isThenable(a) ? a : Promise.resolve(a)))) : args;
          const pending = this.#execute(method, attrs, ready);
          pending.then((v) => resolve(v as R), reject);
        })
        .catch(reject);
    });
    return DataProtoFuture.from(result, !attrs.blocking);
  }

  /** Dispatch, send to the ranks (synchronously, so per-rank order is call order), then collect. */
  #execute(method: string, attrs: MethodAttrs, args: unknown[]): Promise<unknown> {
    const spec = getDispatchMode(attrs.dispatchMode);
    const { args: perArg, padSize } = normalizeDispatch(attrs.dispatchMode, this.worldSize, spec.dispatchFn(this, ...args));
    const ranks = executeModeOf(attrs) === Execute.RANK_ZERO ? [0] : Array.from({ length: this.worldSize }, (_, r) => r);
    // The caller's own buffers are copied, never moved; a buffer going to several ranks is copied too.
    const callerBuffers = collectDataProtoBuffers(args);
    const encoded = ranks.map((r) => encodeValue(perArg.map((a) => a[r]), `${method} argument`));
    const uses = new Map<ArrayBuffer, number>();
    for (const e of encoded) for (const b of e.buffers) uses.set(b, (uses.get(b) ?? 0) + 1);
    const key = instanceKey(this.groupId, this.role);
    const calls = ranks.map((rank, i) => {
      const moved = transferable([...encoded[i]!.buffers].filter((b) => uses.get(b) === 1), callerBuffers);
      return this.pool.run(rank, { kind: "call", key, method, args: encoded[i]!.value, participants: ranks.length }, moved, method);
    });
    return settleAll(method, calls, ranks).then((outputs) => {
      let out = spec.collectFn(this, outputs);
      if (padSize > 0) out = unpad(out, padSize, attrs.dispatchMode);
      return out;
    });
  }
}

function unpad(out: unknown, padSize: number, mode: string): unknown {
  if (out instanceof DataProto) return unpadDataProto(out, padSize);
  if (Array.isArray(out)) return out.slice(0, out.length - padSize);
  throw new Error(`dispatch mode '${mode}' padded the batch but its collect result is neither a DataProto nor a list, so the padding cannot be removed`);
}

/** Rank of an error, best root cause first: a dead thread, a method error, a collective timeout, a collective abort, a stop. */
function severity(e: Error): number {
  if (e instanceof WorkerDiedError) return 0;
  if (e instanceof WorkerError) return e.remote.collective === "timeout" ? 2 : e.remote.collective === "aborted" ? 3 : 1;
  if (e instanceof CollectiveError) return 3;
  if (e instanceof WorkerGroupClosedError) return 4;
  if (e instanceof StillRunning) return 5;
  return 1;
}

/**
 * How long a failed call waits for its other ranks before reporting: long enough for the echoes of
 * one root cause (a collective abort, a stopped thread) to arrive, short enough that a stuck peer
 * never hides a failure that has already happened.
 */
const FAILURE_GRACE_MS = 2000;

/**
 * Collects every rank's result and throws the root-cause error (naming the others) if any rank
 * failed. The first failure is reported after FAILURE_GRACE_MS at most, even while other ranks
 * are still running (those are named as not having answered).
 */
async function settleAll(method: string, calls: Promise<TaskResult>[], ranks?: number[]): Promise<unknown[]> {
  const settled: (PromiseSettledResult<TaskResult> | undefined)[] = calls.map(() => undefined);
  await new Promise<void>((resolve) => {
    let left = calls.length;
    let grace: NodeJS.Timeout | undefined;
    const failed = () => { grace ??= setTimeout(resolve, FAILURE_GRACE_MS); };
    const done = () => {
      if (--left > 0) return;
      clearTimeout(grace);
      resolve();
    };
    if (left === 0) resolve();
    calls.forEach((call, i) => {
      call.then(
        (value) => { settled[i] = { status: "fulfilled", value }; if (!value.ok) failed(); done(); },
        (reason: unknown) => { settled[i] = { status: "rejected", reason }; failed(); done(); },
      );
    });
  });
  const errors: { rank: number; error: Error }[] = [];
  const outputs: unknown[] = [];
  settled.forEach((s, i) => {
    const rank = ranks ? ranks[i]! : i;
    if (s === undefined) {
      errors.push({ rank, error: new StillRunning(`has not answered ${method} yet (it may be stuck; trainer.heartbeat_timeout bounds how long before it is stopped)`) });
    } else if (s.status === "rejected") {
      errors.push({ rank, error: s.reason instanceof Error ? s.reason : new Error(String(s.reason)) });
    } else if (!s.value.ok) {
      errors.push({ rank, error: new WorkerError(rank, method, s.value.error) });
    } else {
      outputs.push(decodeResult(s.value.value));
    }
  });
  if (errors.length === 0) return outputs;
  errors.sort((a, b) => severity(a.error) - severity(b.error) || a.rank - b.rank);
  const [root, ...others] = errors;
  if (root!.error instanceof WorkerError) {
    const w = root!.error;
    throw new WorkerError(w.rank, w.method, w.remote, others);
  }
  if (others.length > 0) root!.error.message += alsoRanks(others);
  throw root!.error;
}

/** A rank whose part of a failed call had not settled when the failure was reported. */
class StillRunning extends Error {}
