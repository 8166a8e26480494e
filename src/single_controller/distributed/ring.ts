// The cross-host part of the collectives, on each host's main thread: hosts form
// a ring over plain TCP (data_link.ts; host i writes to i+1 and reads from i-1).
// All-reduce is a ring reduce-scatter then all-gather (each host sends about
// 2 (H-1)/H of the buffer, whatever H), cut into pieces (`chunkBytes`) that are
// pipelined: a piece is sent on as soon as it is combined (by the leader rank
// thread, bridge.ts) or received, so several are in flight on every link and
// nothing waits for a whole segment. Sends go straight out of the shared data
// region (or the leader caller's own buffer in the bridge memory, req.base) and
// receives land straight in the shared regions, so a piece is copied once per
// hop, by the combine. Broadcast passes the bytes along the ring from the
// root's host; a barrier is an all-reduce of nothing. Every frame carries
// (epoch, seq, step, op, count): hosts that disagree fail with both sides named, a
// host that sends nothing within the timeout is named, and a lost connection
// fails every waiting op at once.
import type { Socket } from "node:net";
import {
  BridgeFailure, COMB0, COMB_SIG, COPIED, LEADER_WAKE_BYTES, RECV0, RECV_SIG, dataRegion, mod, recvHalf, recvRegion, segment, waitAsync,
  type BridgeBuffers, type BridgeDtype, type BridgeOp, type BridgeRequest,
} from "./bridge.js";
import { DataClient, encodeHead, type FrameHead } from "./data_link.js";
import { logger } from "../../utils/logger.js";

export interface PeerInfo {
  nodeRank: number;
  name: string;
  /** host:port of its gRPC-free ring data server. */
  addr: string;
}

export function describePeer(p: PeerInfo): string {
  return `host '${p.name}' (node ${p.nodeRank}, ${p.addr})`;
}

/** Pipeline piece: 4 MiB (several in flight on a link; 1 MiB and 256 KiB measured slower on 256 MiB). */
export const DEFAULT_CHUNK_BYTES = 4 << 20;
/** The leader thread is woken per this many bytes received (or a frame's end), not per read. */
const WAKE_BYTES = 256 << 10;

const OPS: BridgeOp[] = ["barrier", "broadcast", "sum", "max", "min"];
const DTS: BridgeDtype[] = ["float32", "float64", "bytes"];
const opCode = (op: BridgeOp, dt: BridgeDtype, root: number) => OPS.indexOf(op) | (DTS.indexOf(dt) << 4) | (root << 8);
function describeOp(code: number, n: number): string {
  const op = OPS[code & 15] ?? "?", dt = DTS[(code >> 4) & 15] ?? "?";
  if (op === "barrier") return `barrier of ${n}`;
  if (op === "broadcast") return `broadcast from node ${code >>> 8} of ${n}`;
  return `allReduce ${op} ${dt} of ${n}`;
}

function splitHostPort(addr: string): [string, number] {
  const m = /^\[?([^\]]+?)\]?:(\d+)$/.exec(addr);
  if (!m) throw new Error(`ring address '${addr}' is not HOST:PORT`);
  return [m[1]!, Number(m[2])];
}

/** The least frame sent while more of a step is still to come (the leader signals progress per MiB). */
const MIN_PIECE = LEADER_WAKE_BYTES;

interface Send {
  off: number;
  len: number;
  avail: () => number;
}

/** One collective in progress on this host. */
interface Active {
  e: number;
  s: number;
  code: number;
  n: number;
  bpe: number;
  /** Per step: expected payload bytes, bytes received, whether its first frame came. */
  expect: number[];
  got: number[];
  /** Per step: bytes received when the leader was last woken. */
  woke: number[];
  seen: boolean[];
  /** Per step: the place its payload goes (byte offset in data or recv). */
  dest: ((h: FrameHead) => Uint8Array)[];
  finished: () => void;
  fail: (e: Error) => void;
  timer: NodeJS.Timeout;
}

export class Ring {
  private epoch = 0;
  private seq = 0;
  private broken: string | undefined;
  /** A lost host never comes back: every later op fails with this. */
  private lost: string | undefined;
  private client: DataClient | undefined;
  /** The socket the successor opened to this host's data server: this host writes to it. */
  private succ: Socket | undefined;
  private succReady: (() => void) | undefined;
  private readonly succConnected: Promise<void>;
  private active: Active | undefined;
  private readonly data: Uint8Array;
  private readonly recv: Uint8Array;
  private readonly ctrl: Int32Array;
  /** Wake whoever waits for received bytes. */
  private kicks: (() => void)[] = [];

  constructor(
    private readonly me: number, private readonly peers: PeerInfo[], private readonly auth: { token: string; runId: string },
    private readonly timeoutMs: number, private readonly buffers: BridgeBuffers, private readonly chunkBytes = DEFAULT_CHUNK_BYTES,
  ) {
    this.succConnected = new Promise((resolve) => (this.succReady = resolve));
    this.data = dataRegion(buffers);
    this.recv = recvRegion(buffers);
    this.ctrl = new Int32Array(buffers.control);
    if (!(chunkBytes >= 64 && chunkBytes % 8 === 0)) throw new Error(`ring: chunk bytes must be a multiple of 8 >= 64, got ${chunkBytes}`);
  }

  private get size(): number {
    return this.peers.length;
  }
  private get pred(): PeerInfo {
    return this.peers[mod(this.me - 1, this.size)]!;
  }
  private get next(): PeerInfo {
    return this.peers[mod(this.me + 1, this.size)]!;
  }

  /** Dials the predecessor's data server and waits until the successor has dialled ours. */
  async open(): Promise<void> {
    if (this.size === 1) return;
    const [host, port] = splitHostPort(this.pred.addr);
    this.client = new DataClient(host, port, { ...this.auth, from: this.me, to: this.pred.nodeRank }, {
      place: (h) => this.place(h),
      progress: (h, total) => this.progress(h, total),
    }, (reason) => this.lose(this.pred, reason));
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new Error(`the ring did not connect within ${this.timeoutMs / 1000} s (${describePeer(this.pred)} -> this host -> ${describePeer(this.next)})`)), this.timeoutMs);
    });
    try {
      await Promise.race([this.client.ready, timeout]).catch((e: Error) => {
        throw new Error(`cannot open the ring link to ${describePeer(this.pred)}: ${e.message}`);
      });
      await Promise.race([this.succConnected, timeout]);
    } finally {
      clearTimeout(timer);
    }
  }

  /** An authenticated socket dialled to this host's data server. */
  attach(sock: Socket, from: number, to: number): void {
    if (this.size === 1 || from !== this.next.nodeRank || to !== this.me || this.succ) {
      logger().warn({ peer: `${sock.remoteAddress}:${sock.remotePort}`, from, to }, `refused a ring link: not this host's successor (node ${this.next.nodeRank} -> node ${this.me})`);
      sock.destroy();
      return;
    }
    this.succ = sock;
    sock.on("error", (e) => this.lose(this.next, e.message));
    sock.on("close", () => this.lose(this.next, "the connection closed (the agent process died or its host is unreachable)"));
    this.succReady?.();
  }

  /** A new epoch (the driver's first call after a failed one): forget the failed state. */
  reset(epoch: number): void {
    if (epoch <= this.epoch) return;
    this.epoch = epoch;
    this.seq = 0;
    this.broken = undefined;
    this.client?.resume();
  }

  /** Fails the op in progress and every later one of this epoch. */
  abort(reason: string, epoch = this.epoch): void {
    if (epoch < this.epoch || this.broken !== undefined) return;
    this.broken = reason;
    this.active?.fail(new BridgeFailure(reason, "aborted"));
  }

  close(): void {
    this.lost ??= "this host is shutting down";
    this.active?.fail(new BridgeFailure(this.lost, "aborted"));
    this.succ?.destroy();
    this.client?.close();
  }

  private lose(peer: PeerInfo, reason: string): void {
    if (this.lost !== undefined) return;
    this.lost = `${describePeer(peer)} lost: ${reason}`;
    logger().error({ peer: peer.name, node: peer.nodeRank, reason }, "ring connection lost");
    this.active?.fail(new BridgeFailure(this.lost, "aborted"));
  }

  private usable(): void {
    if (this.lost !== undefined) throw new BridgeFailure(this.lost, "aborted");
    if (this.broken !== undefined) throw new BridgeFailure(this.broken, "aborted");
  }

  /** Where an arriving frame's payload goes; null holds it until its collective starts here. */
  private place(h: FrameHead): Uint8Array | null | "discard" {
    if (h.e < this.epoch) return "discard";
    const a = this.active;
    if (h.e > this.epoch || !a || h.s > a.s) return null;
    if (h.s < a.s) return "discard";
    if (h.code !== a.code || h.n !== a.n) {
      a.fail(new BridgeFailure(
        `hosts disagree on collective #${h.s}: ${describePeer(this.pred)} did ${describeOp(h.code, h.n)} but this host (node ${this.me}) did ${describeOp(a.code, a.n)}`, "aborted",
      ));
      return "discard";
    }
    if (h.k >= a.expect.length || h.off + h.len > a.expect[h.k]!) {
      a.fail(new BridgeFailure(`ring: a frame for step ${h.k} at ${h.off}+${h.len} outside the ${a.expect[h.k] ?? 0} bytes expected`, "aborted"));
      return "discard";
    }
    return a.dest[h.k]!(h);
  }

  private progress(h: FrameHead, total: number): void {
    const a = this.active;
    if (!a || h.e !== a.e || h.s !== a.s) return;
    a.got[h.k] = h.off + total;
    a.seen[h.k] = true;
    a.timer.refresh();
    const H = this.size;
    // Reduces: the leader combines reduce-scatter pieces and copies out all-gather pieces as they land.
    if ((a.code & 15) >= 2 && h.k < 2 * (H - 1) && (total === h.len || a.got[h.k]! - (a.woke[h.k] ?? 0) >= WAKE_BYTES)) {
      a.woke[h.k] = a.got[h.k]!;
      Atomics.store(this.ctrl, RECV0 + h.k, a.got[h.k]!);
      Atomics.add(this.ctrl, RECV_SIG, 1);
      Atomics.notify(this.ctrl, RECV_SIG);
    }
    this.kick();
  }

  private kick(): void {
    const ks = this.kicks;
    this.kicks = [];
    for (const k of ks) k();
  }

  private kicked(): Promise<void> {
    return new Promise((resolve) => this.kicks.push(resolve));
  }

  /** Serves one bridge request from this host's leader rank. */
  async handle(req: BridgeRequest): Promise<void> {
    this.seq += 1;
    this.usable();
    if (this.size === 1) return;
    const H = this.size, me = this.me;
    const isBcast = req.op === "broadcast", isBarrier = req.op === "barrier";
    const bpe = isBcast || isBarrier ? 1 : req.dtype === "float64" ? 8 : 4;
    const n = isBarrier ? 0 : req.length;
    // A reduce on a buffer the leader's caller filled in place: send from it and gather into it.
    const data = req.base ? new Uint8Array(this.buffers.memory.buffer, req.base, n * bpe) : this.data;
    const seg = (i: number) => segment(mod(i, H), n, H);
    const bytes = (i: number) => (seg(i)[1] - seg(i)[0]) * bpe;
    const at = (i: number) => seg(i)[0] * bpe;
    // Per step k: what this host sends (offset in data, bytes) and how many of those bytes are ready (-1: none yet).
    const sends: Send[] = [];
    const expect: number[] = [], dest: ((h: FrameHead) => Uint8Array)[] = [];
    const combined = (s: number) => () => Atomics.load(this.ctrl, COMB0 + s);
    // Step 0 sends this host's own segment as the leader copies it in.
    const copied = () => Atomics.load(this.ctrl, COPIED);
    let a!: Active;
    const received = (k: number) => () => (a.seen[k]! ? a.got[k]! : -1);
    const all = () => Infinity;
    if (isBcast) {
      const root = req.rootHost;
      if (me !== root) {
        expect.push(n);
        dest.push((h) => this.data.subarray(h.off, h.off + h.len));
      }
      if (me === root) sends.push({ off: 0, len: n, avail: all });
      else if (mod(me + 1, H) !== root) sends.push({ off: 0, len: n, avail: received(0) });
    } else {
      for (let s = 0; s < H - 1; s++) {
        const half = recvHalf(this.buffers, s);
        expect.push(bytes(me - s - 1));
        dest.push((h) => this.recv.subarray(half + h.off, half + h.off + h.len));
        sends.push({ off: at(me - s), len: bytes(me - s), avail: s === 0 ? copied : combined(s - 1) });
      }
      for (let s = 0; s < H - 1; s++) {
        const base = at(me - s);
        expect.push(bytes(me - s));
        dest.push((h) => data.subarray(base + h.off, base + h.off + h.len));
        sends.push({ off: at(me + 1 - s), len: bytes(me + 1 - s), avail: s === 0 ? combined(H - 2) : received(H - 1 + s - 1) });
      }
      if (isBarrier) for (let k = 0; k < sends.length; k++) sends[k]!.avail = k === 0 ? all : received(k - 1);
    }
    const code = opCode(req.op, req.dtype, isBcast ? req.rootHost : 0);
    const what = describeOp(code, n);
    const done = new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => a.fail(new BridgeFailure(
        `collective ${what} timed out after ${this.timeoutMs / 1000} s: ${describePeer(this.pred)} sent nothing to node ${me} (it may have failed or be stuck)`, "timeout",
      )), this.timeoutMs);
      let over = false;
      a = {
        e: this.epoch, s: this.seq, code, n, bpe, expect, got: expect.map(() => 0), woke: expect.map(() => 0), seen: expect.map(() => false), dest, timer,
        finished: () => {
          if (!over) (over = true), clearTimeout(timer), resolve();
        },
        fail: (e) => {
          if (!over) (over = true), clearTimeout(timer), reject(e);
        },
      };
    });
    const failed = done.then(() => false, () => true);
    this.active = a;
    try {
      this.client!.resume();
      const flushed = this.sendAll(a, data, sends, failed);
      await Promise.race([done.catch(() => undefined), this.allReceived(a, failed)]);
      await flushed;
      a.finished();
      await done;
    } finally {
      this.active = undefined;
      this.kick();
    }
  }

  private async waitProgress(failed: Promise<boolean>): Promise<void> {
    const w = waitAsync(this.ctrl, COMB_SIG, Atomics.load(this.ctrl, COMB_SIG), 1000);
    await Promise.race([w.async ? w.value : Promise.resolve(), this.kicked(), failed]);
  }

  private async allReceived(a: Active, failed: Promise<boolean>): Promise<void> {
    for (;;) {
      if (a.expect.every((x, k) => a.got[k] === x && a.seen[k])) return;
      if (await Promise.race([this.kicked().then(() => false), failed])) return;
    }
  }

  /**
   * Writes every step's bytes as they become ready, in frames of up to chunkBytes and (but for a
   * step's tail) at least MIN_PIECE, so the first bytes leave as soon as a MiB is copied or combined;
   * resolves when the kernel has taken the last byte.
   */
  private async sendAll(a: Active, data: Uint8Array, sends: Send[], failed: Promise<boolean>): Promise<void> {
    let outstanding = 0, allQueued = false;
    let drained: () => void = () => undefined;
    const flushed = new Promise<void>((resolve) => (drained = resolve));
    const sock = this.succ!;
    const wrote = () => {
      if (--outstanding === 0 && allQueued) drained();
    };
    let isFailed = false;
    void failed.then((f) => (isFailed = f));
    const least = Math.min(this.chunkBytes, MIN_PIECE);
    for (let k = 0; k < sends.length; k++) {
      const { off, len, avail } = sends[k]!;
      let p = 0;
      do {
        let end: number;
        for (;;) {
          if (isFailed) return;
          const have = Math.min(len, avail());
          if (have >= Math.min(len, p + least) && (have > p || len === 0)) {
            end = Math.min(have, p + this.chunkBytes);
            break;
          }
          await this.waitProgress(failed);
        }
        outstanding += 2;
        sock.write(encodeHead({ e: a.e, s: a.s, k, off: p, len: end - p, code: a.code, n: a.n }), wrote);
        sock.write(Buffer.from(data.buffer, data.byteOffset + off + p, end - p), wrote);
        p = end;
      } while (p < len);
    }
    allQueued = true;
    if (outstanding === 0) return;
    // An aborted collective's bytes are dropped by the receiver (old epoch or seq); wait no longer than that takes.
    await Promise.race([flushed, failed.then((f) => (f ? new Promise((r) => setTimeout(r, 2000).unref()) : flushed))]);
  }
}
