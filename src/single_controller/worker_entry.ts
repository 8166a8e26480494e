// The task handler of every pool thread (loaded by piscina from dist). It keeps
// the worker instances of this rank across calls, runs one call at a time, and
// turns every failure into a result naming the rank and the method.
import { workerData } from "node:worker_threads";
import { Piscina } from "piscina";
import { Collective, type RankCollective } from "./collective.js";
import { HierarchicalCollective } from "./distributed/host_collective.js";
import { toRemoteError, CollectiveError } from "./errors.js";
import { attachHeartbeat, heartbeat, heartbeatStats, sampleHeap } from "./heartbeat.js";
import { logger } from "../utils/logger.js";
import { decodeValue, encodeValue, importModule, transferable } from "./transport.js";
import { instanceKey, type CallTask, type InitTask, type Task, type TaskResult, type ThreadInit } from "./messages.js";
import { Worker, runThreadClosers, setThreadContext } from "./worker.js";

const init = workerData as ThreadInit;
const localCollective = new Collective(init.collective, init.localRank, { requireCall: true });
const collective: RankCollective = init.host ? new HierarchicalCollective(localCollective, init.host) : localCollective;
setThreadContext({ rank: init.rank, worldSize: init.worldSize, localRank: init.localRank, collective, shared: new Map() });

attachHeartbeat(init.heartbeat, init.localRank);
// The event loop turning is progress: a call awaiting I/O or a timer is alive; a busy loop stops this.
setInterval(() => {
  heartbeat();
  sampleHeap();
}, 200).unref();

const instances = new Map<string, Worker>();

type Ctor = new (...args: unknown[]) => Worker;

async function loadClass(moduleUrl: string, exportName: string): Promise<Ctor> {
  const mod = await importModule(moduleUrl);
  const cls = mod[exportName];
  if (typeof cls !== "function") throw new Error(`${moduleUrl} has no exported class '${exportName}'`);
  if (!(cls.prototype instanceof Worker)) {
    throw new Error(
      `${exportName} (${moduleUrl}) does not extend Worker from verl-ts single_controller ` +
        "(or it imports a different copy of verl-ts than the pool runs)",
    );
  }
  return cls as Ctor;
}

async function runInit(task: InitTask): Promise<unknown> {
  for (const spec of task.roles) {
    const cls = await loadClass(spec.moduleUrl, spec.exportName);
    const args = (await decodeValue(spec.initArgs)) as unknown[];
    collective.setCall({ method: `new ${spec.exportName}`, participants: init.worldSize });
    try {
      instances.set(instanceKey(task.groupId, spec.role), new cls(...args));
    } finally {
      collective.setCall(undefined);
    }
  }
  return null;
}

async function runCall(task: CallTask): Promise<unknown> {
  const inst = instances.get(task.key);
  if (!inst) {
    throw new Error(
      `rank ${init.rank} has no worker instance '${task.key}': the group was disposed, or this thread replaced one that died (its state is gone)`,
    );
  }
  const fn = (inst as unknown as Record<string, unknown>)[task.method];
  if (typeof fn !== "function") throw new Error(`${inst.constructor.name} has no method '${task.method}'`);
  const args = (await decodeValue(task.args)) as unknown[];
  collective.setCall({ method: task.method, participants: task.participants });
  try {
    return await (fn as (...a: unknown[]) => unknown).apply(inst, args);
  } finally {
    collective.setCall(undefined);
  }
}

function methodOf(task: Task): string {
  if (task.kind === "call") return task.method;
  if (task.kind === "init") return `init(${task.roles.map((r) => r.exportName).join(", ")})`;
  return task.kind;
}

/** piscina's movable wrapper: posts `value` with `transfer` in the transfer list. */
function moving(value: TaskResult, transfer: ArrayBuffer[]): unknown {
  const wrapper = { [Piscina.transferableSymbol]: transfer, [Piscina.valueSymbol]: value };
  return Piscina.move(wrapper as unknown as Parameters<typeof Piscina.move>[0]);
}

export default async function handleTask(task: Task): Promise<unknown> {
  try {
    let value: unknown = null;
    if (task.kind === "init") value = await runInit(task);
    else if (task.kind === "call") value = await runCall(task);
    else if (task.kind === "close") {
      const stats = heartbeatStats();
      if (stats) logger().info({ rank: init.rank, ...stats }, "heartbeat stats (VERL_HEARTBEAT_STATS): longest gap between progress ticks, peak V8 heap");
      await runThreadClosers();
    }
    else for (const key of [...instances.keys()]) if (key.startsWith(`${task.groupId}/`)) instances.delete(key);
    const enc = encodeValue(value, `${methodOf(task)} result`);
    const result: TaskResult = { ok: true, value: enc.value };
    const transfer = transferable(enc.buffers);
    return transfer.length ? moving(result, transfer) : result;
  } catch (e) {
    // Peers may be (or soon be) waiting in a collective for this rank: release them.
    if (init.worldSize > 1 && task.kind !== "close" && !(e instanceof CollectiveError)) {
      collective.abort(`rank ${init.rank} failed in ${methodOf(task)}: ${e instanceof Error ? `${e.name}: ${e.message}` : String(e)}`);
    }
    const result: TaskResult = { ok: false, error: toRemoteError(e) };
    return result;
  }
}
