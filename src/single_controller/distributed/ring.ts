// The cross-host part of the collectives, on each host's main thread: hosts
// form a ring (host i sends to i+1 and hears from i-1 over gRPC streams).
// All-reduce is a ring reduce-scatter then all-gather (each host sends about
// 2 (H-1)/H of the buffer, whatever H); broadcast passes the bytes along the
// ring from the root's host; a barrier is an all-reduce of nothing. Every
// message carries (epoch, seq, step, op, length): hosts that disagree fail
// with both sides named, a host that sends nothing within the timeout is
// named, and a lost connection fails every waiting op at once.
import type * as grpc from "@grpc/grpc-js";
import { connect, streamEndReason, type ClusterClient } from "./grpc_link.js";
import { BridgeFailure, type BridgeRequest } from "./bridge.js";
import { decodeFrame, encodeFrame } from "./wire.js";
import { logger } from "../../utils/logger.js";

export interface PeerInfo {
  nodeRank: number;
  name: string;
  /** host:port of its ring server. */
  addr: string;
}

interface RingHead {
  t: "hello" | "data";
  from?: number;
  e: number;
  s: number;
  k: number;
  op: string;
  n: number;
}

interface Waiter {
  resolve(v: ArrayBufferView): void;
  reject(e: Error): void;
  timer: NodeJS.Timeout;
}

type Numeric = Float32Array | Float64Array;

export function describePeer(p: PeerInfo): string {
  return `host '${p.name}' (node ${p.nodeRank}, ${p.addr})`;
}

export class Ring {
  private epoch = 0;
  private seq = 0;
  private broken: string | undefined;
  /** A lost host never comes back: every later op fails with this. */
  private lost: string | undefined;
  private client: ClusterClient | undefined;
  /** The stream the successor opened to this host's server: this host writes to it. */
  private succ: grpc.ServerDuplexStream<Buffer, Buffer> | undefined;
  private readonly inbox = new Map<string, { head: RingHead; value: ArrayBufferView }>();
  private readonly waiters = new Map<string, Waiter>();
  private succReady: (() => void) | undefined;
  private readonly succConnected: Promise<void>;

  constructor(private readonly me: number, private readonly peers: PeerInfo[], private readonly token: string, private readonly timeoutMs: number) {
    this.succConnected = new Promise((resolve) => (this.succReady = resolve));
  }

  private get size(): number {
    return this.peers.length;
  }
  private mod(i: number): number {
    return ((i % this.size) + this.size) % this.size;
  }
  private get pred(): PeerInfo {
    return this.peers[this.mod(this.me - 1)]!;
  }
  private get next(): PeerInfo {
    return this.peers[this.mod(this.me + 1)]!;
  }

  /**
   * Connects to the predecessor's ring server and waits until the successor has connected to ours.
   * Data flows from server to client (a host writes to the stream its successor opened), because
   * grpc-js widens the HTTP/2 receive window on the client side only (64 KiB otherwise).
   */
  async open(): Promise<void> {
    if (this.size === 1) return;
    this.client = connect(this.pred.addr, this.token);
    await this.client.ready(this.timeoutMs);
    const stream = this.client.ring();
    stream.on("data", (buf: Buffer) => this.receive(buf));
    stream.on("error", (e: unknown) => this.lose(this.pred, streamEndReason(e)));
    stream.on("end", () => this.lose(this.pred, "the connection closed"));
    stream.write(encodeFrame({ t: "hello", from: this.me, e: 0, s: 0, k: 0, op: "", n: 0 } satisfies RingHead));
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new Error(`${describePeer(this.next)} did not open its ring connection to this host within ${this.timeoutMs / 1000} s`)), this.timeoutMs);
    });
    try {
      await Promise.race([this.succConnected, timeout]);
    } finally {
      clearTimeout(timer);
    }
  }

  /** A stream opened to this host's ring server (by the successor, which this host sends to). */
  attach(stream: grpc.ServerDuplexStream<Buffer, Buffer>): void {
    let hello = false;
    stream.on("data", (buf: Buffer) => {
      let head: RingHead;
      try {
        head = decodeFrame<RingHead>(buf).head;
      } catch (e) {
        this.lose(this.next, `a malformed frame: ${(e as Error).message}`);
        return;
      }
      if (hello || head.t !== "hello") return;
      if (head.from !== this.next.nodeRank) {
        stream.emit("error", { code: 9, details: `node ${head.from} is not this host's ring successor (node ${this.next.nodeRank})` });
        return;
      }
      hello = true;
      this.succ = stream;
      this.succReady?.();
    });
    const lost = (reason: string) => hello && this.lose(this.next, reason);
    stream.on("error", (e: unknown) => lost(streamEndReason(e)));
    stream.on("cancelled", () => lost("the connection dropped (the agent process died or its host is unreachable)"));
    stream.on("end", () => {
      lost("the connection closed");
      stream.end();
    });
  }

  private receive(buf: Buffer): void {
    let frame;
    try {
      frame = decodeFrame<RingHead>(buf);
    } catch (e) {
      this.lose(this.pred, `a malformed frame: ${(e as Error).message}`);
      return;
    }
    if (frame.head.t === "data") this.deliver(frame.head, frame.value as ArrayBufferView);
  }

  /** A new epoch (the driver's first call after a failed one): forget the failed state. */
  reset(epoch: number): void {
    if (epoch <= this.epoch) return;
    this.epoch = epoch;
    this.seq = 0;
    this.broken = undefined;
    for (const k of [...this.inbox.keys()]) if (Number(k.split(":")[0]) < epoch) this.inbox.delete(k);
  }

  /** Fails the op in progress and every later one of this epoch. */
  abort(reason: string, epoch = this.epoch): void {
    if (epoch < this.epoch || this.broken !== undefined) return;
    this.broken = reason;
    this.failWaiters(reason, "aborted");
  }

  close(): void {
    this.lost ??= "this host is shutting down";
    this.failWaiters(this.lost, "aborted");
    this.succ?.end();
    this.client?.close();
  }

  private lose(peer: PeerInfo, reason: string): void {
    if (this.lost !== undefined) return;
    this.lost = `${describePeer(peer)} lost: ${reason}`;
    logger().error({ peer: peer.name, node: peer.nodeRank, reason }, "ring connection lost");
    this.failWaiters(this.lost, "aborted");
  }

  private failWaiters(reason: string, kind: "aborted" | "timeout"): void {
    for (const [k, w] of this.waiters) {
      clearTimeout(w.timer);
      w.reject(new BridgeFailure(reason, kind));
      this.waiters.delete(k);
    }
  }

  private deliver(head: RingHead, value: ArrayBufferView): void {
    if (head.e < this.epoch) return;
    const key = `${head.e}:${head.s}:${head.k}`;
    const w = this.waiters.get(key);
    if (!w) {
      this.inbox.set(key, { head, value });
      return;
    }
    this.waiters.delete(key);
    clearTimeout(w.timer);
    try {
      w.resolve(this.checked(head, value));
    } catch (e) {
      w.reject(e as Error);
    }
  }

  private expect: { op: string; n: number } | undefined;

  private checked(head: RingHead, value: ArrayBufferView): ArrayBufferView {
    const mine = this.expect!;
    if (head.op !== mine.op || head.n !== mine.n) {
      throw new BridgeFailure(
        `hosts disagree on collective #${head.s}: ${describePeer(this.pred)} did ${head.op} of ${head.n} but this host (node ${this.me}) did ${mine.op} of ${mine.n}`,
        "aborted",
      );
    }
    return value;
  }

  private usable(): void {
    if (this.lost !== undefined) throw new BridgeFailure(this.lost, "aborted");
    if (this.broken !== undefined) throw new BridgeFailure(this.broken, "aborted");
  }

  private send(step: number, value: ArrayBufferView): void {
    this.usable();
    this.succ!.write(encodeFrame({ t: "data", e: this.epoch, s: this.seq, k: step, op: this.expect!.op, n: this.expect!.n } satisfies RingHead, value));
  }

  private recv(step: number): Promise<ArrayBufferView> {
    this.usable();
    const key = `${this.epoch}:${this.seq}:${step}`;
    const got = this.inbox.get(key);
    if (got) {
      this.inbox.delete(key);
      try {
        return Promise.resolve(this.checked(got.head, got.value));
      } catch (e) {
        return Promise.reject(e as Error);
      }
    }
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.waiters.delete(key);
        reject(new BridgeFailure(
          `collective ${this.expect!.op} timed out after ${this.timeoutMs / 1000} s: ${describePeer(this.pred)} sent nothing to node ${this.me} (it may have failed or be stuck)`, "timeout",
        ));
      }, this.timeoutMs);
      this.waiters.set(key, { resolve, reject, timer });
    });
  }

  /** Serves one bridge request from this host's leader rank. */
  async handle(req: BridgeRequest): Promise<void> {
    this.seq += 1;
    if (req.op === "broadcast") {
      this.expect = { op: `broadcast from node ${req.rootHost}`, n: req.length };
      await this.broadcast(req.data.subarray(0, req.length), req.rootHost);
      return;
    }
    const dt = req.dtype === "float64" ? "float64" : "float32";
    this.expect = { op: `${req.op === "barrier" ? "barrier" : `allReduce ${req.op} ${dt}`}`, n: req.length };
    const view: Numeric = dt === "float64" ? new Float64Array(req.data.buffer, 0, req.length) : new Float32Array(req.data.buffer, 0, req.length);
    await this.allReduce(view, req.op);
  }

  private async allReduce(view: Numeric, op: string): Promise<void> {
    const H = this.size, n = view.length;
    if (H === 1) return;
    const start = (i: number) => Math.floor((i * n) / H);
    const seg = (i: number) => view.subarray(start(i), start(i + 1));
    const combine = op === "max" ? Math.max : op === "min" ? Math.min : (a: number, b: number) => a + b;
    for (let s = 0; s < H - 1; s++) {
      this.send(s, seg(this.mod(this.me - s)).slice());
      const got = (await this.recv(s)) as Numeric;
      const into = seg(this.mod(this.me - s - 1));
      if (got.length !== into.length) throw new BridgeFailure(`ring: segment of ${got.length} elements where ${into.length} were expected`, "aborted");
      for (let i = 0; i < into.length; i++) into[i] = combine(into[i]!, got[i]!);
    }
    for (let s = 0; s < H - 1; s++) {
      this.send(H - 1 + s, seg(this.mod(this.me + 1 - s)).slice());
      const got = (await this.recv(H - 1 + s)) as Numeric;
      view.set(got, start(this.mod(this.me - s)));
    }
  }

  private async broadcast(bytes: Uint8Array, rootHost: number): Promise<void> {
    if (this.size === 1) return;
    if (this.me === rootHost) {
      this.send(0, bytes.slice());
      return;
    }
    const got = (await this.recv(0)) as Uint8Array;
    bytes.set(got);
    if (this.mod(this.me + 1) !== rootHost) this.send(0, got);
  }
}
