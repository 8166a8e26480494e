// The control link between the driver and each host agent (@grpc/grpc-js, no
// protobuf codegen): one bidirectional stream of raw frames (wire.ts), `Join`.
// Bulk collective bytes do not go here (data_link.ts). The token never crosses:
// both sides prove it by the HMAC challenge of auth.ts on the stream's first
// frames (cluster.ts, agent.ts). The server holds unauthenticated peers to tight
// limits: the port is our own TCP listener, which hands connections to grpc-js
// (its connection injector) only while fewer than `maxConnections` are open, and
// cuts every connection that has not carried an authenticated stream within
// `handshakeMs` (cluster.ts marks it), logging the peer's address; a connection
// may open `maxStreams` streams, and no message may exceed `maxMessageBytes`
// (grpc-js refuses it from its length prefix). Keepalive pings find a host that
// vanished without closing its connection.
import { createServer, type Socket } from "node:net";
import * as grpc from "@grpc/grpc-js";
import { logger } from "../../utils/logger.js";

const raw = (b: Buffer): Buffer => b;
const bidi = (name: string) => ({
  path: `/verl_ts.Cluster/${name}`, requestStream: true, responseStream: true,
  requestSerialize: raw, requestDeserialize: raw, responseSerialize: raw, responseDeserialize: raw,
});
const SERVICE = { join: bidi("Join") } as unknown as grpc.ServiceDefinition;

export interface LinkSettings {
  /** Keepalive ping interval and timeout, ms (trainer.keepalive_s; default 10 s, so a lost host shows in about 20 s). */
  keepaliveMs: number;
  /** The largest frame either side takes (VERL_MAX_MESSAGE_MB; default 1024 MiB). */
  maxMessageBytes: number;
  /** A connection with no call open is cut after this (default 10 s). */
  idleMs: number;
  /** Streams one connection may have open (default 4; an agent needs one). */
  maxStreams: number;
  /** A connection or join stream that has not authenticated within this is cut (default 5 s). */
  handshakeMs: number;
  /** Connections open at once (default 64; each agent needs one). */
  maxConnections: number;
}
export const DEFAULT_LINK: LinkSettings = { keepaliveMs: 10_000, maxMessageBytes: 1024 << 20, idleMs: 10_000, maxStreams: 4, handshakeMs: 5000, maxConnections: 64 };

function channelOptions(s: LinkSettings): grpc.ChannelOptions {
  return {
    "grpc.max_receive_message_length": s.maxMessageBytes,
    "grpc.max_send_message_length": s.maxMessageBytes,
    "grpc.keepalive_time_ms": s.keepaliveMs,
    "grpc.keepalive_timeout_ms": s.keepaliveMs,
    "grpc.keepalive_permit_without_calls": 1,
    "grpc.http2.min_time_between_pings_ms": s.keepaliveMs / 2,
    "grpc.http2.max_pings_without_data": 0,
    // The client's HTTP/2 receive window (grpc-js's default 64 KiB stalls a megabyte frame on round trips).
    "grpc-node.flow_control_window": 32 << 20,
  };
}

export type Stream = grpc.ServerDuplexStream<Buffer, Buffer> | grpc.ClientDuplexStream<Buffer, Buffer>;
export type StreamHandler = (stream: grpc.ServerDuplexStream<Buffer, Buffer>) => void;

export interface ClusterServer {
  /** host:port the server listens on (the port is the bound one when 0 was asked). */
  address: string;
  /** The connection of a stream whose peer (call.getPeer()) authenticated: it is no longer cut. */
  markAuthenticated(peer: string): void;
  close(): void;
}

const peerKey = (addr: string | undefined, port: number | undefined) => `${(addr ?? "").replace(/^::ffff:/, "")}:${port ?? ""}`;

/** Listens on exactly `host:port` (never all interfaces unless asked with 0.0.0.0). */
export async function startServer(host: string, port: number, handlers: { join: StreamHandler }, settings: LinkSettings = DEFAULT_LINK): Promise<ClusterServer> {
  const server = new grpc.Server({
    ...channelOptions(settings),
    "grpc.http2.min_ping_interval_without_data_ms": settings.keepaliveMs / 2,
    "grpc.http2.max_ping_strikes": 0,
    "grpc.max_connection_idle_ms": settings.idleMs,
    "grpc.max_concurrent_streams": settings.maxStreams,
  });
  server.addService(SERVICE, { join: handlers.join });
  const injector = server.createConnectionInjector(grpc.ServerCredentials.createInsecure());
  const open = new Map<string, { sock: Socket; timer: NodeJS.Timeout }>();
  const log = logger();
  const tcp = createServer({ noDelay: true }, (sock) => {
    const key = peerKey(sock.remoteAddress, sock.remotePort);
    if (open.size >= settings.maxConnections) {
      log.warn({ peer: key, why: `${settings.maxConnections} connections are open already` }, "refused a connection to the join port");
      sock.destroy();
      return;
    }
    const timer = setTimeout(() => {
      log.warn({ peer: key, why: `no authenticated stream within ${settings.handshakeMs / 1000} s` }, "cut a connection to the join port");
      sock.destroy();
    }, settings.handshakeMs);
    timer.unref();
    open.set(key, { sock, timer });
    sock.on("close", () => {
      clearTimeout(timer);
      open.delete(key);
    });
    sock.on("error", () => undefined);
    injector.injectConnection(sock);
  });
  const target = host.includes(":") ? `[${host}]:${port}` : `${host}:${port}`;
  await new Promise<void>((resolve, reject) => {
    tcp.once("error", (e) => reject(new Error(`cannot listen on ${target}: ${e.message}`)));
    tcp.listen(port, host, () => resolve());
  });
  const bound = (tcp.address() as { port: number }).port;
  const close = () => {
    tcp.close();
    // Let the last frames (a shutdown, a result) flush; cut what is left after a second.
    injector.drain(1000);
    const t = setTimeout(() => {
      injector.destroy();
      server.forceShutdown();
      for (const c of open.values()) c.sock.destroy();
    }, 1000);
    t.unref();
  };
  return {
    address: `${host.includes(":") ? `[${host}]` : host}:${bound}`,
    markAuthenticated: (peer) => {
      const c = open.get(peer.replace(/^ipv[46]:/, "").replace(/^\[(.*)\]:/, "$1:"));
      if (c) clearTimeout(c.timer);
    },
    close,
  };
}

export interface ClusterClient {
  /** Resolves once connected (grpc-js retries the name lookup and the connection); rejects when `waitMs` passes first. */
  ready(waitMs: number): Promise<void>;
  join(): grpc.ClientDuplexStream<Buffer, Buffer>;
  close(): void;
}

const Client = grpc.makeGenericClientConstructor(SERVICE as grpc.ServiceDefinition, "Cluster") as unknown as new (
  address: string, creds: grpc.ChannelCredentials, options: grpc.ChannelOptions,
) => grpc.Client & Record<"join", (md: grpc.Metadata, opts: grpc.CallOptions) => grpc.ClientDuplexStream<Buffer, Buffer>>;

/** A client for `address` (host:port); `ready()` waits for the server to come up. */
export function connect(address: string, settings: LinkSettings = DEFAULT_LINK): ClusterClient {
  const client = new Client(address, grpc.credentials.createInsecure(), {
    ...channelOptions(settings),
    // Retry the name lookup and the connection quickly at first (a pod's DNS name appears late), at most every 5 s.
    "grpc.initial_reconnect_backoff_ms": 200,
    "grpc.max_reconnect_backoff_ms": 5000,
    "grpc.dns_min_time_between_resolutions_ms": 1000,
  });
  return {
    ready: (waitMs) => new Promise((resolve, reject) => {
      client.waitForReady(Date.now() + waitMs, (err) => (err ? reject(new Error(`could not reach ${address} within ${waitMs / 1000} s: ${err.message}`)) : resolve()));
    }),
    join: () => client.join(new grpc.Metadata(), {}),
    close: () => client.close(),
  };
}

/** A readable reason for a stream that ended or failed. */
export function streamEndReason(err: unknown): string {
  if (err && typeof err === "object" && "code" in err) {
    const e = err as { code?: number; details?: string; message?: string };
    const name = typeof e.code === "number" ? grpc.status[e.code] : undefined;
    return `${name ?? "error"}: ${e.details || e.message || "connection lost"}`;
  }
  return err instanceof Error ? err.message : "the connection closed";
}

export { grpc };
