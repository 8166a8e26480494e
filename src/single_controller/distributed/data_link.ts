// The ring's data plane: plain TCP between neighbouring hosts, beside the gRPC
// control link (cluster.ts). Bulk bytes go here because grpc-js costs several full
// copies per message (frame encode, its length prefix, its reassembly) on one
// thread, and HTTP/2 flow control stalls megabyte frames; a raw socket lets the
// kernel read straight into the shared buffers a collective works in (Node's
// `onread` with a buffer chosen per read), and write straight out of them.
//
// Orientation: each host's server is dialled by its ring successor; the host writes
// on the accepted socket, the successor reads. Both ends first prove the run's token
// (auth.ts) before any payload: the dialler is refused and logged with its address
// otherwise, and a server that cannot prove the token is never sent anything.
// Frames: a 32-byte head (magic, epoch, seq, step, offset, length, op code, count;
// u32 LE) and `length` bytes of payload.
import { createServer, connect as tcpConnect, type Server, type Socket } from "node:net";
import { MAC_BYTES, NONCE_BYTES, freshNonce, proof, proofMatches } from "./auth.js";
import { logger } from "../../utils/logger.js";

const MAGIC = 0x44535456; // "VTSD"
const PROTO = 1;
export const HEAD_BYTES = 32;
const SERVER_HELLO = 8 + NONCE_BYTES;
const CLIENT_HELLO = 12 + NONCE_BYTES + MAC_BYTES;

export interface DataLimits {
  /** A connection that has not authenticated within this is cut (default 5 s). */
  handshakeMs: number;
  /** Connections still authenticating at once; more are cut at accept (default 16). */
  maxPending: number;
  /** Authenticated connections at once (a ring needs one; default 2). */
  maxPeers: number;
}
export const DEFAULT_DATA_LIMITS: DataLimits = { handshakeMs: 5000, maxPending: 16, maxPeers: 2 };

export interface FrameHead {
  e: number;
  s: number;
  k: number;
  off: number;
  len: number;
  code: number;
  n: number;
}

export function encodeHead(h: FrameHead): Buffer {
  const b = Buffer.allocUnsafe(HEAD_BYTES);
  const v = [MAGIC, h.e, h.s, h.k, h.off, h.len, h.code, h.n];
  for (let i = 0; i < 8; i++) b.writeUInt32LE(v[i]! >>> 0, i * 4);
  return b;
}

function decodeHead(b: Uint8Array): FrameHead {
  const d = new DataView(b.buffer, b.byteOffset, HEAD_BYTES);
  const u = (i: number) => d.getUint32(i * 4, true);
  if (u(0) !== MAGIC) throw new Error("a data frame without the frame mark (the stream is out of step)");
  return { e: u(1), s: u(2), k: u(3), off: u(4), len: u(5), code: u(6), n: u(7) };
}

const peerOf = (s: Socket) => `${s.remoteAddress ?? "?"}:${s.remotePort ?? "?"}`;

export interface DataServer {
  address: string;
  close(): void;
}

/**
 * Listens on exactly host:port for ring connections; `onPeer` gets each authenticated
 * socket with the node ranks the dialler claims to be (`from`) and to reach (`to`).
 */
export async function startDataServer(
  host: string, port: number, authOf: () => { token: string; runId: string } | undefined, onPeer: (sock: Socket, from: number, to: number) => void,
  limits: DataLimits = DEFAULT_DATA_LIMITS,
): Promise<DataServer> {
  let pending = 0, peers = 0;
  const refuse = (sock: Socket, why: string) => {
    logger().warn({ peer: peerOf(sock), why }, "refused a ring data connection");
    sock.destroy();
  };
  const server: Server = createServer({ noDelay: true }, (sock) => {
    if (pending >= limits.maxPending) return refuse(sock, `${limits.maxPending} connections are already authenticating`);
    pending++;
    let settled = false;
    const settle = () => {
      if (!settled) (settled = true), pending--, clearTimeout(timer);
    };
    const timer = setTimeout(() => {
      settle();
      refuse(sock, `did not authenticate within ${limits.handshakeMs / 1000} s`);
    }, limits.handshakeMs);
    const nonceS = freshNonce();
    const hello = Buffer.alloc(SERVER_HELLO);
    hello.writeUInt32LE(MAGIC, 0);
    hello.writeUInt32LE(PROTO, 4);
    nonceS.copy(hello, 8);
    sock.on("error", () => settle());
    sock.on("close", () => settle());
    sock.write(hello);
    let got = Buffer.alloc(0);
    const onData = (b: Buffer) => {
      got = Buffer.concat([got, b]);
      if (got.length < CLIENT_HELLO) return;
      sock.off("data", onData);
      settle();
      if (got.length > CLIENT_HELLO) return refuse(sock, "sent data before it was authenticated");
      if (got.readUInt32LE(0) !== MAGIC) return refuse(sock, "not a verl-ts ring connection");
      const from = got.readUInt32LE(4), to = got.readUInt32LE(8);
      const nonceC = got.subarray(12, 12 + NONCE_BYTES), mac = got.subarray(12 + NONCE_BYTES);
      const auth = authOf();
      if (!auth) return refuse(sock, "this host has not joined its run yet");
      if (!proofMatches(mac, proof(auth.token, "ring-client", auth.runId, nonceS, nonceC, from, to))) return refuse(sock, "wrong run token or run id");
      if (peers >= limits.maxPeers) return refuse(sock, `${limits.maxPeers} ring peers are connected already`);
      peers++;
      sock.on("close", () => peers--);
      sock.write(proof(auth.token, "ring-server", auth.runId, nonceS, nonceC, from, to));
      // This end only writes from now on; anything the peer sends is a protocol error.
      sock.on("data", () => refuse(sock, "sent data on a send-only ring connection"));
      onPeer(sock, from, to);
    };
    sock.on("data", onData);
  });
  const target = host.includes(":") ? `[${host}]:${port}` : `${host}:${port}`;
  await new Promise<void>((resolve, reject) => {
    server.once("error", (e) => reject(new Error(`cannot listen on ${target} for ring data: ${e.message}`)));
    server.listen(port, host, () => resolve());
  });
  const bound = (server.address() as { port: number }).port;
  return { address: `${host.includes(":") ? `[${host}]` : host}:${bound}`, close: () => server.close() };
}

/** Where a frame's payload goes. */
export interface FrameSink {
  /** The place for `h.len` bytes; null: not yet (reading pauses until `FrameReader.resume`); "discard": read and drop. */
  place(h: FrameHead): Uint8Array | null | "discard";
  /** `total` bytes of the current frame's payload are in place. */
  progress(h: FrameHead, total: number): void;
}

type Phase = "hello" | "mac" | "head" | "body" | "blocked";

/**
 * The reading end: reads the handshake, then frames, each payload straight into the
 * place its sink names (one read syscall per piece, no copy in user space except the
 * first read after a pause, which lands in a small spare buffer).
 */
export class DataClient {
  readonly socket: Socket;
  readonly ready: Promise<void>;
  private phase: Phase = "hello";
  private have = 0;
  private small = Buffer.alloc(Math.max(HEAD_BYTES, SERVER_HELLO, MAC_BYTES));
  private readonly spare = Buffer.alloc(64 << 10);
  private head: FrameHead | undefined;
  private body: Uint8Array | "discard" | undefined;
  private backlog: Buffer[] = [];
  private nonceS: Buffer | undefined;
  private readonly nonceC = freshNonce();
  private readyFns!: { resolve(): void; reject(e: Error): void };
  private failed: string | undefined;

  constructor(host: string, port: number, private readonly auth: { token: string; runId: string; from: number; to: number },
    private readonly sink: FrameSink, private readonly onFail: (reason: string) => void) {
    this.ready = new Promise((resolve, reject) => (this.readyFns = { resolve, reject }));
    this.ready.catch(() => undefined);
    this.socket = tcpConnect({
      host, port, noDelay: true,
      onread: { buffer: () => this.target(), callback: (n: number, buf: Uint8Array) => this.onRead(buf.subarray(0, n)) },
    });
    this.socket.on("error", (e) => this.fail(e.message));
    this.socket.on("close", () => this.fail("the connection closed"));
  }

  private fail(reason: string): void {
    if (this.failed !== undefined) return;
    this.failed = reason;
    this.readyFns.reject(new Error(reason));
    this.onFail(reason);
    this.socket.destroy();
  }

  close(): void {
    this.failed ??= "closed";
    this.socket.destroy();
  }

  private need(): number {
    switch (this.phase) {
      case "hello": return SERVER_HELLO;
      case "mac": return MAC_BYTES;
      case "head": return HEAD_BYTES;
      default: return this.head!.len;
    }
  }

  /** Where the next read goes. */
  private target(): Uint8Array {
    if (this.phase === "blocked" || this.backlog.length) return this.spare;
    if (this.phase === "body") {
      if (this.body === "discard") return this.spare.subarray(0, Math.min(this.spare.length, this.head!.len - this.have));
      return this.body!.subarray(this.have);
    }
    return this.small.subarray(this.have, this.need());
  }

  private onRead(src: Uint8Array): boolean {
    if (this.failed !== undefined) return false;
    if (this.phase === "blocked" || this.backlog.length) {
      this.backlog.push(Buffer.from(src));
      return false;
    }
    try {
      return this.consume(src);
    } catch (e) {
      this.fail((e as Error).message);
      return false;
    }
  }

  /** Takes bytes (in place already, or to be copied where they belong); false when reading must pause. */
  private consume(src: Uint8Array): boolean {
    while (src.length > 0 || (this.phase === "body" && this.have === this.head!.len)) {
      if (this.phase === "body") {
        const h = this.head!;
        const k = Math.min(src.length, h.len - this.have);
        if (this.body !== "discard" && k > 0) {
          const dst = this.body!.subarray(this.have, this.have + k);
          if (dst.buffer !== src.buffer || dst.byteOffset !== src.byteOffset) dst.set(src.subarray(0, k));
        }
        this.have += k;
        src = src.subarray(k);
        if (this.body !== "discard") this.sink.progress(h, this.have);
        if (this.have === h.len) {
          this.phase = "head";
          this.have = 0;
        }
        continue;
      }
      const need = this.need();
      const k = Math.min(src.length, need - this.have);
      const dst = this.small.subarray(this.have, this.have + k);
      if (dst.buffer !== src.buffer || dst.byteOffset !== src.byteOffset) dst.set(src.subarray(0, k));
      this.have += k;
      src = src.subarray(k);
      if (this.have < need) continue;
      this.have = 0;
      if (this.phase === "hello") this.onServerHello();
      else if (this.phase === "mac") this.onServerProof();
      else if (!this.onHead(decodeHead(this.small))) {
        if (src.length) this.backlog.push(Buffer.from(src));
        return false;
      }
    }
    return true;
  }

  private onServerHello(): void {
    if (this.small.readUInt32LE(0) !== MAGIC) throw new Error("the peer is not a verl-ts ring server");
    if (this.small.readUInt32LE(4) !== PROTO) throw new Error(`the peer speaks ring protocol ${this.small.readUInt32LE(4)}, this host ${PROTO}`);
    this.nonceS = Buffer.from(this.small.subarray(8, 8 + NONCE_BYTES));
    const a = this.auth;
    const out = Buffer.alloc(CLIENT_HELLO);
    out.writeUInt32LE(MAGIC, 0);
    out.writeUInt32LE(a.from, 4);
    out.writeUInt32LE(a.to, 8);
    this.nonceC.copy(out, 12);
    proof(a.token, "ring-client", a.runId, this.nonceS, this.nonceC, a.from, a.to).copy(out, 12 + NONCE_BYTES);
    this.socket.write(out);
    this.phase = "mac";
  }

  private onServerProof(): void {
    const a = this.auth;
    if (!proofMatches(this.small.subarray(0, MAC_BYTES), proof(a.token, "ring-server", a.runId, this.nonceS!, this.nonceC, a.from, a.to))) {
      throw new Error("the peer did not prove the run's token (not an agent of this run)");
    }
    this.phase = "head";
    this.readyFns.resolve();
  }

  /** False: the sink has no place for it yet (paused). */
  private onHead(h: FrameHead): boolean {
    this.head = h;
    const where = this.sink.place(h);
    if (where === null) {
      this.phase = "blocked";
      return false;
    }
    if (where !== "discard" && where.length < h.len) throw new Error(`a data frame of ${h.len} bytes where ${where.length} fit`);
    this.body = where;
    this.phase = "body";
    this.have = 0;
    return true;
  }

  /** The sink has a place now for a frame it held back: carry on reading. */
  resume(): void {
    if (this.failed !== undefined) return;
    try {
      if (this.phase === "blocked") {
        const h = this.head!;
        const where = this.sink.place(h);
        if (where === null) return;
        if (where !== "discard" && where.length < h.len) throw new Error(`a data frame of ${h.len} bytes where ${where.length} fit`);
        this.body = where;
        this.phase = "body";
        this.have = 0;
        if (h.len === 0 && !this.consume(new Uint8Array(0))) return;
      }
      while (this.backlog.length) {
        const b = this.backlog.shift()!;
        if (!this.consume(b)) return;
      }
      this.socket.resume();
    } catch (e) {
      this.fail((e as Error).message);
    }
  }
}
