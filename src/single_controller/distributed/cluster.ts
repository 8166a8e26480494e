// The driver's side of a pool spanning hosts. It listens on MASTER_ADDR:MASTER_PORT
// (that address only), admits host agents that present the run's token, gives
// each a node rank, and once trainer.nnodes have joined sends everyone the ring
// of peers. Tasks for a rank go down its host's stream as frames; results come
// back the same way. A host whose stream ends or fails (keepalive pings catch a
// silent one in seconds) fails the pool with an error that names the host.
import { lookup } from "node:dns/promises";
import { pathToFileURL } from "node:url";
import type * as grpc from "@grpc/grpc-js";
import { DEFAULT_COLLECTIVE_TIMEOUT_MS } from "../collective.js";
import type { Task, TaskResult } from "../messages.js";
import type { CollectiveControl, RankBackend, RemoteRanks } from "../resource_pool.js";
import { startServer, streamEndReason, type ClusterServer } from "./grpc_link.js";
import { describePeer, type PeerInfo } from "./ring.js";
import { driverToken } from "./token.js";
import { decodeFrame, encodeFrame } from "./wire.js";
import { logger } from "../../utils/logger.js";
import { packageRoot } from "../../utils/paths.js";

export const DEFAULT_MASTER_PORT = 29500;

/** What an agent says first. */
export interface HelloHead {
  t: "hello";
  name: string;
  /** Its ring server, host:port. */
  addr: string;
  /** NODE_RANK when the launcher set one; null lets the driver choose. */
  nodeRank: number | null;
  v8: string;
  pid: number;
}

/** What the driver answers once every host has joined. */
export interface WelcomeHead {
  t: "welcome";
  nodeRank: number;
  perNode: number;
  poolName: string;
  peers: PeerInfo[];
  timeoutMs: number;
  chunkElems?: number;
  env: Record<string, string>;
  driverRoot: string;
}

export interface JoinOptions {
  nnodes: number;
  perNode: number;
  name: string;
  env?: Record<string, string>;
  timeoutMs?: number;
  chunkElems?: number;
  /** Overrides MASTER_ADDR / MASTER_PORT (tests). */
  addr?: string;
  port?: number;
  /** How long to wait for every agent (default VERL_JOIN_TIMEOUT_S or 600 s). */
  joinTimeoutMs?: number;
  /** Told the listening address (host:port) once the join server is up (tests asking for port 0). */
  onListen?: (address: string) => void;
}

function envNumber(name: string, fallback: number): number {
  const raw = process.env[name];
  if (raw === undefined || raw === "") return fallback;
  const v = Number(raw);
  if (!Number.isFinite(v) || v <= 0) throw new Error(`environment variable ${name}='${raw}' must be a positive number`);
  return v;
}

class HostLink {
  readonly peer: PeerInfo;
  private nextId = 0;
  private readonly pending = new Map<number, { resolve(r: TaskResult): void; reject(e: Error): void }>();
  lostReason: string | undefined;
  ready = false;
  onReady: (() => void) | undefined;
  onLost: ((reason: string) => void) | undefined;
  onDied: ((rank: number, reason: string) => void) | undefined;
  private shutdownSent = false;

  constructor(readonly stream: grpc.ServerDuplexStream<Buffer, Buffer>, readonly hello: HelloHead, nodeRank: number) {
    this.peer = { nodeRank, name: hello.name, addr: hello.addr };
  }

  handle(head: Record<string, unknown>, value: unknown): void {
    if (head.t === "ready") {
      this.ready = true;
      this.onReady?.();
    } else if (head.t === "result") {
      const p = this.pending.get(head.id as number);
      this.pending.delete(head.id as number);
      p?.resolve(value as TaskResult);
    } else if (head.t === "died") {
      this.onDied?.(head.rank as number, `${head.reason as string} (on ${describePeer(this.peer)})`);
      const p = this.pending.get(head.id as number);
      this.pending.delete(head.id as number);
      p?.reject(new Error(head.reason as string));
    }
  }

  lose(reason: string): void {
    if (this.lostReason !== undefined || this.shutdownSent) return;
    this.lostReason = `${describePeer(this.peer)} lost: ${reason}`;
    this.onLost?.(this.lostReason);
    for (const p of this.pending.values()) p.reject(new Error(this.lostReason));
    this.pending.clear();
  }

  send(head: object, value?: unknown): void {
    if (this.lostReason !== undefined) throw new Error(this.lostReason);
    this.stream.write(encodeFrame(head, value));
  }

  run(rank: number, epoch: number, task: Task): Promise<TaskResult> {
    return new Promise((resolve, reject) => {
      const id = ++this.nextId;
      this.pending.set(id, { resolve, reject });
      try {
        this.send({ t: "task", id, rank, epoch }, task);
      } catch (e) {
        this.pending.delete(id);
        reject(e as Error);
      }
    });
  }

  /** Tells the agent to stop (once). */
  sendShutdown(): void {
    if (this.shutdownSent) return;
    this.shutdownSent = true;
    if (this.lostReason === undefined) {
      try {
        this.send({ t: "shutdown" });
      } catch {
        // already gone
      }
    }
    for (const p of this.pending.values()) p.reject(new Error(`${describePeer(this.peer)} was shut down`));
    this.pending.clear();
  }

  /** Tells the agent to stop and waits (at most waitMs) until it has closed its side. */
  async shutdown(waitMs = 10_000): Promise<void> {
    const open = this.lostReason === undefined && !this.stream.closed;
    const closed = open ? new Promise<void>((resolve) => {
      this.stream.once("end", resolve);
      this.stream.once("error", () => resolve());
      this.stream.once("close", resolve);
    }) : Promise.resolve();
    this.sendShutdown();
    let timer: NodeJS.Timeout | undefined;
    await Promise.race([closed, new Promise<void>((resolve) => (timer = setTimeout(resolve, waitMs)))]);
    clearTimeout(timer);
    this.stream.end();
  }
}

/** Drives the collectives of every host: an abort reaches all of them; a reset starts a new epoch. */
class RemoteCollectiveControl implements CollectiveControl {
  epoch = 1;
  private broken: string | undefined;
  constructor(private readonly hosts: HostLink[]) {}
  abort(reason: string): void {
    if (this.broken !== undefined) return;
    this.broken = reason;
    for (const h of this.hosts) {
      try {
        h.send({ t: "abort", reason, epoch: this.epoch });
      } catch {
        // a lost host has nothing to release
      }
    }
  }
  brokenReason(): string | undefined {
    return this.broken;
  }
  reset(): void {
    this.broken = undefined;
    this.epoch += 1;
  }
}

/** Waits for trainer.nnodes host agents and returns the ranks they hold. */
export async function joinCluster(opts: JoinOptions): Promise<RemoteRanks> {
  const { nnodes, perNode } = opts;
  const given = opts.addr ?? process.env.MASTER_ADDR ?? "127.0.0.1";
  const port = opts.port ?? envNumber("MASTER_PORT", DEFAULT_MASTER_PORT);
  const bindIp = (await lookup(given)).address;
  const { token, file, generated } = driverToken();
  const joinTimeoutMs = opts.joinTimeoutMs ?? envNumber("VERL_JOIN_TIMEOUT_S", 600) * 1000;
  const timeoutMs = opts.timeoutMs ?? DEFAULT_COLLECTIVE_TIMEOUT_MS;

  const slots: (HostLink | undefined)[] = new Array(nnodes).fill(undefined);
  let complete: (() => void) | undefined;
  let fail: ((e: Error) => void) | undefined;
  const allJoined = new Promise<void>((resolve, reject) => ((complete = resolve), (fail = reject)));
  let joined = false;

  const accept = (stream: grpc.ServerDuplexStream<Buffer, Buffer>) => {
    let link: HostLink | undefined;
    stream.on("data", (buf: Buffer) => {
      let frame;
      try {
        frame = decodeFrame(buf);
      } catch (e) {
        stream.emit("error", { code: 3, details: `malformed frame: ${(e as Error).message}` });
        return;
      }
      const head = frame.head;
      if (link) return link.handle(head, frame.value);
      if (head.t !== "hello") return stream.emit("error", { code: 3, details: "the first message must be a hello" });
      const hello = head as unknown as HelloHead;
      const refuse = (why: string) => {
        logger().warn({ name: hello.name, addr: hello.addr, why }, "refused a host agent");
        stream.write(encodeFrame({ t: "refused", reason: why }));
        stream.end();
      };
      if (joined) return refuse(`all ${nnodes} hosts (trainer.nnodes) have joined already`);
      if (hello.v8 !== process.versions.v8) return refuse(`its V8 ${hello.v8} differs from the driver's ${process.versions.v8}; run the same Node.js on every host`);
      let nodeRank = hello.nodeRank;
      if (nodeRank === null) nodeRank = slots.findIndex((s) => s === undefined);
      if (!Number.isInteger(nodeRank) || nodeRank < 0 || nodeRank >= nnodes) return refuse(`node rank ${String(hello.nodeRank)} is outside [0, ${nnodes}) (trainer.nnodes=${nnodes})`);
      if (slots[nodeRank]) return refuse(`node rank ${nodeRank} is taken by ${describePeer(slots[nodeRank]!.peer)}`);
      link = new HostLink(stream, hello, nodeRank);
      slots[nodeRank] = link;
      logger().info({ node: nodeRank, name: hello.name, addr: hello.addr, joined: slots.filter(Boolean).length, nnodes }, "host agent joined");
      const l = link;
      const gone = (reason: string) => {
        if (!joined && slots[l.peer.nodeRank] === l) {
          slots[l.peer.nodeRank] = undefined;
          logger().warn({ node: l.peer.nodeRank, name: l.peer.name, reason }, "host agent left before the run started");
        }
        l.lose(reason);
      };
      stream.on("error", (e: unknown) => gone(streamEndReason(e)));
      stream.on("end", () => gone("the connection closed"));
      // A client that vanishes (process killed, connection reset) shows on the server side as a cancel.
      stream.on("cancelled", () => gone("the connection dropped (the agent process died or its host is unreachable)"));
      if (slots.every(Boolean)) complete?.();
    });
  };

  let server: ClusterServer;
  try {
    server = await startServer(bindIp, port, token, { join: accept });
  } catch (e) {
    throw new Error(`trainer.nnodes=${nnodes}: the driver ${(e as Error).message} (set MASTER_ADDR / MASTER_PORT to an address of this host)`);
  }
  logger().info(
    { listen: server.address, nnodes, perNode, tokenFile: file, tokenGenerated: generated },
    `waiting for ${nnodes} host agents: run 'verl worker --join ${server.address}' on each host`,
  );
  opts.onListen?.(server.address);
  const timer = setTimeout(() => {
    const missing = slots.map((s, i) => (s ? -1 : i)).filter((i) => i >= 0);
    fail?.(new Error(`trainer.nnodes=${nnodes}: only ${nnodes - missing.length} host agents joined ${server.address} within ${joinTimeoutMs / 1000} s (node ranks missing: ${missing.join(", ")}); start 'verl worker --join ${server.address}' on each host (VERL_JOIN_TIMEOUT_S)`));
  }, joinTimeoutMs);
  try {
    await allJoined;
    joined = true;
    const hosts = slots as HostLink[];
    const peers = hosts.map((h) => h.peer);
    const ready = Promise.all(hosts.map((h) => new Promise<void>((resolve, reject) => {
      if (h.ready) return resolve();
      h.onReady = resolve;
      h.onLost = (r) => reject(new Error(r));
    })));
    for (const h of hosts) {
      const welcome: WelcomeHead = {
        t: "welcome", nodeRank: h.peer.nodeRank, perNode, poolName: opts.name, peers, timeoutMs,
        ...(opts.chunkElems !== undefined ? { chunkElems: opts.chunkElems } : {}), env: opts.env ?? {}, driverRoot: pathToFileURL(packageRoot).href,
      };
      h.send(welcome);
    }
    await ready;
    logger().info({ hosts: peers.map((p) => `${p.name}@${p.addr}`), worldSize: nnodes * perNode }, "every host agent is ready");
    return remoteRanks(hosts, perNode, server);
  } catch (e) {
    await Promise.all(slots.map((h) => h?.shutdown(2000)));
    server.close();
    throw e;
  } finally {
    clearTimeout(timer);
  }
}

function remoteRanks(hosts: HostLink[], perNode: number, server: ClusterServer): RemoteRanks {
  const control = new RemoteCollectiveControl(hosts);
  let failRank: ((rank: number, reason: string) => void) | undefined;
  let stopped = 0;
  for (const h of hosts) {
    h.onLost = (reason) => failRank?.(h.peer.nodeRank * perNode, reason);
    h.onDied = (rank, reason) => failRank?.(rank, reason);
  }
  const backends: RankBackend[] = [];
  for (const h of hosts) {
    for (let i = 0; i < perNode; i++) {
      const rank = h.peer.nodeRank * perNode + i;
      backends.push({
        run: async (task: Task): Promise<TaskResult> => {
          const res = await h.run(rank, control.epoch, task);
          // A failed rank releases the ranks of every host, and the next call starts a fresh epoch of the ring.
          if (!res.ok) control.abort(`rank ${rank} on ${describePeer(h.peer)} failed: ${res.error.name}: ${res.error.message.split("\n")[0]}`);
          return res;
        },
        destroy: async () => {
          if (i !== 0) return;
          // Every host hears the shutdown first, so none takes a neighbour's exit for a lost host.
          for (const other of hosts) other.sendShutdown();
          await h.shutdown();
          if (++stopped === hosts.length) server.close();
        },
      });
    }
  }
  return { worldSize: hosts.length * perNode, backends, control, onRankLost: (f) => (failRank = f) };
}
