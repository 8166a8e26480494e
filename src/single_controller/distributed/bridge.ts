// The hand-off between a host's leader rank thread (local rank 0, blocked in a
// collective) and the host's main thread, which owns the sockets. The leader
// writes a chunk into the shared data region and posts a request; the main thread
// runs the ring (ring.ts): it sends straight out of the data region and has the
// kernel read the neighbour's bytes straight into the shared receive region; the
// leader thread, waiting anyway, combines each received piece into the data region
// as it lands (so the main thread, which also serves the gRPC control link and its
// keepalives, does no arithmetic), and the main thread forwards combined pieces on.
// Control words: request/response seq, op, dtype, length, root host, status, reason
// length, then two signal words and, per reduce-scatter step, bytes received (main
// thread) and bytes combined (leader).
import { CollectiveError } from "../errors.js";

const REQ = 0, RESP = 1, OP = 2, DTYPE = 3, LEN = 4, ROOT = 5, STATUS = 6, MSGLEN = 7;
/** Bumped by the main thread whenever bytes arrive / by the leader whenever it combined some. */
export const RECV_SIG = 8, COMB_SIG = 9;
/** A ring of H hosts has H-1 reduce-scatter steps; this many hosts at most. */
export const MAX_HOSTS = 1024;
export const RECV0 = 16, COMB0 = RECV0 + MAX_HOSTS;
const INTS = COMB0 + MAX_HOSTS;
const MSG_BYTES = 2048;
const ST_OK = 0, ST_ABORTED = 1, ST_TIMEOUT = 2;
/** Granularity of the leader's progress signals to the main thread. */
const WAKE_BYTES = 1 << 20;

export const BRIDGE_OPS = { barrier: 1, broadcast: 2, sum: 10, max: 12, min: 13 } as const;
export type BridgeOp = keyof typeof BRIDGE_OPS;
const OP_NAMES = Object.fromEntries(Object.entries(BRIDGE_OPS).map(([k, v]) => [v, k])) as Record<number, BridgeOp>;
const DTYPES = ["float32", "float64", "bytes"] as const;
export type BridgeDtype = (typeof DTYPES)[number];

export interface BridgeBuffers {
  control: SharedArrayBuffer;
  /** The chunk being reduced, in place. */
  data: SharedArrayBuffer;
  /** Where the predecessor's reduce-scatter bytes land (two halves, by step parity). */
  recv: SharedArrayBuffer;
}

/** Default data capacity: 64 MiB a request (larger buffers cross in several requests). */
export const DEFAULT_BRIDGE_BYTES = 64 << 20;

export function createBridgeBuffers(dataBytes = DEFAULT_BRIDGE_BYTES): BridgeBuffers {
  if (!Number.isInteger(dataBytes) || dataBytes < 64 || dataBytes % 8 !== 0) throw new Error(`bridge: data bytes must be a multiple of 8 >= 64, got ${dataBytes}`);
  return { control: new SharedArrayBuffer(INTS * 4 + MSG_BYTES), data: new SharedArrayBuffer(dataBytes), recv: new SharedArrayBuffer(dataBytes + 1024) };
}

/** Segment i of n elements split over H hosts: [start, end). */
export function segment(i: number, n: number, H: number): [number, number] {
  return [Math.floor((i * n) / H), Math.floor(((i + 1) * n) / H)];
}

export const mod = (i: number, H: number): number => ((i % H) + H) % H;

/** Byte offset of the receive half for reduce-scatter step s. */
export function recvHalf(buffers: BridgeBuffers, s: number): number {
  return s % 2 === 0 ? 0 : (buffers.recv.byteLength / 2) & ~7;
}

type Numeric = Float32Array | Float64Array;

/** The leader thread's side: blocking requests. */
export class BridgeClient {
  private readonly ctrl: Int32Array;
  private readonly msg: Uint8Array;
  private readonly bytes: Uint8Array;
  constructor(private readonly buffers: BridgeBuffers, private readonly timeoutMs: number, private readonly host: { me: number; hosts: number }) {
    this.ctrl = new Int32Array(buffers.control, 0, INTS);
    this.msg = new Uint8Array(buffers.control, INTS * 4, MSG_BYTES);
    this.bytes = new Uint8Array(buffers.data);
  }

  get capacityBytes(): number {
    return this.bytes.length;
  }

  /** Runs one cross-host op on `chunk` (at most capacityBytes) in place. */
  request(op: BridgeOp, dtype: BridgeDtype, chunk: Uint8Array, length: number, rootHost = 0): void {
    if (chunk.length > this.bytes.length) throw new Error(`bridge: chunk of ${chunk.length} bytes exceeds ${this.bytes.length}`);
    const { me, hosts: H } = this.host;
    // A host that only receives a broadcast has nothing to hand over.
    if (op !== "broadcast" || rootHost === me) this.bytes.set(chunk, 0);
    const c = this.ctrl;
    const reduce = op === "sum" || op === "max" || op === "min";
    // Progress words belong to this request from here on (the main thread writes RECV only while serving it).
    if (reduce) for (let s = 0; s < H - 1; s++) Atomics.store(c, COMB0 + s, 0), Atomics.store(c, RECV0 + s, 0);
    Atomics.store(c, OP, BRIDGE_OPS[op]);
    Atomics.store(c, DTYPE, DTYPES.indexOf(dtype));
    Atomics.store(c, LEN, length);
    Atomics.store(c, ROOT, rootHost);
    const seq = Atomics.add(c, REQ, 1) + 1;
    Atomics.notify(c, REQ);
    const deadline = Date.now() + this.timeoutMs;
    const timedOut = () => new CollectiveError(`collective ${op} across hosts: this host's network side gave no answer within ${this.timeoutMs / 1000} s`, "timeout");
    if (reduce && H > 1 && length > 0) this.combineSteps(op, dtype, length, seq, deadline, timedOut);
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
    if (op !== "barrier") chunk.set(this.bytes.subarray(0, chunk.length));
  }

  /** The reduce-scatter's arithmetic: combines each piece of the predecessor's segment as it lands. */
  private combineSteps(op: BridgeOp, dtype: BridgeDtype, n: number, seq: number, deadline: number, timedOut: () => Error): void {
    const { me, hosts: H } = this.host;
    const c = this.ctrl;
    const is64 = dtype === "float64", bpe = is64 ? 8 : 4;
    const data: Numeric = is64 ? new Float64Array(this.buffers.data, 0, n) : new Float32Array(this.buffers.data, 0, n);
    for (let s = 0; s < H - 1; s++) {
      const [a, b] = segment(mod(me - s - 1, H), n, H);
      const total = (b - a) * bpe;
      const half = recvHalf(this.buffers, s);
      const got: Numeric = is64 ? new Float64Array(this.buffers.recv, half, b - a) : new Float32Array(this.buffers.recv, half, b - a);
      const into = data.subarray(a, b);
      let done = 0;
      while (done < total) {
        const sig = Atomics.load(c, RECV_SIG);
        const r = Atomics.load(c, RECV0 + s);
        const avail = r - (r % bpe);
        if (avail > done) {
          const i0 = done / bpe, i1 = avail / bpe;
          if (op === "sum") for (let i = i0; i < i1; i++) into[i] = into[i]! + got[i]!;
          else if (op === "max") for (let i = i0; i < i1; i++) into[i] = Math.max(into[i]!, got[i]!);
          else for (let i = i0; i < i1; i++) into[i] = Math.min(into[i]!, got[i]!);
          // The main thread sends pieces of a MiB or more: wake it when one may have completed, not per read.
          const crossed = Math.floor(avail / WAKE_BYTES) > Math.floor(done / WAKE_BYTES) || avail === total;
          done = avail;
          Atomics.store(c, COMB0 + s, done);
          if (crossed) {
            Atomics.add(c, COMB_SIG, 1);
            Atomics.notify(c, COMB_SIG);
          }
          continue;
        }
        if (Atomics.load(c, RESP) === seq) return; // the network side failed (or finished): its status says which
        const left = deadline - Date.now();
        if (left <= 0) throw timedOut();
        Atomics.wait(c, RECV_SIG, sig, Math.min(left, 1000));
      }
    }
  }
}

export interface BridgeRequest {
  op: BridgeOp;
  dtype: BridgeDtype;
  length: number;
  rootHost: number;
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
      const req: BridgeRequest = { op: OP_NAMES[Atomics.load(c, OP)]!, dtype: DTYPES[Atomics.load(c, DTYPE)]!, length: Atomics.load(c, LEN), rootHost: Atomics.load(c, ROOT) };
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
