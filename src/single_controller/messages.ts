// What the driver posts to a rank's thread and what comes back.
import type { CollectiveBuffers } from "./collective.js";
import type { RemoteErrorInfo } from "./errors.js";
import type { HostLayout } from "./distributed/host_collective.js";

/** workerData of every pool thread. */
export interface ThreadInit {
  rank: number;
  worldSize: number;
  localRank: number;
  /** This host's ranks' shared memory (indexed by localRank). */
  collective: CollectiveBuffers;
  /** Progress counters (heartbeat.ts), one int32 per rank. */
  heartbeat: SharedArrayBuffer;
  /** Set when the pool spans hosts: the layout and the bridge to this host's network side. */
  host?: HostLayout;
}

export interface RoleSpec {
  role: string;
  moduleUrl: string;
  exportName: string;
  /** Encoded with transport.encodeValue. */
  initArgs: unknown;
}

/** Construct the instances of one group (one per role) in this thread. */
export interface InitTask {
  kind: "init";
  groupId: number;
  roles: RoleSpec[];
}

/** Run `method` on the instance `key` ("<groupId>/<role>"). */
export interface CallTask {
  kind: "call";
  key: string;
  method: string;
  /** Encoded with transport.encodeValue. */
  args: unknown;
  /** How many ranks run this call (collectives need all of them). */
  participants: number;
}

/** Drop the instances of a group. */
export interface DisposeTask {
  kind: "dispose";
  groupId: number;
}

/** The pool is shutting down: run this thread's closers (onThreadClose) before it is stopped. */
export interface CloseTask {
  kind: "close";
}

export type Task = InitTask | CallTask | DisposeTask | CloseTask;

export type TaskResult = { ok: true; value: unknown } | { ok: false; error: RemoteErrorInfo };

export function instanceKey(groupId: number, role: string): string {
  return `${groupId}/${role}`;
}
