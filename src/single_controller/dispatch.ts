// Dispatch modes: how a call on the driver is split into one call per rank
// (dispatchFn) and how the per-rank results are joined again (collectFn), as
// in verl's single_controller/base/decorator.py. Modes live in a registry so a
// user adds their own with registerDispatchMode(name, { dispatchFn, collectFn }).
import { DataProto, padDataProtoToDivisor } from "../protocol/index.js";
import { FunctionRef } from "./class_with_init_args.js";

/** The built-in dispatch modes (strings, so user modes are plain strings too). */
export const Dispatch = {
  RANK_ZERO: "RANK_ZERO",
  ONE_TO_ALL: "ONE_TO_ALL",
  ALL_TO_ALL: "ALL_TO_ALL",
  DP_COMPUTE: "DP_COMPUTE",
  DP_COMPUTE_PROTO: "DP_COMPUTE_PROTO",
  DP_COMPUTE_PROTO_WITH_FUNC: "DP_COMPUTE_PROTO_WITH_FUNC",
  DP_COMPUTE_METRIC: "DP_COMPUTE_METRIC",
} as const;

/** Where a call runs: every rank, or rank zero only. */
export const Execute = { ALL: "ALL", RANK_ZERO: "RANK_ZERO" } as const;
export type ExecuteMode = (typeof Execute)[keyof typeof Execute];

/** What dispatch and collect functions see of the group. */
export interface WorkerGroupInfo {
  readonly worldSize: number;
}

/**
 * One list per argument, each holding one value per rank (verl's splitted args).
 * The object form may also say how many padding rows to drop after collecting.
 */
export type DispatchResult = unknown[][] | { args: unknown[][]; padSize?: number };
export type DispatchFn = (group: WorkerGroupInfo, ...args: unknown[]) => DispatchResult;
/** Joins the per-rank outputs (in rank order) into the call's result. */
export type CollectFn = (group: WorkerGroupInfo, outputs: unknown[]) => unknown;

export interface DispatchModeSpec {
  dispatchFn: DispatchFn;
  collectFn: CollectFn;
  /** The execute mode used when @register does not name one (RANK_ZERO for Dispatch.RANK_ZERO, else ALL). */
  defaultExecuteMode?: ExecuteMode;
}

const registry = new Map<string, DispatchModeSpec>();

/** Adds a dispatch mode. Registering the same functions again is a no-op; different ones under a taken name is an error. */
export function registerDispatchMode(name: string, spec: DispatchModeSpec): void {
  if (typeof name !== "string" || name.length === 0) throw new Error("registerDispatchMode: the name must be a non-empty string");
  if (typeof spec?.dispatchFn !== "function" || typeof spec?.collectFn !== "function") {
    throw new Error(`registerDispatchMode('${name}'): spec needs dispatchFn and collectFn functions`);
  }
  const old = registry.get(name);
  if (old) {
    if (old.dispatchFn === spec.dispatchFn && old.collectFn === spec.collectFn && old.defaultExecuteMode === spec.defaultExecuteMode) return;
    throw new Error(`registerDispatchMode: dispatch mode '${name}' is already registered with other functions (use updateDispatchMode to replace it)`);
  }
  registry.set(name, { ...spec });
}

/** Replaces the functions of a registered mode (verl's update_dispatch_mode). */
export function updateDispatchMode(name: string, spec: DispatchModeSpec): void {
  if (!registry.has(name)) throw unknownMode(name);
  registry.delete(name);
  registerDispatchMode(name, spec);
}

export function getDispatchMode(name: string): DispatchModeSpec {
  const spec = registry.get(name);
  if (!spec) throw unknownMode(name);
  return spec;
}

export function listDispatchModes(): string[] {
  return [...registry.keys()].sort();
}

function unknownMode(name: string): Error {
  return new Error(`unknown dispatch mode '${name}'; known modes: ${listDispatchModes().join(", ")}`);
}

/** Normalises a dispatch result and checks every argument has one value per rank. */
export function normalizeDispatch(mode: string, worldSize: number, result: DispatchResult): { args: unknown[][]; padSize: number } {
  const obj = Array.isArray(result) ? { args: result, padSize: 0 } : result;
  if (!obj || !Array.isArray(obj.args)) throw new Error(`dispatch mode '${mode}': dispatchFn must return a list of per-rank argument lists`);
  obj.args.forEach((a, i) => {
    if (!Array.isArray(a) || a.length !== worldSize) {
      const got = Array.isArray(a) ? `a list of ${a.length}` : typeof a;
      throw new Error(`dispatch mode '${mode}': argument ${i} must become a list with one value per rank (${worldSize}), got ${got}`);
    }
  });
  const padSize = obj.padSize ?? 0;
  if (!Number.isInteger(padSize) || padSize < 0) throw new Error(`dispatch mode '${mode}': padSize must be a non-negative integer, got ${padSize}`);
  return { args: obj.args, padSize };
}

// ---- built-in modes ----

const replicate = (v: unknown, n: number): unknown[] => new Array<unknown>(n).fill(v);
const isPerRankList = (v: unknown, n: number): v is unknown[] => Array.isArray(v) && v.length === n;

function dispatchOneToAll(group: WorkerGroupInfo, ...args: unknown[]): DispatchResult {
  return args.map((a) => replicate(a, group.worldSize));
}

/** verl's heuristic: when every argument is a list with one value per rank, scatter them; otherwise every rank gets the arguments as they are. */
function dispatchAllToAll(group: WorkerGroupInfo, ...args: unknown[]): DispatchResult {
  const n = group.worldSize;
  return args.every((a) => isPerRankList(a, n)) ? (args as unknown[][]) : args.map((a) => replicate(a, n));
}

function dispatchDpCompute(group: WorkerGroupInfo, ...args: unknown[]): DispatchResult {
  args.forEach((a, i) => {
    if (!isPerRankList(a, group.worldSize)) {
      throw new Error(`DP_COMPUTE: argument ${i} must be a list with one value per rank (${group.worldSize})`);
    }
  });
  return args as unknown[][];
}

function collectList(group: WorkerGroupInfo, outputs: unknown[]): unknown[] {
  return outputs;
}

function collectDpCompute(group: WorkerGroupInfo, outputs: unknown[]): unknown[] {
  if (outputs.length !== group.worldSize) throw new Error(`DP_COMPUTE: expected ${group.worldSize} outputs, got ${outputs.length}`);
  return outputs;
}

/** Pads every DataProto argument to a multiple of the world size and chunks it; other arguments go to every rank. */
function splitProtoArgs(mode: string, group: WorkerGroupInfo, args: unknown[]): { args: unknown[][]; padSize: number } {
  const n = group.worldSize;
  let padSize: number | undefined;
  const out = args.map((a, i) => {
    if (!(a instanceof DataProto)) return replicate(a, n);
    const { padded, padSize: p } = padDataProtoToDivisor(a, n);
    if (padSize !== undefined && p !== padSize) {
      throw new Error(`${mode}: DataProto argument ${i} has ${a.length} rows, which pads differently from the earlier DataProto arguments`);
    }
    padSize = p;
    return padded.chunk(n);
  });
  if (padSize === undefined) throw new Error(`${mode}: no DataProto argument to split across the ranks`);
  return { args: out, padSize };
}

function dispatchDpComputeProto(group: WorkerGroupInfo, ...args: unknown[]): DispatchResult {
  return splitProtoArgs(Dispatch.DP_COMPUTE_PROTO, group, args);
}

function dispatchDpComputeProtoWithFunc(group: WorkerGroupInfo, ...args: unknown[]): DispatchResult {
  const [fn, ...rest] = args;
  if (!(fn instanceof FunctionRef)) {
    throw new Error(
      "DP_COMPUTE_PROTO_WITH_FUNC: the first argument must be a FunctionRef(moduleUrl, exportName) " +
        "(functions cannot be sent to a worker thread; the worker imports the function by module and name)",
    );
  }
  const split = splitProtoArgs(Dispatch.DP_COMPUTE_PROTO_WITH_FUNC, group, rest);
  return { args: [replicate(fn, group.worldSize), ...split.args], padSize: split.padSize };
}

function collectDpComputeProto(group: WorkerGroupInfo, outputs: unknown[]): DataProto {
  outputs.forEach((o, r) => {
    if (!(o instanceof DataProto)) throw new Error(`DP_COMPUTE_PROTO: rank ${r} returned ${describe(o)}, expected a DataProto`);
  });
  return DataProto.concat(outputs as DataProto[]);
}

/** Splits DataProto arguments into world-size parts without padding (the first parts get one more row), so every row counts once in the metrics. */
function dispatchDpComputeMetric(group: WorkerGroupInfo, ...args: unknown[]): DispatchResult {
  const n = group.worldSize;
  let found = false;
  const out = args.map((a) => {
    if (!(a instanceof DataProto)) return replicate(a, n);
    found = true;
    const base = Math.floor(a.length / n), extra = a.length % n;
    const parts: DataProto[] = [];
    for (let r = 0, start = 0; r < n; r++) {
      const size = base + (r < extra ? 1 : 0);
      parts.push(a.slice(start, start + size));
      start += size;
    }
    return parts;
  });
  if (!found) throw new Error("DP_COMPUTE_METRIC: no DataProto argument to split across the ranks");
  return out;
}

function collectRankZero(group: WorkerGroupInfo, outputs: unknown[]): unknown {
  return outputs[0];
}

function describe(v: unknown): string {
  if (v === null) return "null";
  if (typeof v !== "object") return typeof v;
  return (v as object).constructor?.name ?? "an object";
}

registerDispatchMode(Dispatch.RANK_ZERO, { dispatchFn: dispatchOneToAll, collectFn: collectRankZero, defaultExecuteMode: Execute.RANK_ZERO });
registerDispatchMode(Dispatch.ONE_TO_ALL, { dispatchFn: dispatchOneToAll, collectFn: collectList });
registerDispatchMode(Dispatch.ALL_TO_ALL, { dispatchFn: dispatchAllToAll, collectFn: collectList });
registerDispatchMode(Dispatch.DP_COMPUTE, { dispatchFn: dispatchDpCompute, collectFn: collectDpCompute });
registerDispatchMode(Dispatch.DP_COMPUTE_PROTO, { dispatchFn: dispatchDpComputeProto, collectFn: collectDpComputeProto });
registerDispatchMode(Dispatch.DP_COMPUTE_PROTO_WITH_FUNC, { dispatchFn: dispatchDpComputeProtoWithFunc, collectFn: collectDpComputeProto });
registerDispatchMode(Dispatch.DP_COMPUTE_METRIC, { dispatchFn: dispatchDpComputeMetric, collectFn: collectList });
