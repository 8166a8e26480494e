// The hand-off between a host's leader rank thread (local rank 0, blocked in a
// collective) and the host's main thread, which owns the sockets. The leader
// posts a request and then, waiting anyway, does every pass over the bytes while
// the main thread moves them (ring.ts): it copies its own segment into the shared
// data region first, in pieces the main thread sends as they are copied; it
// combines each received piece as it lands (so the main thread, which also serves
// the gRPC control link and its keepalives, does no arithmetic; for "mean" the last
// combine also divides by the world size, so every host receives quotients and no
// rank makes a pass of its own for it); and it copies each finished piece out to the
// caller's buffer as it becomes final. The main
// thread sends straight out of the data region and has the kernel read the
// neighbour's bytes straight into the shared regions. A caller whose buffer already
// lies in the bridge memory (reduceBuffer: past the receive region, grown on demand)
// skips both copies: the ring sends from, combines in and receives into that buffer.
// Control words: request/response seq, op, dtype, length, root host, status, reason
// length, two signal words, the bytes copied in, the byte offset of the data (0: the data
// region; else the caller's buffer in place), then per ring step bytes received
// (main thread) and per reduce-scatter step bytes combined (leader).
import { CollectiveError } from "../errors.js";
import { sharedMemory, simdKernels, type SimdKernels, type WasmMemory } from "./simd.js";

const REQ = 0, RESP = 1, OP = 2, DTYPE = 3, LEN = 4, ROOT = 5, STATUS = 6, MSGLEN = 7;
/** Bumped by the main thread whenever bytes arrive / by the leader whenever it combined some. */
export const RECV_SIG = 8, COMB_SIG = 9;
/** Bytes of this host's own segment the leader has copied into the data region (what step 0 sends). */
export const COPIED = 10;
/** Byte offset in the memory of the request's data (unsigned: stored as int32, read with >>> 0). */
const BASE = 11;
/** A ring of H hosts has H-1 reduce-scatter and H-1 all-gather steps; this many hosts at most. */
export const MAX_HOSTS = 1024;
export const RECV0 = 16, COMB0 = RECV0 + 2 * MAX_HOSTS;
const INTS = COMB0 + MAX_HOSTS;
const MSG_BYTES = 2048;
const ST_OK = 0, ST_ABORTED = 1, ST_TIMEOUT = 2;
/** Granularity of the leader's progress signals to the main thread (and of its copy-in pieces). */
export const LEADER_WAKE_BYTES = 1 << 20;
const WAKE_BYTES = LEADER_WAKE_BYTES;

export const BRIDGE_OPS = { barrier: 1, broadcast: 2, sum: 10, max: 12, min: 13 } as const;
export type BridgeOp = keyof typeof BRIDGE_OPS;
const OP_NAMES = Object.fromEntries(Object.entries(BRIDGE_OPS).map(([k, v]) => [v, k])) as Record<number, BridgeOp>;
const DTYPES = ["float32", "float64", "bytes"] as const;
export type BridgeDtype = (typeof DTYPES)[number];

export interface BridgeBuffers {
  control: SharedArrayBuffer;
  /**
   * One shared WebAssembly memory, so the SIMD kernels (simd.ts) reach every region: the data
   * region (the chunk being reduced, in place; `dataBytes`), then the receive region (where the
   * predecessor's reduce-scatter bytes land, two halves by step parity), then (grown on demand,
   * userBase on) the in-place buffer a leader hands its caller (reduceBuffer).
   */
  memory: WasmMemory;
  dataBytes: number;
}

const recvBytes = (b: BridgeBuffers) => b.dataBytes + 1024;
export const dataRegion = (b: BridgeBuffers): Uint8Array => new Uint8Array(b.memory.buffer, 0, b.dataBytes);
export const recvRegion = (b: BridgeBuffers): Uint8Array => new Uint8Array(b.memory.buffer, b.dataBytes, recvBytes(b));
/** Where the in-place region starts: the first page past the receive region (the memory's initial size). */
export const userBase = (b: BridgeBuffers): number => Math.ceil((b.dataBytes + recvBytes(b)) / 65536) * 65536;

/** Default data capacity: 64 MiB a request (larger buffers cross in several requests). */
export const DEFAULT_BRIDGE_BYTES = 64 << 20;

export function createBridgeBuffers(dataBytes = DEFAULT_BRIDGE_BYTES): BridgeBuffers {
  if (!Number.isInteger(dataBytes) || dataBytes < 64 || dataBytes % 8 !== 0) throw new Error(`bridge: data bytes must be a multiple of 8 >= 64, got ${dataBytes}`);
  const all = 2 * dataBytes + 1024;
  return { control: new SharedArrayBuffer(INTS * 4 + MSG_BYTES), memory: sharedMemory(all, true), dataBytes };
}

/** Segment i of n elements split over H hosts: [start, end). */
export function segment(i: number, n: number, H: number): [number, number] {
  return [Math.floor((i * n) / H), Math.floor(((i + 1) * n) / H)];
}

export const mod = (i: number, H: number): number => ((i % H) + H) % H;

/** Byte offset in the receive region of the half for reduce-scatter step s. */
export function recvHalf(buffers: BridgeBuffers, s: number): number {
  return s % 2 === 0 ? 0 : (recvBytes(buffers) / 2) & ~7;
}

type Numeric = Float32Array | Float64Array;

/** The leader thread's side: blocking requests. */
export class BridgeClient {
  private readonly ctrl: Int32Array;
  private readonly msg: Uint8Array;
  private readonly bytes: Uint8Array;
  private readonly simd: SimdKernels;
  /** The memory's buffers (one per length it has had) that reduceBuffer handed out views of. */
  private readonly handedOut = new WeakSet<SharedArrayBuffer>();
  constructor(private readonly buffers: BridgeBuffers, private readonly timeoutMs: number, private readonly host: { me: number; hosts: number }) {
    this.ctrl = new Int32Array(buffers.control, 0, INTS);
    this.msg = new Uint8Array(buffers.control, INTS * 4, MSG_BYTES);
    this.bytes = dataRegion(buffers);
    this.simd = simdKernels(buffers.memory);
  }

  get capacityBytes(): number {
    return this.bytes.length;
  }

  /**
   * `elems` float32 in the bridge memory, for a caller to fill and reduce in place (no copy in or
   * out); contents unspecified. One region per leader: valid until the next call. Undefined when
   * the memory cannot grow that far (4 GiB in all).
   */
  reduceBuffer(elems: number): Float32Array | undefined {
    const base = userBase(this.buffers), need = base + elems * 4, mem = this.buffers.memory;
    if (need > 65536 * 65536) return undefined;
    const have = mem.buffer.byteLength;
    if (have < need) {
      try {
        mem.grow(Math.ceil((need - have) / 65536));
      } catch {
        return undefined;
      }
    }
    const sab = mem.buffer;
    this.handedOut.add(sab);
    return new Float32Array(sab, base, elems);
  }

  /** The byte offset of `chunk` in the bridge memory when it lies in reduceBuffer's region; else 0. */
  private inPlace(chunk: Uint8Array): number {
    const b = chunk.buffer;
    return b instanceof SharedArrayBuffer && this.handedOut.has(b) && chunk.byteOffset >= userBase(this.buffers) ? chunk.byteOffset : 0;
  }

  /**
   * Runs one cross-host op on `chunk` (at most capacityBytes) in place; a reduce's result
   * is divided by `divideBy` (1: as is; every host passes the same: each segment's owner divides
   * it before the all-gather sends it on).
   */
  request(op: BridgeOp, dtype: BridgeDtype, chunk: Uint8Array, length: number, rootHost = 0, divideBy = 1): void {
    if (chunk.length > this.bytes.length) throw new Error(`bridge: chunk of ${chunk.length} bytes exceeds ${this.bytes.length}`);
    if (divideBy !== 1 && op !== "sum") throw new Error(`bridge: only a sum is divided (a fused mean), not '${op}'`);
    const { me, hosts: H } = this.host;
    const c = this.ctrl;
    const reduce = op === "sum" || op === "max" || op === "min";
    const piped = reduce && H > 1 && length > 0;
    const base = piped ? this.inPlace(chunk) : 0;
    // A host that only receives a broadcast has nothing to hand over; a ring reduce copies in while it runs.
    if (!piped && (op !== "broadcast" || rootHost === me)) this.bytes.set(chunk, 0);
    // Progress words belong to this request from here on (the main thread writes RECV only while serving it).
    if (reduce) {
      for (let s = 0; s < H - 1; s++) Atomics.store(c, COMB0 + s, 0);
      for (let k = 0; k < 2 * (H - 1); k++) Atomics.store(c, RECV0 + k, 0);
    }
    Atomics.store(c, COPIED, 0);
    Atomics.store(c, OP, BRIDGE_OPS[op]);
    Atomics.store(c, DTYPE, DTYPES.indexOf(dtype));
    Atomics.store(c, LEN, length);
    Atomics.store(c, ROOT, rootHost);
    Atomics.store(c, BASE, base | 0);
    const seq = Atomics.add(c, REQ, 1) + 1;
    Atomics.notify(c, REQ);
    const deadline = Date.now() + this.timeoutMs;
    const timedOut = () => new CollectiveError(`collective ${op} across hosts: this host's network side gave no answer within ${this.timeoutMs / 1000} s`, "timeout");
    if (piped) this.pipelined(op, dtype, chunk, length, seq, deadline, timedOut, divideBy, base);
    for (;;) {
      const resp = Atomics.load(c, RESP);
      if (resp === seq) break;
      const left = deadline - Date.now();
      if (left <= 0) throw timedOut();
      Atomics.wait(c, RESP, resp, Math.min(left, 1000));
    }
    const status = Atomics.load(c, STATUS);
    if (status !== ST_OK) {
      const reason = new TextDecoder().decode(this.msg.slice(0, Atomics.load(c, MSGLEN)));
      throw new CollectiveError(reason, status === ST_TIMEOUT ? "timeout" : "aborted");
    }
    // (a reduce that is not piped has one host or no values: nothing to divide)
    if (!piped && op !== "barrier") chunk.set(this.bytes.subarray(0, chunk.length));
  }

  private signal(): void {
    Atomics.add(this.ctrl, COMB_SIG, 1);
    Atomics.notify(this.ctrl, COMB_SIG);
  }

  /**
   * Waits until ring step k has received more than `done` bytes; the bytes received, or -1 when
   * the network side answered with a failure (its status says which). Callers pass the last byte
   * of the next whole element: a count short of one (socket reads end anywhere) must wait, not spin.
   */
  private received(k: number, done: number, seq: number, deadline: number, timedOut: () => Error): number {
    const c = this.ctrl;
    for (;;) {
      const sig = Atomics.load(c, RECV_SIG);
      const r = Atomics.load(c, RECV0 + k);
      if (r > done) return r;
      if (Atomics.load(c, RESP) === seq) {
        if (Atomics.load(c, STATUS) !== ST_OK) return -1;
        // Answered OK: every step's count was stored before the answer.
        const last = Atomics.load(c, RECV0 + k);
        if (last > done) return last;
        throw new CollectiveError(`bridge: ring step ${k} finished with ${last} bytes where more were expected`, "aborted");
      }
      const left = deadline - Date.now();
      if (left <= 0) throw timedOut();
      Atomics.wait(c, RECV_SIG, sig, Math.min(left, 1000));
    }
  }

  /**
   * A ring reduce's passes over the bytes, each overlapping the network: copy in (own segment
   * first, which step 0 sends as it lands), combine each reduce-scatter piece as it arrives,
   * copy out each final piece as it is combined (and divided) or arrives in the all-gather.
   */
  private pipelined(op: BridgeOp, dtype: BridgeDtype, chunk: Uint8Array, n: number, seq: number, deadline: number, timedOut: () => Error, divideBy: number, base: number): void {
    const { me, hosts: H } = this.host;
    const c = this.ctrl;
    const is64 = dtype === "float64", bpe = is64 ? 8 : 4;
    const bytes = this.bytes;
    const [m0, m1] = segment(me, n, H);
    if (base !== 0) {
      // In place: the whole own segment is there already.
      Atomics.store(c, COPIED, (m1 - m0) * bpe);
      this.signal();
    } else {
      for (let p = m0 * bpe; p < m1 * bpe; p += WAKE_BYTES) {
        const e = Math.min(m1 * bpe, p + WAKE_BYTES);
        bytes.set(chunk.subarray(p, e), p);
        Atomics.store(c, COPIED, e - m0 * bpe);
        this.signal();
      }
      // The rest before any combine: the predecessor's pieces are combined into it.
      bytes.set(chunk.subarray(0, m0 * bpe), 0);
      bytes.set(chunk.subarray(m1 * bpe, n * bpe), m1 * bpe);
    }
    const heap = this.buffers.memory.buffer, D = this.buffers.dataBytes;
    const data: Numeric = is64 ? new Float64Array(heap, base, n) : new Float32Array(heap, base, n);
    const out: Numeric = is64 ? new Float64Array(chunk.buffer, chunk.byteOffset, n) : new Float32Array(chunk.buffer, chunk.byteOffset, n);
    const add = is64 ? this.simd.add64 : this.simd.add32, addDiv = is64 ? this.simd.addDiv64 : this.simd.addDiv32;
    const jsCombine = op === "sum" ? undefined : COMBINE[op === "max" ? 0 : 1]![is64 ? 1 : 0]!;
    // In place the result is where the caller reads it: nothing to copy out.
    const emit = base !== 0 ? () => undefined : (i0: number, i1: number) => out.set(data.subarray(i0, i1), i0);
    for (let s = 0; s < H - 1; s++) {
      const [a, b] = segment(mod(me - s - 1, H), n, H);
      const total = (b - a) * bpe;
      const half = recvHalf(this.buffers, s);
      const got: Numeric = is64 ? new Float64Array(heap, D + half, b - a) : new Float32Array(heap, D + half, b - a);
      const into = data.subarray(a, b);
      let done = 0;
      while (done < total) {
        const r = this.received(s, done + bpe - 1, seq, deadline, timedOut);
        if (r < 0) return;
        const avail = r - (r % bpe);
        if (avail <= done) continue;
        const last = s === H - 2;
        if (jsCombine) jsCombine(into, got, done / bpe, avail / bpe); // max/min: never divided
        else if (last && divideBy !== 1) addDiv(base + a * bpe + done, D + half + done, (avail - done) / bpe, divideBy);
        else add(base + a * bpe + done, D + half + done, (avail - done) / bpe);
        // The main thread sends pieces of a MiB or more: wake it when one may have completed, not per read.
        const crossed = Math.floor(avail / WAKE_BYTES) > Math.floor(done / WAKE_BYTES) || avail === total;
        Atomics.store(c, COMB0 + s, avail);
        if (crossed) this.signal();
        // The last reduce-scatter step leaves this host's segment final (the all-gather sends it on as is).
        if (last) emit(a + done / bpe, a + avail / bpe);
        done = avail;
      }
    }
    // In place the all-gather lands where the caller reads it: only the answer is to wait for.
    for (let s = 0; s < H - 1 && base === 0; s++) {
      const [a, b] = segment(mod(me - s, H), n, H);
      const total = (b - a) * bpe;
      let done = 0;
      while (done < total) {
        const r = this.received(H - 1 + s, done + bpe - 1, seq, deadline, timedOut);
        if (r < 0) return;
        const avail = r - (r % bpe);
        if (avail <= done) continue;
        emit(a + done / bpe, a + avail / bpe);
        done = avail;
      }
    }
  }
}

// Max and min stay in JS (rare: no SIMD kernel); one function per op and type keeps each loop on one array type.
function max32(into: Float32Array, got: Float32Array, i0: number, i1: number): void {
  for (let i = i0; i < i1; i++) into[i] = Math.max(into[i]!, got[i]!);
}
function max64(into: Float64Array, got: Float64Array, i0: number, i1: number): void {
  for (let i = i0; i < i1; i++) into[i] = Math.max(into[i]!, got[i]!);
}
function min32(into: Float32Array, got: Float32Array, i0: number, i1: number): void {
  for (let i = i0; i < i1; i++) into[i] = Math.min(into[i]!, got[i]!);
}
function min64(into: Float64Array, got: Float64Array, i0: number, i1: number): void {
  for (let i = i0; i < i1; i++) into[i] = Math.min(into[i]!, got[i]!);
}
type Combine = (into: Numeric, got: Numeric, i0: number, i1: number) => void;
const COMBINE = [[max32, max64], [min32, min64]] as unknown as Combine[][];

export interface BridgeRequest {
  op: BridgeOp;
  dtype: BridgeDtype;
  length: number;
  rootHost: number;
  /** Byte offset of the data in the bridge memory: 0 the data region, else the caller's buffer in place. */
  base?: number;
}

/** A failure the main thread reports back to the leader. */
export class BridgeFailure extends Error {
  constructor(message: string, readonly kind: "aborted" | "timeout") {
    super(message);
  }
}

type WaitAsync = (a: Int32Array, index: number, value: number, timeoutMs: number) => { async: boolean; value: Promise<string> | string };
export const waitAsync = (Atomics as unknown as { waitAsync: WaitAsync }).waitAsync;

/** The main thread's side: serves requests one at a time until stopped. */
export class BridgeServer {
  readonly ctrl: Int32Array;
  private readonly msg: Uint8Array;
  private stopped = false;
  private seen: number;

  constructor(readonly buffers: BridgeBuffers, private readonly handle: (req: BridgeRequest) => Promise<void>) {
    this.ctrl = new Int32Array(buffers.control, 0, INTS);
    this.msg = new Uint8Array(buffers.control, INTS * 4, MSG_BYTES);
    this.seen = Atomics.load(this.ctrl, REQ);
    void this.loop();
  }

  stop(): void {
    this.stopped = true;
    Atomics.notify(this.ctrl, REQ);
  }

  private async loop(): Promise<void> {
    const c = this.ctrl;
    while (!this.stopped) {
      if (Atomics.load(c, REQ) === this.seen) {
        const w = waitAsync(c, REQ, this.seen, 1000);
        // The timeout lets stop() end the loop; the timer must not keep the process alive.
        if (w.async) await w.value;
        continue;
      }
      const seq = Atomics.load(c, REQ);
      this.seen = seq;
      const req: BridgeRequest = { op: OP_NAMES[Atomics.load(c, OP)]!, dtype: DTYPES[Atomics.load(c, DTYPE)]!, length: Atomics.load(c, LEN), rootHost: Atomics.load(c, ROOT), base: Atomics.load(c, BASE) >>> 0 };
      let status = ST_OK;
      try {
        await this.handle(req);
      } catch (e) {
        status = e instanceof BridgeFailure && e.kind === "timeout" ? ST_TIMEOUT : ST_ABORTED;
        const text = new TextEncoder().encode(e instanceof Error ? e.message : String(e)).subarray(0, MSG_BYTES);
        this.msg.set(text, 0);
        Atomics.store(c, MSGLEN, text.length);
      }
      Atomics.store(c, STATUS, status);
      Atomics.store(c, RESP, seq);
      Atomics.notify(c, RESP);
      // A leader combining in its wait loop watches RECV_SIG too.
      Atomics.add(c, RECV_SIG, 1);
      Atomics.notify(c, RECV_SIG);
    }
  }
}
