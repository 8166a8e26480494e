// The hand-off between a host's leader rank thread (local rank 0, blocked in a
// collective) and the host's main thread, which owns the network. The leader
// writes a chunk into shared memory and waits; the main thread runs the
// cross-host part (ring.ts) and writes the result back. Control words:
// request seq, response seq, op, dtype, length, root host, status, reason length.
import { CollectiveError } from "../errors.js";

const REQ = 0, RESP = 1, OP = 2, DTYPE = 3, LEN = 4, ROOT = 5, STATUS = 6, MSGLEN = 7, INTS = 8;
const MSG_BYTES = 2048;
const ST_OK = 0, ST_ABORTED = 1, ST_TIMEOUT = 2;

export const BRIDGE_OPS = { barrier: 1, broadcast: 2, sum: 10, max: 12, min: 13 } as const;
export type BridgeOp = keyof typeof BRIDGE_OPS;
const OP_NAMES = Object.fromEntries(Object.entries(BRIDGE_OPS).map(([k, v]) => [v, k])) as Record<number, BridgeOp>;
const DTYPES = ["float32", "float64", "bytes"] as const;
export type BridgeDtype = (typeof DTYPES)[number];

export interface BridgeBuffers {
  control: SharedArrayBuffer;
  data: SharedArrayBuffer;
}

/** Default data capacity: 16 MiB a chunk (larger buffers cross in several requests; 4 MiB measured slower). */
export const DEFAULT_BRIDGE_BYTES = 16 << 20;

export function createBridgeBuffers(dataBytes = DEFAULT_BRIDGE_BYTES): BridgeBuffers {
  if (!Number.isInteger(dataBytes) || dataBytes < 64 || dataBytes % 8 !== 0) throw new Error(`bridge: data bytes must be a multiple of 8 >= 64, got ${dataBytes}`);
  return { control: new SharedArrayBuffer(INTS * 4 + MSG_BYTES), data: new SharedArrayBuffer(dataBytes) };
}

/** The leader thread's side: blocking requests. */
export class BridgeClient {
  private readonly ctrl: Int32Array;
  private readonly msg: Uint8Array;
  private readonly bytes: Uint8Array;
  constructor(buffers: BridgeBuffers, private readonly timeoutMs: number) {
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
    this.bytes.set(chunk, 0);
    const c = this.ctrl;
    Atomics.store(c, OP, BRIDGE_OPS[op]);
    Atomics.store(c, DTYPE, DTYPES.indexOf(dtype));
    Atomics.store(c, LEN, length);
    Atomics.store(c, ROOT, rootHost);
    const seq = Atomics.add(c, REQ, 1) + 1;
    Atomics.notify(c, REQ);
    const deadline = Date.now() + this.timeoutMs;
    for (;;) {
      const resp = Atomics.load(c, RESP);
      if (resp === seq) break;
      const left = deadline - Date.now();
      if (left <= 0) {
        throw new CollectiveError(`collective ${op} across hosts: this host's network side gave no answer within ${this.timeoutMs / 1000} s`, "timeout");
      }
      Atomics.wait(c, RESP, resp, Math.min(left, 1000));
    }
    const status = Atomics.load(c, STATUS);
    if (status !== ST_OK) {
      const reason = new TextDecoder().decode(this.msg.slice(0, Atomics.load(c, MSGLEN)));
      throw new CollectiveError(reason, status === ST_TIMEOUT ? "timeout" : "aborted");
    }
    chunk.set(this.bytes.subarray(0, chunk.length));
  }
}

export interface BridgeRequest {
  op: BridgeOp;
  dtype: BridgeDtype;
  length: number;
  rootHost: number;
  /** The shared data region (the op reads and writes it in place). */
  data: Uint8Array;
}

/** A failure the main thread reports back to the leader. */
export class BridgeFailure extends Error {
  constructor(message: string, readonly kind: "aborted" | "timeout") {
    super(message);
  }
}

type WaitAsync = (a: Int32Array, index: number, value: number, timeoutMs: number) => { async: boolean; value: Promise<string> | string };

/** The main thread's side: serves requests one at a time until stopped. */
export class BridgeServer {
  private readonly ctrl: Int32Array;
  private readonly msg: Uint8Array;
  private readonly data: Uint8Array;
  private stopped = false;
  private seen: number;

  constructor(buffers: BridgeBuffers, private readonly handle: (req: BridgeRequest) => Promise<void>) {
    this.ctrl = new Int32Array(buffers.control, 0, INTS);
    this.msg = new Uint8Array(buffers.control, INTS * 4, MSG_BYTES);
    this.data = new Uint8Array(buffers.data);
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
        const w = (Atomics as unknown as { waitAsync: WaitAsync }).waitAsync(c, REQ, this.seen, 1000);
        // The timeout lets stop() end the loop; the timer must not keep the process alive.
        if (w.async) await w.value;
        continue;
      }
      const seq = Atomics.load(c, REQ);
      this.seen = seq;
      const req: BridgeRequest = {
        op: OP_NAMES[Atomics.load(c, OP)]!, dtype: DTYPES[Atomics.load(c, DTYPE)]!, length: Atomics.load(c, LEN), rootHost: Atomics.load(c, ROOT), data: this.data,
      };
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
    }
  }
}
