// Constants made from host values, kept on the backend across calls (issue 23). A tensor made from
// host data is uploaded again at each use on WebGPU (a staging buffer, a copy, ~tens of us of host
// time each), and tfjs makes one for every JS number an op is given (`x.mul(0.5)`): the actor update
// made hundreds a step. Three kinds, each per backend:
//  - constScalar(v): a float32 scalar, kept for the backend's life (a handful of distinct values);
//  - constTensor(key, make): a tensor that depends only on its key (shape-only constants), kept too;
//  - cachedTensors(key, make): tensors that depend on inputs (rotary tables and attention biases of a
//    micro-batch, keyed by its positions and mask), in a small LRU cache bounded in entries and bytes.
//    It hands out clones (tfjs shares the data, nothing is copied or uploaded) that the caller owns
//    and disposes as any other tensor, so an eviction never pulls data from under a running pass.
// The values are the ones the callers made before, so results are bit for bit the same.
import * as tf from "@tensorflow/tfjs";

/** Most entries and bytes cachedTensors keeps per backend (an entry over the byte bound is not kept). */
export const CACHE_ENTRIES = 8;
export const CACHE_BYTES = 128 * 1024 * 1024;

interface Kept { backend: object; scalars: Map<string, tf.Scalar>; fixed: Map<string, tf.Tensor>; lru: Map<string, tf.Tensor[]>; bytes: number }

const byBackend = new Map<string, Kept>();

function kept(): Kept {
  const name = tf.getBackend(), backend = tf.backend();
  let k = byBackend.get(name);
  // a backend removed and registered again (releaseBackend, then initBackend) starts afresh: the old one's data went with it
  if (!k || k.backend !== backend) byBackend.set(name, (k = { backend, scalars: new Map(), fixed: new Map(), lru: new Map(), bytes: 0 }));
  return k;
}

const bytesOf = (ts: tf.Tensor[]) => ts.reduce((a, t) => a + t.size * (t.dtype === "float32" || t.dtype === "int32" ? 4 : 1), 0);

/** A float32 scalar of value v, kept on this backend: pass it where an op would take the number v (never dispose it). */
export function constScalar(v: number): tf.Scalar {
  const k = kept(), key = Object.is(v, -0) ? "-0" : String(v);
  let s = k.scalars.get(key);
  if (!s || s.isDisposed) {
    if (k.scalars.size >= 1024) throw new Error(`constScalar: over 1024 distinct values on ${tf.getBackend()} (it is for fixed constants, not per-step numbers)`);
    k.scalars.set(key, (s = tf.keep(tf.scalar(v, "float32"))));
  }
  return s;
}

/** The tensor `make()` builds for `key`, made once per backend and kept (never dispose it): for constants that depend on the key alone. */
export function constTensor<T extends tf.Tensor>(key: string, make: () => T): T {
  const k = kept();
  let t = k.fixed.get(key) as T | undefined;
  if (!t || t.isDisposed) k.fixed.set(key, (t = tf.keep(tf.tidy(make))));
  return t;
}

/**
 * Clones of the tensors `make()` builds for `key` (the caller owns and disposes them): built on a
 * miss, then kept in a least-recently-used cache of CACHE_ENTRIES entries and CACHE_BYTES bytes.
 * `key` must determine the values exactly (the inputs' content, not a hash alone).
 */
export function cachedTensors(key: string, make: () => tf.Tensor[]): tf.Tensor[] {
  const k = kept();
  let ts = k.lru.get(key);
  if (ts && ts.some((t) => t.isDisposed)) { drop(k, key); ts = undefined; }
  if (ts) {
    k.lru.delete(key); // most recent last
    k.lru.set(key, ts);
  } else {
    ts = tf.tidy(make);
    const size = bytesOf(ts);
    if (size > CACHE_BYTES) return ts; // the caller's own: not kept
    while (k.lru.size >= CACHE_ENTRIES || (k.lru.size > 0 && k.bytes + size > CACHE_BYTES)) drop(k, k.lru.keys().next().value!);
    ts.forEach((t) => tf.keep(t));
    k.lru.set(key, ts);
    k.bytes += size;
  }
  return ts.map((t) => tf.clone(t));
}

function drop(k: Kept, key: string): void {
  const ts = k.lru.get(key)!;
  k.lru.delete(key);
  k.bytes -= bytesOf(ts);
  tf.dispose(ts);
}

/** A string that holds `xs` exactly (as float64), for cache keys. */
export function exactKey(xs: ArrayLike<number>): string {
  const u16 = new Uint16Array(Float64Array.from(xs).buffer);
  let s = "";
  for (let i = 0; i < u16.length; i += 8192) s += String.fromCharCode(...u16.subarray(i, i + 8192));
  return s;
}

/** Disposes every kept constant and cached entry of every backend (tests; a backend about to be removed). */
export function clearConstants(): void {
  for (const k of byBackend.values()) tf.dispose([...k.scalars.values(), ...k.fixed.values(), ...[...k.lru.values()].flat()]);
  byBackend.clear();
}

/** What is kept on the current backend: scalars, fixed tensors, cached entries and their bytes. */
export function constantStats(): { scalars: number; fixed: number; entries: number; bytes: number } {
  const k = kept();
  return { scalars: k.scalars.size, fixed: k.fixed.size, entries: k.lru.size, bytes: k.bytes };
}
