// Values crossing between the driver and a worker thread. DataProto values (at
// any depth inside arrays and plain objects) travel as their toTransfer()
// payload with their tensor buffers MOVED; FunctionRefs travel by name and
// arrive as the imported function; everything else is structured-cloned.
// Buffers the caller still owns (reachable from its own arguments) are copied,
// never moved, so `group.method(batch)` leaves `batch` usable, as in verl.
import { DataProto, numel } from "../protocol/index.js";
import type { DataProtoPayload } from "../protocol/index.js";
import { FunctionRef } from "./class_with_init_args.js";

const DP_MARK = "__verl_ts_dataproto__";
const FN_MARK = "__verl_ts_function_ref__";
const MAX_DEPTH = 16;

export interface Encoded {
  value: unknown;
  /** Buffers the value's DataProtos would like moved (filter before postMessage). */
  buffers: Set<ArrayBuffer>;
}

function isPlainObject(v: object): v is Record<string, unknown> {
  const proto = Object.getPrototypeOf(v) as unknown;
  return proto === Object.prototype || proto === null;
}

const NOT_CLONEABLE: [new (...a: never[]) => object, string][] = [
  [Promise, "a Promise (await it first)"],
  [WeakMap, "a WeakMap"],
  [WeakSet, "a WeakSet"],
  [WeakRef, "a WeakRef"],
];

/** Values postMessage cannot clone. Failing here gives a clear error; failing inside postMessage would kill the worker thread. */
function checkCloneable(v: unknown, path: string): void {
  if (typeof v === "function") {
    throw new TypeError(`${path} is a function; functions cannot cross threads (use FunctionRef(moduleUrl, exportName))`);
  }
  if (typeof v === "symbol") throw new TypeError(`${path} is a symbol; symbols cannot cross threads`);
  if (v !== null && typeof v === "object") {
    for (const [cls, what] of NOT_CLONEABLE) if (v instanceof cls) throw new TypeError(`${path} is ${what}, which cannot cross threads`);
  }
}

/** Leaves cloned as they are: nothing inside needs checking or encoding. */
function isOpaqueLeaf(v: object): boolean {
  return ArrayBuffer.isView(v) || v instanceof ArrayBuffer || v instanceof SharedArrayBuffer || v instanceof Date || v instanceof RegExp || v instanceof Error;
}

/** Replaces DataProto and FunctionRef values by markers; throws on values that cannot cross threads, naming where. */
export function encodeValue(value: unknown, where: string): Encoded {
  const buffers = new Set<ArrayBuffer>();
  const seen = new WeakSet<object>();
  const walk = (v: unknown, path: string, depth: number): unknown => {
    checkCloneable(v, path);
    if (v === null || typeof v !== "object" || isOpaqueLeaf(v)) return v;
    if (v instanceof DataProto) {
      for (const [key, t] of Object.entries(v.batch)) {
        if (t.data.length !== numel(t.shape)) {
          throw new Error(`${path}: DataProto tensor '${key}' has no data (its buffer was moved to another thread earlier; clone() a DataProto you keep using)`);
        }
      }
      const { payload, transfer } = v.toTransfer();
      for (const b of transfer) buffers.add(b);
      return { [DP_MARK]: payload };
    }
    if (v instanceof FunctionRef) return { [FN_MARK]: { moduleUrl: v.moduleUrl, exportName: v.exportName } };
    if (depth >= MAX_DEPTH || seen.has(v)) return v;
    seen.add(v);
    if (Array.isArray(v)) {
      let out: unknown[] | undefined;
      v.forEach((x, i) => {
        const y = walk(x, `${path}[${i}]`, depth + 1);
        if (y !== x) (out ??= v.slice())[i] = y;
      });
      return out ?? v;
    }
    if (isPlainObject(v)) {
      let out: Record<string, unknown> | undefined;
      for (const [k, x] of Object.entries(v)) {
        const y = walk(x, `${path}.${k}`, depth + 1);
        if (y !== x) (out ??= { ...v })[k] = y;
      }
      return out ?? v;
    }
    // Maps, Sets and class instances are cloned as they are (instances arrive as plain objects); only check what they hold.
    const check = (x: unknown, p: string) => {
      checkCloneable(x, p);
      if (x !== null && typeof x === "object" && !isOpaqueLeaf(x) && depth + 1 < MAX_DEPTH && !seen.has(x)) {
        if (x instanceof DataProto || x instanceof FunctionRef) return;
        walk(x, p, depth + 1);
      }
    };
    if (v instanceof Map) for (const [k, x] of v) { check(k, `${path}<key>`); check(x, `${path}.get(${String(k)})`); }
    else if (v instanceof Set) for (const x of v) check(x, `${path}<item>`);
    else for (const [k, x] of Object.entries(v)) check(x, `${path}.${k}`);
    return v;
  };
  return { value: walk(value, where, 0), buffers };
}

/** Every ArrayBuffer behind the tensors of DataProtos inside `value` (the caller's own data, never moved). */
export function collectDataProtoBuffers(value: unknown, into = new Set<ArrayBufferLike>()): Set<ArrayBufferLike> {
  const seen = new WeakSet<object>();
  const walk = (v: unknown, depth: number): void => {
    if (v === null || typeof v !== "object" || depth >= MAX_DEPTH || seen.has(v)) return;
    seen.add(v);
    if (v instanceof DataProto) {
      for (const t of Object.values(v.batch)) into.add(t.data.buffer);
      return;
    }
    if (Array.isArray(v)) v.forEach((x) => walk(x, depth + 1));
    else if (isPlainObject(v)) for (const x of Object.values(v)) walk(x, depth + 1);
  };
  walk(value, 0);
  return into;
}

const moduleCache = new Map<string, Promise<Record<string, unknown>>>();

/** Imports a module once per thread. */
export function importModule(moduleUrl: string): Promise<Record<string, unknown>> {
  let p = moduleCache.get(moduleUrl);
  if (!p) {
    p = import(moduleUrl) as Promise<Record<string, unknown>>;
    moduleCache.set(moduleUrl, p);
    p.catch(() => moduleCache.delete(moduleUrl));
  }
  return p;
}

async function resolveFunction(ref: { moduleUrl: string; exportName: string }): Promise<(...args: unknown[]) => unknown> {
  const mod = await importModule(ref.moduleUrl);
  const fn = mod[ref.exportName];
  if (typeof fn !== "function") throw new Error(`FunctionRef: ${ref.moduleUrl} has no exported function '${ref.exportName}'`);
  return fn as (...args: unknown[]) => unknown;
}

function markerOf(v: Record<string, unknown>): "dp" | "fn" | undefined {
  const keys = Object.keys(v);
  if (keys.length !== 1) return undefined;
  if (keys[0] === DP_MARK) return "dp";
  if (keys[0] === FN_MARK) return "fn";
  return undefined;
}

/** Undoes encodeValue on the receiving side (async: FunctionRefs are imported). */
export async function decodeValue(value: unknown): Promise<unknown> {
  const walk = async (v: unknown, depth: number): Promise<unknown> => {
    if (v === null || typeof v !== "object" || depth >= MAX_DEPTH) return v;
    if (Array.isArray(v)) {
      for (let i = 0; i < v.length; i++) v[i] = await walk(v[i], depth + 1);
      return v;
    }
    if (!isPlainObject(v)) return v;
    const mark = markerOf(v);
    if (mark === "dp") return DataProto.fromTransfer(v[DP_MARK] as DataProtoPayload);
    if (mark === "fn") return resolveFunction(v[FN_MARK] as { moduleUrl: string; exportName: string });
    for (const k of Object.keys(v)) v[k] = await walk(v[k], depth + 1);
    return v;
  };
  return walk(value, 0);
}

/** Synchronous decode for the driver side (workers never send FunctionRefs back as functions). */
export function decodeResult(value: unknown): unknown {
  const walk = (v: unknown, depth: number): unknown => {
    if (v === null || typeof v !== "object" || depth >= MAX_DEPTH) return v;
    if (Array.isArray(v)) {
      for (let i = 0; i < v.length; i++) v[i] = walk(v[i], depth + 1);
      return v;
    }
    if (!isPlainObject(v)) return v;
    const mark = markerOf(v);
    if (mark === "dp") return DataProto.fromTransfer(v[DP_MARK] as DataProtoPayload);
    if (mark === "fn") {
      const ref = v[FN_MARK] as { moduleUrl: string; exportName: string };
      return new FunctionRef(ref.moduleUrl, ref.exportName);
    }
    for (const k of Object.keys(v)) v[k] = walk(v[k], depth + 1);
    return v;
  };
  return walk(value, 0);
}

/** Buffers that may be put in a transfer list: not shared, not excluded. */
export function transferable(buffers: Iterable<ArrayBuffer>, exclude?: Set<ArrayBufferLike>): ArrayBuffer[] {
  const out: ArrayBuffer[] = [];
  for (const b of buffers) {
    if (typeof SharedArrayBuffer !== "undefined" && (b as ArrayBufferLike) instanceof SharedArrayBuffer) continue;
    if (exclude?.has(b)) continue;
    out.push(b);
  }
  return out;
}
