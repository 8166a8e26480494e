// The driver's side of a pool spanning hosts. It listens on MASTER_ADDR:MASTER_PORT
// (that address only), admits host agents that present the run's token, gives
// each a node rank, and once trainer.nnodes have joined sends everyone the ring
// of peers. Tasks for a rank go down its host's stream as frames; results come
// back the same way. A host whose stream ends or fails (keepalive pings catch a
// silent one in seconds) fails the pool with an error that names the host.
import { pathToFileURL } from "node:url";
import { DEFAULT_COLLECTIVE_TIMEOUT_MS } from "../collective.js";
import type { Task, TaskResult } from "../messages.js";
import type { CollectiveControl, RankBackend, RemoteRanks } from "../resource_pool.js";
import { freshNonce, proof, proofMatches } from "./auth.js";
import { DEFAULT_LINK, grpc, startServer, streamEndReason, type ClusterServer, type LinkSettings } from "./grpc_link.js";
import { describePeer, type PeerInfo } from "./ring.js";
import { driverToken, publishToken } from "./token.js";
import { VERL_TS_VERSION } from "./version.js";
import { decodeFrame, encodeFrame } from "./wire.js";
import { logger } from "../../utils/logger.js";
import { packageRoot } from "../../utils/paths.js";

export const DEFAULT_MASTER_PORT = 29500;

/** What an agent says first: a nonce for the driver to prove the token with, nothing about the run. */
export interface ChallengeHead {
  t: "challenge";
  nonce: Uint8Array;
  version: string;
  /** The run the agent was started for (VERL_RUN_ID), if any. */
  runId: string | null;
}

/** The driver's answer: its proof of the token over both nonces, the run id and its version. */
export interface ProofHead {
  t: "proof";
  nonce: Uint8Array;
  proof: Uint8Array;
  runId: string;
  version: string;
}

/** The agent's hello, sent only once the driver has proved the token; it carries the agent's proof. */
export interface HelloHead {
  t: "hello";
  proof: Uint8Array;
  version: string;
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
  runId: string;
  keepaliveMs: number;
  maxMessageBytes: number;
  chunkBytes?: number;
  bridgeBytes?: number;
}

/** How the run ended, sent with the shutdown: an agent exits 0 only when ok. */
export interface Outcome {
  ok: boolean;
  reason: string;
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
  /** Keepalive, message size and handshake limits of the control link. */
  link?: Partial<LinkSettings>;
  /** The ring's pipeline piece in bytes (ring.ts). */
  chunkBytes?: number;
  /** Bytes a host's leader hands the ring per request (bridge.ts; default 64 MiB): tests make it small. */
  bridgeBytes?: number;
}

/** The largest control-link frame (VERL_MAX_MESSAGE_MB), bytes. */
export function maxMessageBytesFromEnv(env: NodeJS.ProcessEnv = process.env): number {
  const raw = env.VERL_MAX_MESSAGE_MB;
  if (raw === undefined || raw === "") return DEFAULT_LINK.maxMessageBytes;
  const v = Number(raw);
  if (!Number.isInteger(v) || v < 1 || v > 2047) throw new Error(`VERL_MAX_MESSAGE_MB='${raw}' must be an integer in 1..2047`);
  return v << 20;
}

/** Frames before authentication are tiny; anything larger is refused. */
const PREAUTH_MAX_BYTES = 64 << 10;

/** The host part of a ring address (`host:port`, `[v6]:port`). */
function ringHost(addr: string): string {
  return addr.replace(/:\d+$/, "").replace(/^\[(.*)\]$/, "$1");
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

  /** Tells the agent to stop (once), with the run's outcome. */
  sendShutdown(outcome: Outcome): void {
    if (this.shutdownSent) return;
    this.shutdownSent = true;
    if (this.lostReason === undefined) {
      try {
        this.send({ t: "shutdown", ok: outcome.ok, reason: outcome.reason });
      } catch {
        // already gone
      }
    }
    for (const p of this.pending.values()) p.reject(new Error(`${describePeer(this.peer)} was shut down`));
    this.pending.clear();
  }

  /** Tells the agent to stop and waits (at most waitMs) until it has closed its side. */
  async shutdown(outcome: Outcome, waitMs = 10_000): Promise<void> {
    const open = this.lostReason === undefined && !this.stream.closed;
    const closed = open ? new Promise<void>((resolve) => {
      this.stream.once("end", resolve);
      this.stream.once("error", () => resolve());
      this.stream.once("close", resolve);
    }) : Promise.resolve();
    this.sendShutdown(outcome);
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
  const bindIp = await resolveListenAddress(given);
  const tok = driverToken();
  const { token, runId } = tok;
  const link_: LinkSettings = { ...DEFAULT_LINK, maxMessageBytes: maxMessageBytesFromEnv(), ...opts.link };
  const joinTimeoutMs = opts.joinTimeoutMs ?? envNumber("VERL_JOIN_TIMEOUT_S", 600) * 1000;
  const timeoutMs = opts.timeoutMs ?? DEFAULT_COLLECTIVE_TIMEOUT_MS;
  const log = logger().child({ run: runId });

  const slots: (HostLink | undefined)[] = new Array(nnodes).fill(undefined);
  let complete: (() => void) | undefined;
  let fail: ((e: Error) => void) | undefined;
  const allJoined = new Promise<void>((resolve, reject) => ((complete = resolve), (fail = reject)));
  let joined = false;

  const accept = (stream: grpc.ServerDuplexStream<Buffer, Buffer>) => {
    const peer = stream.getPeer();
    let link: HostLink | undefined;
    let challenge: { nonceA: Uint8Array; nonceD: Buffer } | undefined;
    let cut = false;
    const refuse = (why: string, name?: string) => {
      if (cut) return;
      cut = true;
      clearTimeout(deadline);
      log.warn({ peer, ...(name ? { name } : {}), why }, "refused a host agent");
      try {
        stream.write(encodeFrame({ t: "refused", reason: why }));
      } catch {
        // the peer is gone already
      }
      stream.emit("error", { code: grpc.status.PERMISSION_DENIED, details: why });
    };
    const deadline = setTimeout(() => refuse(`did not authenticate within ${link_.handshakeMs / 1000} s`), link_.handshakeMs);
    deadline.unref();
    const leftEarly = (why: string) => {
      clearTimeout(deadline);
      if (!link && !cut) {
        cut = true;
        log.warn({ peer, why }, "refused a host agent");
      }
    };
    stream.on("error", (e: unknown) => leftEarly(`the stream ended before it proved the run's join token (${streamEndReason(e)})`));
    stream.on("end", () => leftEarly("it left before it proved the run's join token (an agent with another token refuses this driver)"));
    stream.on("cancelled", () => leftEarly("it left before it proved the run's join token (an agent with another token refuses this driver)"));
    stream.on("data", (buf: Buffer) => {
      if (cut) return;
      if (!link && buf.length > PREAUTH_MAX_BYTES) return refuse(`sent a ${buf.length}-byte frame before authenticating`);
      let frame;
      try {
        frame = decodeFrame(buf);
      } catch (e) {
        return refuse(`a malformed frame: ${(e as Error).message}`);
      }
      const head = frame.head;
      if (link) return link.handle(head, frame.value);
      if (!challenge) {
        if (head.t !== "challenge" || !(head.nonce instanceof Uint8Array)) return refuse("the first message must be a challenge (not a verl-ts agent of this version?)");
        const c = head as unknown as ChallengeHead;
        if (c.runId !== null && c.runId !== runId) return refuse(`it was started for run '${c.runId}', this driver runs '${runId}' (VERL_RUN_ID)`);
        challenge = { nonceA: c.nonce, nonceD: freshNonce() };
        const answer: ProofHead = { t: "proof", nonce: challenge.nonceD, proof: proof(token, "driver", runId, challenge.nonceA, challenge.nonceD), runId, version: VERL_TS_VERSION };
        stream.write(encodeFrame(answer));
        return;
      }
      if (head.t !== "hello") return refuse("the second message must be a hello");
      const hello = head as unknown as HelloHead;
      if (!proofMatches(hello.proof, proof(token, "agent", runId, challenge.nonceA, challenge.nonceD))) return refuse("it could not prove the run's join token (wrong VERL_JOIN_TOKEN / --token-file)", String(hello.name));
      if (hello.version !== VERL_TS_VERSION) return refuse(`it runs verl-ts ${hello.version}, the driver ${VERL_TS_VERSION}; run the same verl-ts on every host`, hello.name);
      if (joined) return refuse(`all ${nnodes} hosts (trainer.nnodes) have joined already`, hello.name);
      if (hello.v8 !== process.versions.v8) return refuse(`its V8 ${hello.v8} differs from the driver's ${process.versions.v8}; run the same Node.js on every host`, hello.name);
      // The same agent started twice (the same command run again on one host) would otherwise take a
      // second node rank and run as a second host: one agent per (name, ring address host) joins.
      const twin = slots.find((s) => s !== undefined && s.peer.name === hello.name && ringHost(s.peer.addr) === ringHost(hello.addr));
      if (twin) {
        return refuse(`host agent '${hello.name}' at ${ringHost(hello.addr)} (pid ${hello.pid}) is the same agent as ${describePeer(twin.peer)} (pid ${twin.hello.pid}), which joined already: `
          + "one agent per host, or give each agent on one host its own --name", hello.name);
      }
      let nodeRank = hello.nodeRank;
      if (nodeRank === null) nodeRank = slots.findIndex((s) => s === undefined);
      if (!Number.isInteger(nodeRank) || nodeRank < 0 || nodeRank >= nnodes) return refuse(`node rank ${String(hello.nodeRank)} is outside [0, ${nnodes}) (trainer.nnodes=${nnodes})`, hello.name);
      if (slots[nodeRank]) return refuse(`node rank ${nodeRank} is taken by ${describePeer(slots[nodeRank]!.peer)}`, hello.name);
      clearTimeout(deadline);
      server.markAuthenticated(peer);
      link = new HostLink(stream, hello, nodeRank);
      slots[nodeRank] = link;
      log.info({ node: nodeRank, name: hello.name, peer, ring: hello.addr, joined: slots.filter(Boolean).length, nnodes }, "host agent joined");
      const l = link;
      const gone = (reason: string) => {
        if (!joined && slots[l.peer.nodeRank] === l) {
          slots[l.peer.nodeRank] = undefined;
          log.warn({ node: l.peer.nodeRank, name: l.peer.name, reason }, "host agent left before the run started");
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
    server = await startServer(bindIp, port, { join: accept }, link_);
  } catch (e) {
    throw new Error(`trainer.nnodes=${nnodes}: the driver ${(e as Error).message} (set MASTER_ADDR / MASTER_PORT to an address of this host, VERL_SOCKET_IFNAME to an interface)`);
  }
  // Only now that this driver holds the port: a driver that failed to bind leaves the live run's token alone.
  publishToken(tok);
  log.info(
    { listen: server.address, nnodes, perNode, tokenFile: tok.file, tokenGenerated: tok.generated },
    `waiting for ${nnodes} host agents: run 'verl worker --join ${server.address}' on each host`,
  );
  opts.onListen?.(server.address);
  const timer = setTimeout(() => {
    const missing = slots.map((s, i) => (s ? -1 : i)).filter((i) => i >= 0);
    fail?.(new Error(`trainer.nnodes=${nnodes}: only ${nnodes - missing.length} host agents joined ${server.address} within ${joinTimeoutMs / 1000} s (node ranks missing: ${missing.join(", ")}); start 'verl worker --join ${server.address}' on each host (VERL_JOIN_TIMEOUT_S)`));
  }, joinTimeoutMs);
  const failed: Outcome = { ok: false, reason: "the driver could not start the run" };
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
        runId, keepaliveMs: link_.keepaliveMs, maxMessageBytes: link_.maxMessageBytes, ...(opts.chunkBytes !== undefined ? { chunkBytes: opts.chunkBytes } : {}),
        ...(opts.bridgeBytes !== undefined ? { bridgeBytes: opts.bridgeBytes } : {}),
      };
      h.send(welcome);
    }
    await ready;
    log.info({ hosts: peers.map((p) => `${p.name}@${p.addr}`), worldSize: nnodes * perNode }, "every host agent is ready");
    return remoteRanks(hosts, perNode, server);
  } catch (e) {
    failed.reason = `the driver could not start the run: ${(e as Error).message.split("\n")[0]}`;
    await Promise.all(slots.map((h) => h?.shutdown(failed, 2000)));
    server.close();
    throw e;
  } finally {
    clearTimeout(timer);
  }
}

/**
 * The address to listen on: an IP as given; a host name resolved (retrying until
 * VERL_DNS_TIMEOUT_S, default 120 s, since a pod's own DNS name may appear late),
 * and a name that resolves to loopback (hosts that map their name to 127.0.x.x)
 * replaced by the address of VERL_SOCKET_IFNAME or the first non-internal one.
 */
async function resolveListenAddress(given: string): Promise<string> {
  const { interfaceAddress, isIp, lookupWithRetry } = await import("./placement.js");
  if (isIp(given)) return given;
  const ip = await lookupWithRetry(given, envNumber("VERL_DNS_TIMEOUT_S", 120) * 1000);
  if (!ip.startsWith("127.") && ip !== "::1") return ip;
  const other = interfaceAddress(process.env.VERL_SOCKET_IFNAME);
  if (!other) return ip;
  logger().info({ name: given, loopback: ip, listen: other }, "MASTER_ADDR names this host but resolves to loopback; listening on this host's interface address instead");
  return other;
}

function remoteRanks(hosts: HostLink[], perNode: number, server: ClusterServer): RemoteRanks {
  const control = new RemoteCollectiveControl(hosts);
  let failRank: ((rank: number, reason: string) => void) | undefined;
  let stopped = 0;
  let outcome: Outcome = { ok: false, reason: "the driver stopped before the run succeeded" };
  for (const h of hosts) {
    h.onLost = (reason) => {
      outcome = { ok: false, reason };
      failRank?.(h.peer.nodeRank * perNode, reason);
    };
    h.onDied = (rank, reason) => failRank?.(rank, reason);
  }
  const stopAll = async (o: Outcome) => {
    for (const other of hosts) other.sendShutdown(o);
    await Promise.all(hosts.map((h) => h.shutdown(o)));
    server.close();
  };
  // SIGTERM (a pod deleted, a job cancelled): tell every host the run stopped, then exit 143 so the engine restarts
  // the run as a whole; checkpoints are written to a temp directory and renamed, so the last complete one stands.
  const onTerm = () => {
    logger().warn("the driver got SIGTERM: stopping every host (the run resumes from its last checkpoint)");
    void stopAll({ ok: false, reason: "the driver got SIGTERM" }).finally(() => process.exit(143));
  };
  process.once("SIGTERM", onTerm);
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
          process.off("SIGTERM", onTerm);
          // Every host hears the shutdown first, so none takes a neighbour's exit for a lost host.
          for (const other of hosts) other.sendShutdown(outcome);
          await h.shutdown(outcome);
          if (++stopped === hosts.length) server.close();
        },
      });
    }
  }
  return {
    worldSize: hosts.length * perNode, backends, control, onRankLost: (f) => (failRank = f),
    setOutcome: (ok, reason) => {
      if (outcome.reason.includes(" lost: ")) return;
      outcome = { ok, reason };
    },
  };
}
