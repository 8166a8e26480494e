// Collectives among the ranks of a pool over SharedArrayBuffer + Atomics:
// barrier, all-reduce (sum/mean/max/min of Float32Array or Float64Array of any
// length) and broadcast. Blocking: Atomics.wait parks the worker thread, which
// is fine off the main thread. Results do not depend on arrival order: each
// element is reduced in rank order (in float64, stored once), so reruns are
// bitwise identical and one rank's "mean" is the identity. For an optimizer
// sharded across ranks (ZeRO-1) there are reduceScatter (each rank copies out
// only its slice of the sum, with the bits allReduce gives it) and allGather
// (each rank writes only its slice, every rank reads all).
//
// Layout. control (Int32): count, generation, bell, broken, then per rank the
// generation it last arrived at, the op it announced, its length, where its
// buffer lies in its direct region (-1: elsewhere), and per writer (ranks +
// driver) the length of its abort reason; then reason bytes.
// scratch: one slot per rank plus one result slot, `chunkElems` float32 each;
// large buffers go through it chunk by chunk (two barriers per chunk).
//
// Direct path. Each rank also has a region of its own: a growable
// SharedArrayBuffer, grown on demand to the largest buffer asked of
// `reduceBuffer` (never shrunk, up to `directMaxBytes`), which every rank can
// read. A float32 buffer the caller filled inside its region (at the same offset
// on every rank) is reduced where it lies: one barrier once all have written,
// then each rank reduces its own slice in place, reading every rank's region in
// rank order (float64, rounded once: the chunked path's bits), and after a
// second barrier takes the other slices from their owners' regions (all-reduce)
// or nothing (reduce-scatter); an all-gather copies the others' slices from their
// regions after one barrier. Only rank r writes region r, and each op ends with a
// barrier after the last read of another rank's region, so a returned buffer is
// the caller's again. Ranks that disagree on the direct path (a region that
// could not grow) all take the chunked one, with the same bits.
//
// Failure. Any rank (a timeout, a method that threw) or the driver (a dead
// thread) marks the collective broken with a reason; every waiter wakes and
// throws CollectiveError with that reason, so no rank stays blocked. The driver
// resets a broken collective once no call is in flight on the pool.
import { CollectiveError } from "./errors.js";
import { heartbeat } from "./heartbeat.js";
import { logger } from "../utils/logger.js";

export type ReduceOp = "sum" | "mean" | "max" | "min";

export interface CollectiveBuffers {
  control: SharedArrayBuffer;
  scratch: SharedArrayBuffer;
  worldSize: number;
  chunkElems: number;
  timeoutMs: number;
  /**
   * Per rank, its direct region: a growable SharedArrayBuffer (length 0 until used, at most
   * `directMaxBytes`). Empty with one rank or with the direct path off.
   */
  regions?: SharedArrayBuffer[];
}

export interface CollectiveOptions {
  /** float32 elements per rank slot of the scratch buffer (default 256 Ki = 1 MiB per slot; larger measured no faster). */
  chunkElems?: number;
  /** How long a rank waits for the others at one step before failing (default 120 s). */
  timeoutMs?: number;
  /**
   * The most bytes of a rank's direct region (its reduceBuffer, reduced in place: see the header).
   * Default: VERL_COLLECTIVE_DIRECT_MAX_MB in MiB, else 4 GiB (V8's limit for a growable
   * SharedArrayBuffer); 0 turns the direct path off (every op goes through the scratch).
   */
  directMaxBytes?: number;
}

export const DEFAULT_COLLECTIVE_TIMEOUT_MS = 120_000;
export const DEFAULT_CHUNK_ELEMS = 1 << 18;
/** V8's largest growable SharedArrayBuffer (Node 20-22). */
export const MAX_DIRECT_REGION_BYTES = 2 ** 32;
/** Elements a direct pass handles between heartbeats and checks for a broken collective. */
const DIRECT_BLOCK = 1 << 20;

const COUNT = 0, GEN = 1, BELL = 2, BROKEN = 3, HEADER = 4;
const REASON_BYTES = 2048;
const OP_BARRIER = 1, OP_BROADCAST = 2, OP_REDUCE_SCATTER = 20, OP_ALL_GATHER = 30, OP_REDUCE_SCALED = 40, OP_PEER_REGIONS = 50;
const REDUCE_CODES: Record<ReduceOp, number> = { sum: 10, mean: 11, max: 12, min: 13 };

/** ES2024's growable SharedArrayBuffer (Node 20+), beyond this project's TypeScript lib. */
interface GrowableSharedArrayBuffer extends SharedArrayBuffer {
  readonly maxByteLength: number;
  grow(bytes: number): void;
}
const GrowableSAB = SharedArrayBuffer as unknown as new (bytes: number, opts: { maxByteLength: number }) => GrowableSharedArrayBuffer;

/** The direct region limit per rank in bytes: the option, else VERL_COLLECTIVE_DIRECT_MAX_MB, else 4 GiB. */
export function directMaxBytes(opts: CollectiveOptions = {}, env: NodeJS.ProcessEnv = process.env): number {
  let v = opts.directMaxBytes;
  const raw = env.VERL_COLLECTIVE_DIRECT_MAX_MB;
  if (v === undefined && raw !== undefined && raw !== "") {
    const mb = Number(raw);
    if (!(Number.isFinite(mb) && mb >= 0)) throw new Error(`VERL_COLLECTIVE_DIRECT_MAX_MB=${raw}: give a size in MiB (0 turns the direct path off)`);
    v = Math.floor(mb * 2 ** 20);
  }
  v ??= MAX_DIRECT_REGION_BYTES;
  if (!(Number.isFinite(v) && v >= 0)) throw new Error(`collective: directMaxBytes must be >= 0, got ${v}`);
  // float32 elements, and V8's cap
  return Math.min(MAX_DIRECT_REGION_BYTES, Math.floor(v / 4) * 4);
}

export function createCollectiveBuffers(worldSize: number, opts: CollectiveOptions = {}): CollectiveBuffers {
  if (!Number.isInteger(worldSize) || worldSize < 1) throw new Error(`collective: world size must be a positive integer, got ${worldSize}`);
  const chunkElems = opts.chunkElems ?? DEFAULT_CHUNK_ELEMS;
  if (!Number.isInteger(chunkElems) || chunkElems < 2 || chunkElems % 2 !== 0) {
    throw new Error(`collective: chunkElems must be an even integer >= 2, got ${chunkElems}`);
  }
  const timeoutMs = opts.timeoutMs ?? DEFAULT_COLLECTIVE_TIMEOUT_MS;
  if (!(timeoutMs > 0)) throw new Error(`collective: timeoutMs must be positive, got ${timeoutMs}`);
  const ints = HEADER + 4 * worldSize + (worldSize + 1);
  const control = new SharedArrayBuffer(ints * 4 + (worldSize + 1) * REASON_BYTES);
  // One rank needs no scratch: every op is the identity.
  const scratch = new SharedArrayBuffer(worldSize === 1 ? 8 : (worldSize + 1) * chunkElems * 4);
  const maxBytes = directMaxBytes(opts);
  let regions: SharedArrayBuffer[] = [];
  if (worldSize > 1 && maxBytes > 0) {
    try {
      // Only address space until grown; pages cost memory once written.
      regions = Array.from({ length: worldSize }, () => new GrowableSAB(0, { maxByteLength: maxBytes }));
    } catch (e) {
      logger().warn({ err: String(e) }, "collective: no direct shared-memory regions (growable SharedArrayBuffer refused); reduces go through the scratch");
      regions = [];
    }
  }
  return { control, scratch, worldSize, chunkElems, timeoutMs, regions };
}

/** What the current call looks like, for clear errors and for rejecting collectives in rank-zero-only calls. */
export interface CallInfo {
  method: string;
  /** How many ranks run this call (all, or 1 for RANK_ZERO). */
  participants: number;
}

/** What a worker sees as `this.collective`: one pool's ranks, in one process or across hosts. */
export interface RankCollective {
  readonly rank: number;
  readonly worldSize: number;
  readonly timeoutMs: number;
  barrier(): void;
  allReduce(buf: Float32Array | Float64Array, op?: ReduceOp): void;
  broadcast(buf: ArrayBufferView, root?: number): void;
  /**
   * In place, a sum: on rank r, buf[bounds[r], bounds[r+1]) and the tail buf[bounds[W], end) become
   * the element-wise sum over ranks, with the bits allReduce gives them; the rest of buf is unspecified.
   * `bounds`: W+1 non-decreasing offsets from 0, the same on every rank.
   */
  reduceScatter(buf: Float32Array, bounds: ArrayLike<number>): void;
  /**
   * In place: rank r's buf[bounds[r], bounds[r+1]) is copied into every rank's buf, so that
   * buf[bounds[0], bounds[W]) is the same everywhere. `bounds`: W+1 non-decreasing offsets, the same on every rank.
   */
  allGather(buf: Float32Array, bounds: ArrayLike<number>): void;
  setCall(call: CallInfo | undefined): void;
  abort(reason: string): void;
  /**
   * Several allReduce calls over consecutive pieces of one float32 buffer give the bits of one
   * call over all of it when every piece but the last starts and ends at a multiple of this
   * many elements (undefined: any split does, the sum of each element being in rank order).
   */
  readonly bucketAlignElems?: number;
  /**
   * A float32 buffer of `elems` for allReduce to reduce without copying it in or out (across
   * hosts, the leader's lies in the bridge memory; in one process, this rank's direct region);
   * contents unspecified, valid until the next reduceBuffer call on this rank. Absent, undefined
   * or a plain array where nothing is saved.
   */
  reduceBuffer?(elems: number): Float32Array | undefined;
  /** ms this rank has spent blocked waiting for its peers (profiles tell waits from work). */
  readonly waitMs?: number;
  /** Whether `buf` lies in this rank's direct region (reduced and gathered in place). */
  inRegion?(buf: ArrayBufferView): boolean;
  /**
   * A data-parallel gradient's sum in one pass, with the loss-scale division and the clip norm's
   * squares folded in. `bounds`: the ranks' slices (W+1 non-decreasing offsets from 0, the same on
   * every rank). The sum is reduceScatter's (`scatter`: on rank r only [bounds[r], bounds[r+1])
   * and the tail past bounds[W] are defined) or allReduce's (all of buf); then each summed element
   * of [bounds[0], bounds[W]) (only its own slice when `scatter`) is multiplied by `scale` (the
   * same on every rank), rounded to float32 again, and the squares of this rank's slice are added
   * to `acc` in order, in float64. Returns that sum: sumSquares over the slice when acc is 0,
   * continued across calls over consecutive pieces of one buffer.
   */
  reduceScaled?(buf: Float32Array, bounds: ArrayLike<number>, opts: ReduceScaledOptions): number;
  /**
   * Every rank's reduceBuffer(elems), a view each (this rank's own among them), once all ranks have
   * arrived; undefined on every rank when any of them has no direct region of that size. For work
   * that reads the peers' values where they lie (the GPU-side gradient reduce,
   * workers/dp_device_reduce.ts); the caller ends with barrier() after its last read of a peer's
   * region, before any rank writes its own where a peer reads.
   */
  peerRegions?(elems: number): Float32Array[] | undefined;
}

export interface ReduceScaledOptions {
  scatter: boolean;
  /** Multiplies the sum (default 1: left as it is). */
  scale?: number;
  /** The sum of squares so far (default 0). */
  acc?: number;
}

export class Collective implements RankCollective {
  readonly worldSize: number;
  readonly rank: number;
  timeoutMs: number;
  private readonly ctrl: Int32Array;
  private readonly reasonBytes: Uint8Array;
  private readonly f32: Float32Array;
  private readonly f64: Float64Array;
  private readonly u8: Uint8Array;
  private readonly chunkElems: number;
  private readonly arrivedAt: number;
  private readonly opAt: number;
  private readonly lenAt: number;
  private readonly directAt: number;
  private readonly reasonLenAt: number;
  /** Every rank's direct region (empty: no direct path) and this rank's. */
  private readonly regions: SharedArrayBuffer[];
  private readonly region: SharedArrayBuffer | undefined;
  /** Log lines already written (each once per thread). */
  private readonly noted = new Set<string>();
  /**
   * Ops of this rank that took the direct path and the chunked one (reduces and gathers; barriers
   * and broadcasts not counted), and the ms it spent blocked waiting for peers, all ops together.
   */
  readonly stats = { direct: 0, chunked: 0, waitMs: 0 };

  /** ms this rank has spent blocked in collectives waiting for its peers (a profile's wait). */
  get waitMs(): number {
    return this.stats.waitMs;
  }
  /** The call running on this thread (set by the worker runtime); undefined outside calls. */
  private call: CallInfo | undefined;
  /** In a pool thread every collective must happen inside a call. */
  private readonly requireCall: boolean;

  /** `rank` is the rank of this thread, or worldSize for the driver's handle (abort/reset only). */
  constructor(readonly buffers: CollectiveBuffers, rank: number, opts: { requireCall?: boolean } = {}) {
    const n = buffers.worldSize;
    if (!Number.isInteger(rank) || rank < 0 || rank > n) throw new Error(`collective: rank ${rank} is outside [0, ${n}]`);
    this.worldSize = n;
    this.rank = rank;
    this.timeoutMs = buffers.timeoutMs;
    this.chunkElems = buffers.chunkElems;
    this.arrivedAt = HEADER;
    this.opAt = HEADER + n;
    this.lenAt = HEADER + 2 * n;
    this.directAt = HEADER + 3 * n;
    this.reasonLenAt = HEADER + 4 * n;
    const ints = HEADER + 4 * n + (n + 1);
    this.ctrl = new Int32Array(buffers.control, 0, ints);
    this.reasonBytes = new Uint8Array(buffers.control, ints * 4);
    this.f32 = new Float32Array(buffers.scratch);
    this.f64 = new Float64Array(buffers.scratch);
    this.u8 = new Uint8Array(buffers.scratch);
    this.requireCall = opts.requireCall ?? false;
    this.regions = buffers.regions ?? [];
    this.region = rank < n ? this.regions[rank] : undefined;
  }

  /** A collective for a single rank (a worker built outside a pool): every op is the identity. */
  static single(): Collective {
    return new Collective(createCollectiveBuffers(1), 0);
  }

  setCall(call: CallInfo | undefined): void {
    this.call = call;
  }

  /** Blocks until every rank arrives. */
  barrier(): void {
    if (this.worldSize === 1) return;
    this.enter("barrier");
    this.announce(OP_BARRIER, 0);
    this.arriveAndWait("barrier");
    this.checkAgreement("barrier");
    // A second step so no rank's next announce overwrites what a slower rank is still checking.
    this.arriveAndWait("barrier");
  }

  /**
   * This rank's direct region as a float32 buffer of `elems` (grown to fit, never shrunk), or
   * undefined where there is none (one rank, the direct path off, over the limit, or the region
   * could not grow): then the caller uses a buffer of its own and the ops take the chunked path.
   */
  reduceBuffer(elems: number): Float32Array | undefined {
    if (!Number.isInteger(elems) || elems < 0) throw new Error(`reduceBuffer: elems must be a non-negative integer, got ${elems}`);
    const region = this.region as GrowableSharedArrayBuffer | undefined;
    if (!region) return undefined;
    const bytes = elems * 4, max = region.maxByteLength;
    if (bytes > max) {
      this.note("warn", `over:${max}`, `collective: a buffer of ${mib(bytes)} MiB is over the direct region limit of ${mib(max)} MiB a rank ` +
        "(VERL_COLLECTIVE_DIRECT_MAX_MB); it is reduced through the scratch, chunk by chunk");
      return undefined;
    }
    if (region.byteLength < bytes) {
      try {
        region.grow(bytes);
      } catch (e) {
        this.note("warn", `grow:${bytes}`, `collective: rank ${this.rank}'s direct region could not grow to ${mib(bytes)} MiB (${String(e)}); reduced through the scratch`);
        return undefined;
      }
      if (this.rank === 0) {
        this.note("info", `grown:${bytes}`, `collective: direct shared-memory reduce, ${mib(bytes)} MiB a rank for ${this.worldSize} ranks ` +
          `(limit ${mib(max)} MiB a rank, VERL_COLLECTIVE_DIRECT_MAX_MB)`);
      }
    }
    return new Float32Array(region, 0, elems);
  }

  inRegion(buf: ArrayBufferView): boolean {
    return this.regionOffset(buf) >= 0;
  }

  peerRegions(elems: number): Float32Array[] | undefined {
    const own = this.reduceBuffer(elems);
    if (this.worldSize === 1) return own && [own];
    this.enter("peerRegions");
    this.announce(OP_PEER_REGIONS, elems, own ? 0 : -1);
    this.arriveAndWait("peerRegions");
    this.checkAgreement("peerRegions");
    const all = this.allDirect(0);
    // a second step, as barrier's, so no rank's next announce overwrites what a slower one still checks
    this.arriveAndWait("peerRegions");
    if (all) this.stats.direct++;
    return all ? this.regions.map((sab) => new Float32Array(sab, 0, elems)) : undefined;
  }

  /** In place: every rank's `buf` becomes the element-wise reduction over ranks (rank order). */
  allReduce(buf: Float32Array | Float64Array, op: ReduceOp = "sum"): void {
    const is64 = buf instanceof Float64Array;
    if (!is64 && !(buf instanceof Float32Array)) throw new TypeError("allReduce: buf must be a Float32Array or a Float64Array");
    if (!(op in REDUCE_CODES)) throw new Error(`allReduce: op must be one of ${Object.keys(REDUCE_CODES).join(", ")}, got '${String(op)}'`);
    if (this.worldSize === 1) return;
    const split = evenSplit(buf.length, this.worldSize);
    this.reduceChunks("allReduce", buf, op, REDUCE_CODES[op] + (is64 ? 100 : 0), [[0, buf.length]],
      (at) => void this.directReduce("allReduce", buf as Float32Array, at, split, false, op, 1, 0, false));
  }

  reduceScatter(buf: Float32Array, bounds: ArrayLike<number>): void {
    checkBounds("reduceScatter", buf, bounds, this.worldSize, true);
    if (this.worldSize === 1) return;
    this.reduceChunks("reduceScatter", buf, "sum", OP_REDUCE_SCATTER, [[bounds[this.rank]!, bounds[this.rank + 1]!], [bounds[this.worldSize]!, buf.length]],
      (at) => void this.directReduce("reduceScatter", buf, at, bounds, true, "sum", 1, 0, false));
  }

  reduceScaled(buf: Float32Array, bounds: ArrayLike<number>, opts: ReduceScaledOptions): number {
    checkBounds("reduceScaled", buf, bounds, this.worldSize, true);
    const W = this.worldSize, r = this.rank, scatter = opts.scatter, scale = opts.scale ?? 1, acc = opts.acc ?? 0;
    const lo = bounds[r]!, hi = bounds[r + 1]!;
    let result: number | undefined;
    if (W > 1) {
      // scatter: the slices other than a rank's own are its business, so reduceScatter's code;
      // all: every rank takes the others' scaled slices, so a code of its own
      const out: [number, number][] = scatter ? [[lo, hi], [bounds[W]!, buf.length]] : [[0, buf.length]];
      this.reduceChunks("reduceScaled", buf, "sum", scatter ? OP_REDUCE_SCATTER : OP_REDUCE_SCALED, out,
        (at) => { result = this.directReduce("reduceScaled", buf, at, bounds, scatter, "sum", scale, acc, true); });
    }
    if (result !== undefined) return result;
    // one rank or the chunked path: the scale and the squares as passes of their own (the same bits)
    if (scale !== 1) {
      const s0 = scatter ? lo : bounds[0]!, s1 = scatter ? hi : bounds[W]!;
      for (let i = s0; i < s1; i++) buf[i] = buf[i]! * scale;
    }
    let s = acc;
    for (let i = lo; i < hi; i++) s += buf[i]! * buf[i]!;
    return s;
  }

  /**
   * The reduce through the scratch, chunk by chunk: every rank copies its chunk in and reduces its
   * share of it (rank order, float64, rounded once); then copies out the parts of `out` (ranges of buf) in the chunk.
   * When every rank's buffer lies in its direct region at the same offset, `direct` does the op
   * instead once all have arrived (the first chunk in the scratch is then unused).
   */
  private reduceChunks(name: string, buf: Float32Array | Float64Array, op: ReduceOp, code: number, out: [number, number][], direct: (at: number) => void): void {
    this.enter(name);
    const world = this.worldSize, rank = this.rank, is64 = buf instanceof Float64Array;
    const view = is64 ? this.f64 : this.f32;
    const C = is64 ? this.chunkElems / 2 : this.chunkElems;
    const res = world * C;
    const n = buf.length;
    const at = this.regionOffset(buf);
    this.announce(code, n, at);
    let off = 0;
    do {
      const len = Math.min(C, n - off);
      view.set(buf.subarray(off, off + len), rank * C);
      this.arriveAndWait(name);
      if (off === 0) {
        this.checkAgreement(name);
        if (this.allDirect(at)) {
          this.stats.direct++;
          direct(at);
          return;
        }
        this.stats.chunked++;
      }
      const seg = Math.ceil(len / world);
      const s0 = Math.min(len, rank * seg), s1 = Math.min(len, s0 + seg);
      reduceSegment(view, C, world, res, s0, s1, op);
      this.arriveAndWait(name);
      for (const [a, b] of out) {
        const i0 = Math.max(a, off), i1 = Math.min(b, off + len);
        if (i0 < i1) buf.set(view.subarray(res + i0 - off, res + i1 - off), i0);
      }
      off += len;
    } while (off < n);
  }

  /**
   * The reduce in the ranks' regions, every rank having arrived with its values written at element
   * `at` of its region (buf is that view): this rank's slice [bounds[r], bounds[r+1]) is reduced in
   * place (only this rank touches that slice of any region), the tail past bounds[W] into a copy
   * of its own; after a barrier (no rank reads this rank's region any more but its own slice) the
   * tail goes in, and unless `scatter` the other slices are taken from their owners' regions,
   * followed by a last barrier. With `fold` the slice's sums are scaled and their squares added to `acc`.
   */
  private directReduce(name: string, buf: Float32Array, at: number, bounds: ArrayLike<number>, scatter: boolean, op: ReduceOp, scale: number, acc: number, fold: boolean): number {
    const W = this.worldSize, r = this.rank, n = buf.length;
    const srcs = this.regions.map((sab) => new Float32Array(sab, at * 4, n));
    const lo = bounds[r]!, hi = bounds[r + 1]!, end = bounds[W]!;
    const d = op === "mean" ? W : 1;
    for (let i0 = lo; i0 < hi; i0 += DIRECT_BLOCK) {
      const i1 = Math.min(hi, i0 + DIRECT_BLOCK);
      if (fold) acc = reduceFold(srcs, buf, i0, i1, scale, acc);
      else reduceRange(srcs, buf, i0, i1, op, d);
      // a long pass is progress; a peer that failed meanwhile ends it
      heartbeat();
      this.throwIfBroken(name);
    }
    const tail = end < n ? new Float32Array(n - end) : undefined;
    if (tail) reduceTail(srcs, tail, end, n, op, d);
    this.arriveAndWait(name);
    if (!scatter) {
      for (let s = 0; s < W; s++) if (s !== r && bounds[s]! < bounds[s + 1]!) buf.set(srcs[s]!.subarray(bounds[s]!, bounds[s + 1]!), bounds[s]!);
    }
    if (tail) buf.set(tail, end);
    if (!scatter) this.arriveAndWait(name);
    return acc;
  }

  allGather(buf: Float32Array, bounds: ArrayLike<number>): void {
    checkBounds("allGather", buf, bounds, this.worldSize, false);
    if (this.worldSize === 1) return;
    this.enter("allGather");
    // The window is the ranks' slots, not the result slot: a slower rank may still be copying the
    // previous allReduce's result out of it while this rank writes before the first barrier.
    const world = this.worldSize, view = this.f32, cap = world * this.chunkElems;
    const lo = bounds[this.rank]!, hi = bounds[this.rank + 1]!, start = bounds[0]!, end = bounds[world]!;
    const at = this.regionOffset(buf);
    this.announce(OP_ALL_GATHER, buf.length, at);
    // Each rank writes its part of a window of the gathered range, then all read the rest.
    let off = start;
    do {
      const len = Math.min(cap, end - off), wEnd = off + len;
      const i0 = Math.max(lo, off), i1 = Math.min(hi, wEnd);
      if (i0 < i1) view.set(buf.subarray(i0, i1), i0 - off);
      this.arriveAndWait("allGather");
      if (off === start) {
        this.checkAgreement("allGather");
        if (this.allDirect(at)) {
          // every rank's slice is in its region: take the others' from there, then let them go on
          this.stats.direct++;
          for (let s = 0; s < world; s++) {
            if (s !== this.rank && bounds[s]! < bounds[s + 1]!) buf.set(new Float32Array(this.regions[s]!, (at + bounds[s]!) * 4, bounds[s + 1]! - bounds[s]!), bounds[s]!);
          }
          this.arriveAndWait("allGather");
          return;
        }
        this.stats.chunked++;
      }
      const ownFrom = Math.min(Math.max(lo, off), wEnd), ownTo = Math.max(Math.min(hi, wEnd), ownFrom);
      if (off < ownFrom) buf.set(view.subarray(0, ownFrom - off), off);
      if (ownTo < wEnd) buf.set(view.subarray(ownTo - off, len), ownTo);
      this.arriveAndWait("allGather");
      off = wEnd;
    } while (off < end);
  }

  /** In place: every rank's `buf` becomes root's (any typed array; same byte length on every rank). */
  broadcast(buf: ArrayBufferView, root = 0): void {
    if (!ArrayBuffer.isView(buf)) throw new TypeError("broadcast: buf must be a typed array");
    if (!Number.isInteger(root) || root < 0 || root >= this.worldSize) throw new Error(`broadcast: root ${root} is not a rank in [0, ${this.worldSize})`);
    if (this.worldSize === 1) return;
    this.enter("broadcast");
    const bytes = new Uint8Array(buf.buffer, buf.byteOffset, buf.byteLength);
    const cap = this.worldSize * this.chunkElems * 4;
    const n = bytes.length;
    this.announce(OP_BROADCAST * 1000 + root, n);
    let off = 0;
    do {
      const len = Math.min(cap, n - off);
      if (this.rank === root) this.u8.set(bytes.subarray(off, off + len), 0);
      this.arriveAndWait("broadcast");
      if (off === 0) this.checkAgreement("broadcast");
      if (this.rank !== root) bytes.set(this.u8.subarray(0, len), off);
      this.arriveAndWait("broadcast");
      off += len;
    } while (off < n);
  }

  /** Marks the collective broken: every rank waiting now or later throws with `reason`. The first reason wins. */
  abort(reason: string): void {
    // Already broken: keep the first reason (each writer has its own region, so only a second write by the same writer could clobber it).
    if (Atomics.load(this.ctrl, BROKEN) !== 0) return;
    const writer = this.rank;
    const encoded = new TextEncoder().encode(reason).subarray(0, REASON_BYTES);
    this.reasonBytes.set(encoded, writer * REASON_BYTES);
    Atomics.store(this.ctrl, this.reasonLenAt + writer, encoded.length);
    Atomics.compareExchange(this.ctrl, BROKEN, 0, writer + 1);
    this.ring();
  }

  /** Why the collective is broken, or undefined. */
  brokenReason(): string | undefined {
    const b = Atomics.load(this.ctrl, BROKEN);
    if (b === 0) return undefined;
    const writer = b - 1;
    const len = Atomics.load(this.ctrl, this.reasonLenAt + writer);
    const copy = this.reasonBytes.slice(writer * REASON_BYTES, writer * REASON_BYTES + len);
    return new TextDecoder().decode(copy);
  }

  /** Clears a broken state. Only safe when no rank is inside a collective (the driver calls it when the pool is idle). */
  reset(): void {
    Atomics.store(this.ctrl, COUNT, 0);
    Atomics.store(this.ctrl, BROKEN, 0);
  }

  // ---- internals ----

  private where(): string {
    return `on rank ${this.rank}${this.call ? ` in '${this.call.method}'` : ""}`;
  }

  private enter(op: string): void {
    if (this.requireCall && !this.call) {
      throw new CollectiveError(`collective ${op} ${this.where()} was used outside a worker call (e.g. in a timer); every rank must reach it from the same call`, "aborted");
    }
    if (this.call && this.call.participants !== this.worldSize) {
      throw new CollectiveError(
        `collective ${op} ${this.where()}: this call runs on ${this.call.participants} of ${this.worldSize} ranks (execute mode RANK_ZERO); ` +
          "collectives need every rank of the group",
        "aborted",
      );
    }
    this.throwIfBroken(op);
  }

  private throwIfBroken(op: string): void {
    const reason = this.brokenReason();
    if (reason !== undefined) throw new CollectiveError(`collective ${op} aborted ${this.where()}: ${reason}`, "aborted");
  }

  /** `at`: where the buffer lies in this rank's direct region (elements), -1 elsewhere. */
  private announce(code: number, len: number, at = -1): void {
    Atomics.store(this.ctrl, this.opAt + this.rank, code);
    Atomics.store(this.ctrl, this.lenAt + this.rank, len);
    Atomics.store(this.ctrl, this.directAt + this.rank, at);
  }

  /** After the first step of an op: whether every rank's buffer lies in its region at `at`. */
  private allDirect(at: number): boolean {
    if (at < 0) return false;
    for (let r = 0; r < this.worldSize; r++) if (Atomics.load(this.ctrl, this.directAt + r) !== at) return false;
    return true;
  }

  /** buf's element offset in this rank's direct region, or -1 when it is not a float32 view of it. */
  private regionOffset(buf: ArrayBufferView): number {
    return this.region !== undefined && buf instanceof Float32Array && buf.buffer === this.region ? buf.byteOffset / 4 : -1;
  }

  /** Logs `msg` once per `key` in this thread. */
  private note(level: "info" | "warn", key: string, msg: string): void {
    if (this.noted.has(key)) return;
    this.noted.add(key);
    logger()[level]({ rank: this.rank }, msg);
  }

  /** After the first step of an op every rank has announced; all must agree on the op and the length. */
  private checkAgreement(op: string): void {
    const code = Atomics.load(this.ctrl, this.opAt), len = Atomics.load(this.ctrl, this.lenAt);
    for (let r = 1; r < this.worldSize; r++) {
      if (Atomics.load(this.ctrl, this.opAt + r) !== code || Atomics.load(this.ctrl, this.lenAt + r) !== len) {
        const desc = (i: number) => `rank ${i}: ${describeOp(Atomics.load(this.ctrl, this.opAt + i))} of ${Atomics.load(this.ctrl, this.lenAt + i)}`;
        const all = Array.from({ length: this.worldSize }, (_, i) => desc(i)).join("; ");
        throw new CollectiveError(`collective ${op} ${this.where()}: ranks disagree on the operation or its length (${all})`, "aborted");
      }
    }
  }

  private ring(): void {
    Atomics.add(this.ctrl, BELL, 1);
    Atomics.notify(this.ctrl, BELL);
  }

  private arriveAndWait(op: string): void {
    const ctrl = this.ctrl, world = this.worldSize;
    const gen = Atomics.load(ctrl, GEN);
    Atomics.store(ctrl, this.arrivedAt + this.rank, gen + 1);
    if (Atomics.add(ctrl, COUNT, 1) + 1 === world) {
      Atomics.store(ctrl, COUNT, 0);
      Atomics.add(ctrl, GEN, 1);
      this.ring();
      return;
    }
    const deadline = Date.now() + this.timeoutMs, t0 = performance.now();
    for (;;) {
      const bell = Atomics.load(ctrl, BELL);
      if (Atomics.load(ctrl, GEN) !== gen) {
        this.stats.waitMs += performance.now() - t0;
        return;
      }
      this.throwIfBroken(op);
      const left = deadline - Date.now();
      if (left <= 0) {
        const missing: number[] = [];
        for (let r = 0; r < world; r++) if (Atomics.load(ctrl, this.arrivedAt + r) !== gen + 1) missing.push(r);
        const msg =
          `collective ${op} timed out after ${this.timeoutMs / 1000} s ${this.where()}: ranks [${missing.join(", ")}] did not arrive ` +
          "(they may have failed, skipped the collective, or be stuck)";
        this.abort(msg);
        throw new CollectiveError(msg, "timeout");
      }
      // Waiting for a slower peer is progress: wake at least once a second to say so.
      heartbeat();
      Atomics.wait(ctrl, BELL, bell, Math.min(left, 1000));
    }
  }
}

/** bounds: worldSize + 1 non-decreasing integer offsets within buf (from 0 for a reduceScatter). */
export function checkBounds(op: string, buf: Float32Array, bounds: ArrayLike<number>, worldSize: number, fromZero: boolean): void {
  if (!(buf instanceof Float32Array)) throw new TypeError(`${op}: buf must be a Float32Array`);
  const ok = bounds.length === worldSize + 1 && (!fromZero || bounds[0] === 0) && bounds[worldSize]! <= buf.length &&
    Array.from(bounds).every((b, i) => Number.isInteger(b) && b >= 0 && (i === 0 || b >= bounds[i - 1]!));
  if (!ok) {
    throw new Error(`${op}: bounds must be ${worldSize + 1} non-decreasing offsets${fromZero ? " from 0" : ""} within the buffer of ${buf.length}, got [${Array.from(bounds).join(", ")}]`);
  }
}

function describeOp(code: number): string {
  if (code === OP_BARRIER) return "barrier";
  if (code === OP_REDUCE_SCATTER) return "reduceScatter sum float32";
  if (code === OP_ALL_GATHER) return "allGather float32";
  if (code === OP_REDUCE_SCALED) return "reduceScaled sum float32";
  if (code === OP_PEER_REGIONS) return "peerRegions float32";
  if (code >= OP_BROADCAST * 1000) return `broadcast from rank ${code - OP_BROADCAST * 1000} (bytes)`;
  const is64 = code >= 100;
  const name = Object.entries(REDUCE_CODES).find(([, c]) => c === code % 100)?.[0];
  return name ? `allReduce ${name} ${is64 ? "float64" : "float32"}` : `op ${code}`;
}

/** out[res + i] = reduction over ranks r = 0..world-1 (in that order) of view[r*C + i], for i in [s0, s1). Exported for tests. */
export function reduceSegment(view: Float32Array | Float64Array, C: number, world: number, res: number, s0: number, s1: number, op: ReduceOp): void {
  if (op === "sum" || op === "mean") {
    // JS adds in float64, left to right (rank order); x / 1 is exact. Unrolled for common sizes (about 2x faster).
    const d = op === "mean" ? world : 1;
    const c2 = 2 * C, c3 = 3 * C;
    if (world === 2) for (let i = s0; i < s1; i++) view[res + i] = (view[i]! + view[C + i]!) / d;
    else if (world === 3) for (let i = s0; i < s1; i++) view[res + i] = (view[i]! + view[C + i]! + view[c2 + i]!) / d;
    else if (world === 4) for (let i = s0; i < s1; i++) view[res + i] = (view[i]! + view[C + i]! + view[c2 + i]! + view[c3 + i]!) / d;
    else {
      for (let i = s0; i < s1; i++) {
        let acc = view[i]!;
        for (let r = 1; r < world; r++) acc += view[r * C + i]!;
        view[res + i] = acc / d;
      }
    }
    return;
  }
  const pick = op === "max" ? Math.max : Math.min;
  for (let i = s0; i < s1; i++) {
    let acc = view[i]!;
    for (let r = 1; r < world; r++) acc = pick(acc, view[r * C + i]!);
    view[res + i] = acc;
  }
}

/** W+1 offsets splitting n elements into near-equal slices (the first n % W one longer): an all-reduce's shares of the work. */
function evenSplit(n: number, W: number): number[] {
  const base = Math.floor(n / W), extra = n % W;
  return Array.from({ length: W + 1 }, (_, i) => i * base + Math.min(i, extra));
}

const mib = (bytes: number) => (bytes / 2 ** 20).toFixed(1);

// The direct path's loops over the ranks' regions (views of growable SharedArrayBuffers; kept
// apart from reduceSegment so that each loop sees one kind of array). Same arithmetic as
// reduceSegment: each element reduced over the ranks in rank order, in float64, rounded once.

/** dst[i] = op over ranks of srcs[r][i] for i in [i0, i1) (sum and mean divided by d); dst may be one of srcs. */
function reduceRange(srcs: Float32Array[], dst: Float32Array, i0: number, i1: number, op: ReduceOp, d: number): void {
  const W = srcs.length;
  if (op === "sum" || op === "mean") {
    const a = srcs[0]!, b = srcs[1]!;
    if (W === 2) {
      for (let i = i0; i < i1; i++) dst[i] = (a[i]! + b[i]!) / d;
    } else if (W === 3) {
      const c = srcs[2]!;
      for (let i = i0; i < i1; i++) dst[i] = (a[i]! + b[i]! + c[i]!) / d;
    } else if (W === 4) {
      const c = srcs[2]!, e = srcs[3]!;
      for (let i = i0; i < i1; i++) dst[i] = (a[i]! + b[i]! + c[i]! + e[i]!) / d;
    } else {
      for (let i = i0; i < i1; i++) {
        let acc = a[i]!;
        for (let r = 1; r < W; r++) acc += srcs[r]![i]!;
        dst[i] = acc / d;
      }
    }
    return;
  }
  const pick = op === "max" ? Math.max : Math.min;
  for (let i = i0; i < i1; i++) {
    let acc = srcs[0]![i]!;
    for (let r = 1; r < W; r++) acc = pick(acc, srcs[r]![i]!);
    dst[i] = acc;
  }
}

/**
 * The gradient's pass: dst[i] = float32(float32(sum over ranks of srcs[r][i]) * scale) for i in
 * [i0, i1), and acc += dst[i]^2 in order (what the sum, scaleInPlace and sumSquares give one after
 * the other). Returns acc.
 */
function reduceFold(srcs: Float32Array[], dst: Float32Array, i0: number, i1: number, scale: number, acc: number): number {
  const W = srcs.length, f = Math.fround;
  const a = srcs[0]!, b = srcs[1]!;
  if (W === 2) {
    for (let i = i0; i < i1; i++) {
      const v = f(f(a[i]! + b[i]!) * scale);
      dst[i] = v;
      acc += v * v;
    }
  } else if (W === 3) {
    const c = srcs[2]!;
    for (let i = i0; i < i1; i++) {
      const v = f(f(a[i]! + b[i]! + c[i]!) * scale);
      dst[i] = v;
      acc += v * v;
    }
  } else if (W === 4) {
    const c = srcs[2]!, e = srcs[3]!;
    for (let i = i0; i < i1; i++) {
      const v = f(f(a[i]! + b[i]! + c[i]! + e[i]!) * scale);
      dst[i] = v;
      acc += v * v;
    }
  } else {
    for (let i = i0; i < i1; i++) {
      let s = a[i]!;
      for (let r = 1; r < W; r++) s += srcs[r]![i]!;
      const v = f(f(s) * scale);
      dst[i] = v;
      acc += v * v;
    }
  }
  return acc;
}

/** out[i - from] = op over ranks of srcs[r][i] for i in [from, to): the tail every rank needs (a few scalars). */
function reduceTail(srcs: Float32Array[], out: Float32Array, from: number, to: number, op: ReduceOp, d: number): void {
  const W = srcs.length, pick = op === "max" ? Math.max : Math.min, sum = op === "sum" || op === "mean";
  for (let i = from; i < to; i++) {
    let acc = srcs[0]![i]!;
    for (let r = 1; r < W; r++) acc = sum ? acc + srcs[r]![i]! : pick(acc, srcs[r]![i]!);
    out[i - from] = sum ? acc / d : acc;
  }
}
