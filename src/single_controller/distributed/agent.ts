// `verl worker --join HOST:PORT`: the host agent, one process per host. It
// serves a ring endpoint for its neighbours, registers with the driver, and
// once every host has joined starts this host's rank threads (the same piscina
// pool and worker_entry as a one-host run, with global RANK / WORLD_SIZE and
// LOCAL_RANK), then runs the tasks the driver sends and streams the results
// back. Before it sends anything about itself or loads any module it makes the
// driver prove the run's token (auth.ts); a process that cannot is named and left.
// It exits 0 only when the driver's shutdown says the run succeeded, 1 otherwise
// (the run failed, the driver was lost or refused it), 143 on SIGTERM, so a
// cluster engine restarts the whole group.
import { createSocket } from "node:dgram";
import { hostname } from "node:os";
import { pathToFileURL } from "node:url";
import type { Socket } from "node:net";
import { ResourcePool } from "../resource_pool.js";
import type { Task, TaskResult } from "../messages.js";
import { freshNonce, proof, proofMatches } from "./auth.js";
import { BridgeServer, createBridgeBuffers } from "./bridge.js";
import { DEFAULT_MASTER_PORT, maxMessageBytesFromEnv, type ChallengeHead, type HelloHead, type ProofHead, type WelcomeHead } from "./cluster.js";
import { startDataServer } from "./data_link.js";
import { DEFAULT_LINK, connect, streamEndReason } from "./grpc_link.js";
import { isIp, listenInRange, lookupWithRetry, ringPortRange, socketIfnameAddress } from "./placement.js";
import { Ring } from "./ring.js";
import { agentToken, runIdFromEnv } from "./token.js";
import { VERL_TS_VERSION } from "./version.js";
import { decodeFrame, encodeFrame } from "./wire.js";
import { logger } from "../../utils/logger.js";
import { packageRoot } from "../../utils/paths.js";

export interface AgentOptions {
  /** The driver, HOST:PORT (default MASTER_ADDR:MASTER_PORT). */
  join?: string;
  /** Shown in the driver's errors (default: the host name). */
  name?: string;
  /** Address for this host's ring server (default: the address this host uses to reach the driver). */
  bind?: string;
  ringPort?: number;
  tokenFile?: string;
  /** NODE_RANK (default: the environment's, else the driver chooses). */
  nodeRank?: number;
  /** How long to wait for the token file and the driver (default 600 s). */
  waitMs?: number;
}

export function parseJoin(join: string | undefined, env: NodeJS.ProcessEnv = process.env): { host: string; port: number } {
  const text = join ?? (env.MASTER_ADDR ? `${env.MASTER_ADDR}:${env.MASTER_PORT ?? DEFAULT_MASTER_PORT}` : undefined);
  if (!text) throw new Error("verl worker: give --join HOST:PORT (or set MASTER_ADDR and MASTER_PORT)");
  const m = /^(\[[^\]]+\]|[^:]+)(?::(\d+))?$/.exec(text);
  if (!m) throw new Error(`verl worker: --join '${text}' is not HOST:PORT`);
  const port = m[2] === undefined ? DEFAULT_MASTER_PORT : Number(m[2]);
  if (!(port > 0 && port < 65536)) throw new Error(`verl worker: port ${m[2]} in --join '${text}' is not in 1..65535`);
  return { host: m[1]!.replace(/^\[|\]$/g, ""), port };
}

/** The local address the kernel would use toward host:port (a connected UDP socket sends nothing). */
function localAddressToward(host: string, port: number): Promise<string> {
  return new Promise((resolve, reject) => {
    const sock = createSocket(host.includes(":") ? "udp6" : "udp4");
    sock.on("error", (e) => {
      sock.close();
      reject(new Error(`cannot find a route to the driver ${host}:${port}: ${e.message}`));
    });
    sock.connect(port, host, () => {
      const addr = sock.address().address;
      sock.close();
      resolve(addr);
    });
  });
}

function envNodeRank(): number | undefined {
  const raw = process.env.NODE_RANK;
  if (raw === undefined || raw === "") return undefined;
  const v = Number(raw);
  if (!Number.isInteger(v) || v < 0) throw new Error(`NODE_RANK='${raw}' is not a non-negative integer`);
  return v;
}

/** Module URLs under the driver's copy of verl-ts point into this host's copy. */
function remapModules(value: unknown, from: string, to: string): void {
  if (from === to) return;
  const walk = (v: unknown, depth: number): void => {
    if (v === null || typeof v !== "object" || depth > 24 || ArrayBuffer.isView(v)) return;
    const rec = v as Record<string, unknown>;
    if (typeof rec.moduleUrl === "string" && rec.moduleUrl.startsWith(from)) rec.moduleUrl = to + rec.moduleUrl.slice(from.length);
    for (const x of Array.isArray(v) ? v : Object.values(rec)) walk(x, depth + 1);
  };
  walk(value, 0);
}

export async function runAgent(opts: AgentOptions): Promise<{ code: number; why: string }> {
  const { host, port } = parseJoin(opts.join);
  const waitMs = opts.waitMs ?? 600_000;
  const token = await agentToken({ ...(opts.tokenFile ? { tokenFile: opts.tokenFile } : {}), waitMs });
  const wantRun = runIdFromEnv() ?? null;
  const name = opts.name ?? hostname();
  const log = logger().child({ agent: name });
  // The driver's name may not resolve yet (a pod's DNS record appears after the pod starts): retry until waitMs.
  const driverIp = isIp(host) ? host : await lookupWithRetry(host, waitMs);
  const bind = opts.bind ?? socketIfnameAddress() ?? (await localAddressToward(driverIp, port));

  let runId: string | undefined;
  let pool: ResourcePool | undefined;
  let bridge: BridgeServer | undefined;
  let welcome: WelcomeHead | undefined;
  const early: [Socket, number, number][] = [];
  let ring: Ring | undefined;
  const dataServer = await listenInRange(opts.ringPort !== undefined ? [opts.ringPort, opts.ringPort] : ringPortRange(), (p) =>
    startDataServer(bind, p, () => (runId !== undefined && welcome ? { token, runId } : undefined), (sock, from, to) => (ring ? ring.attach(sock, from, to) : early.push([sock, from, to]))));
  const target = `${host.includes(":") ? `[${host}]` : host}:${port}`;
  const link = { ...DEFAULT_LINK, maxMessageBytes: maxMessageBytesFromEnv() };
  const client = connect(target, link);
  try {
    await client.ready(waitMs);
  } catch (e) {
    dataServer.close();
    client.close();
    throw e;
  }
  const stream = client.join();
  const nonceA = freshNonce();
  stream.write(encodeFrame({ t: "challenge", nonce: nonceA, version: VERL_TS_VERSION, runId: wantRun } satisfies ChallengeHead));
  log.info({ driver: target, ring: dataServer.address }, "asking the driver to prove the run's token");

  let verified = false;
  let finished = false;
  const agentRoot = pathToFileURL(packageRoot).href;

  const send = (head: object, value?: unknown) => {
    if (!finished) stream.write(encodeFrame(head, value));
  };

  const start = async (w: WelcomeHead) => {
    welcome = w;
    const buffers = createBridgeBuffers(w.bridgeBytes);
    pool = new ResourcePool({
      worldSize: w.perNode, name: `${w.poolName}@node${w.nodeRank}`, env: w.env, timeoutMs: w.timeoutMs,
      ...(w.chunkElems !== undefined ? { chunkElems: w.chunkElems } : {}),
      host: { hostIndex: w.nodeRank, nnodes: w.peers.length, localWorldSize: w.perNode, bridge: buffers },
    });
    ring = new Ring(w.nodeRank, w.peers, { token, runId: w.runId }, w.timeoutMs, buffers, w.chunkBytes);
    for (const [s, from, to] of early.splice(0)) ring.attach(s, from, to);
    const r = ring;
    bridge = new BridgeServer(buffers, (req) => r.handle(req));
    await ring.open();
    log.info({ node: w.nodeRank, ranks: `${w.nodeRank * w.perNode}..${(w.nodeRank + 1) * w.perNode - 1}`, hosts: w.peers.length }, "rank threads started; ring connected");
    send({ t: "ready" });
  };

  const runTask = async (head: { id: number; rank: number; epoch: number }, task: Task, moved: ArrayBuffer[]) => {
    const p = pool!, w = welcome!;
    ring!.reset(head.epoch);
    remapModules(task, w.driverRoot, agentRoot);
    const local = head.rank - w.nodeRank * w.perNode;
    const method = task.kind === "call" ? task.method : task.kind;
    try {
      const result: TaskResult = await p.run(local, task, moved, method);
      send({ t: "result", id: head.id }, result);
    } catch (e) {
      send({ t: "died", id: head.id, rank: head.rank, reason: e instanceof Error ? e.message.split("\n")[0] : String(e) });
    }
  };

  return new Promise<{ code: number; why: string }>((resolve) => {
    const finish = async (code: number, why: string) => {
      if (finished) return;
      finished = true;
      process.off("SIGTERM", onTerm);
      if (code === 0) log.info(why);
      else log.error(why);
      bridge?.stop();
      ring?.close();
      await pool?.destroy(code === 0 ? 30_000 : 0);
      stream.end();
      client.close();
      dataServer.close();
      resolve({ code, why });
    };
    const onTerm = () => void finish(143, "got SIGTERM: stopping this host's ranks");
    process.once("SIGTERM", onTerm);
    stream.on("data", (buf: Buffer) => {
      if (finished) return;
      let frame;
      try {
        frame = decodeFrame<Record<string, unknown>>(buf);
      } catch (e) {
        void finish(1, `a malformed frame from the driver ${target}: ${(e as Error).message}`);
        return;
      }
      const head = frame.head;
      if (head.t === "refused") {
        void finish(1, `the driver refused this host: ${head.reason as string}`);
        return;
      }
      if (!verified) {
        const p = head as unknown as ProofHead;
        const ok = head.t === "proof" && typeof p.runId === "string" && (wantRun === null || p.runId === wantRun) &&
          proofMatches(p.proof, proof(token, "driver", p.runId, nonceA, p.nonce instanceof Uint8Array ? p.nonce : new Uint8Array(0)));
        if (!ok) {
          void finish(1, `the process at ${target} is not this run's driver: it could not prove the run's join token${wantRun ? ` for run '${wantRun}'` : ""}; nothing was sent to it and no module was loaded`);
          return;
        }
        if (p.version !== VERL_TS_VERSION) {
          void finish(1, `the driver at ${target} runs verl-ts ${p.version}, this host ${VERL_TS_VERSION}; run the same verl-ts on every host`);
          return;
        }
        verified = true;
        runId = p.runId;
        const nodeRank = opts.nodeRank ?? envNodeRank() ?? null;
        const hello: HelloHead = {
          t: "hello", proof: proof(token, "agent", p.runId, nonceA, p.nonce), version: VERL_TS_VERSION,
          name, addr: dataServer.address, nodeRank, v8: process.versions.v8, pid: process.pid,
        };
        send(hello);
        log.info({ driver: target, run: runId, nodeRank }, "the driver proved the run's token; joining");
        return;
      }
      if (head.t === "welcome") {
        start(head as unknown as WelcomeHead).catch((e: unknown) => void finish(1, `could not start: ${(e as Error).message}`));
      } else if (head.t === "task") {
        if (!pool) {
          send({ t: "died", id: head.id, rank: head.rank, reason: "a task arrived before this host's rank threads were started" });
          return;
        }
        void runTask(head as { id: number; rank: number; epoch: number }, frame.value as Task, frame.buffers);
      } else if (head.t === "abort") {
        pool?.abortCollective(head.reason as string);
        ring?.abort(head.reason as string, head.epoch as number);
      } else if (head.t === "shutdown") {
        const ok = head.ok === true;
        void finish(ok ? 0 : 1, ok ? "the driver shut this host down: the run succeeded" : `the driver stopped the run: ${String(head.reason ?? "it did not succeed")}`);
      }
    });
    stream.on("error", (e: unknown) => void finish(1, `lost the driver ${target}: ${streamEndReason(e)}`));
    stream.on("end", () => void finish(1, `the driver ${target} closed the connection`));
  });
}
