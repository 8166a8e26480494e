// The gRPC service between hosts (@grpc/grpc-js, no protobuf codegen): two
// bidirectional streams of raw frames (wire.ts). `Join`: a host agent and the
// driver (tasks down, results up). `Ring`: one host to its successor in the
// ring (collective chunks). Every call must present the run's token in its
// metadata; keepalive pings detect a host that vanished without closing its
// connection within a few seconds.
import { timingSafeEqual } from "node:crypto";
import * as grpc from "@grpc/grpc-js";

const raw = (b: Buffer): Buffer => b;
const bidi = (name: string) => ({
  path: `/verl_ts.Cluster/${name}`, requestStream: true, responseStream: true,
  requestSerialize: raw, requestDeserialize: raw, responseSerialize: raw, responseDeserialize: raw,
});
const SERVICE = { join: bidi("Join"), ring: bidi("Ring") } as unknown as grpc.ServiceDefinition;
const TOKEN_KEY = "x-verl-ts-token";
const KEEPALIVE_MS = 2000;

const CHANNEL_OPTIONS: grpc.ChannelOptions = {
  "grpc.max_receive_message_length": -1,
  "grpc.max_send_message_length": -1,
  "grpc.keepalive_time_ms": KEEPALIVE_MS,
  "grpc.keepalive_timeout_ms": KEEPALIVE_MS,
  "grpc.keepalive_permit_without_calls": 1,
  "grpc.http2.min_time_between_pings_ms": KEEPALIVE_MS / 2,
  "grpc.http2.max_pings_without_data": 0,
  // The client's HTTP/2 receive window (grpc-js's default 64 KiB stalls a megabyte frame on round trips).
  "grpc-node.flow_control_window": 32 << 20,
};
const SERVER_OPTIONS: grpc.ChannelOptions = {
  ...CHANNEL_OPTIONS,
  "grpc.http2.min_ping_interval_without_data_ms": KEEPALIVE_MS / 2,
  "grpc.http2.max_ping_strikes": 0,
};

export type Stream = grpc.ServerDuplexStream<Buffer, Buffer> | grpc.ClientDuplexStream<Buffer, Buffer>;
export type StreamHandler = (stream: grpc.ServerDuplexStream<Buffer, Buffer>) => void;

function tokenMatches(given: unknown, token: string): boolean {
  if (typeof given !== "string") return false;
  const a = Buffer.from(given), b = Buffer.from(token);
  return a.length === b.length && timingSafeEqual(a, b);
}

export interface ClusterServer {
  /** host:port the server listens on (the port is the bound one when 0 was asked). */
  address: string;
  close(): void;
}

/** Listens on exactly `host:port` (never all interfaces unless asked with 0.0.0.0); calls without the token are refused. */
export async function startServer(host: string, port: number, token: string, handlers: { join?: StreamHandler; ring?: StreamHandler }): Promise<ClusterServer> {
  const server = new grpc.Server(SERVER_OPTIONS);
  const guard = (name: string, h: StreamHandler | undefined) => (call: grpc.ServerDuplexStream<Buffer, Buffer>) => {
    if (!tokenMatches(call.metadata.get(TOKEN_KEY)[0], token)) {
      call.emit("error", { code: grpc.status.UNAUTHENTICATED, details: "wrong or missing run token (VERL_JOIN_TOKEN / --token-file)" });
      return;
    }
    if (!h) {
      call.emit("error", { code: grpc.status.UNIMPLEMENTED, details: `this process does not serve ${name}` });
      return;
    }
    h(call);
  };
  server.addService(SERVICE, { join: guard("Join", handlers.join), ring: guard("Ring", handlers.ring) });
  const target = host.includes(":") ? `[${host}]:${port}` : `${host}:${port}`;
  const bound = await new Promise<number>((resolve, reject) => {
    server.bindAsync(target, grpc.ServerCredentials.createInsecure(), (err, p) => (err ? reject(new Error(`cannot listen on ${target}: ${err.message}`)) : resolve(p)));
  });
  const close = () => {
    // Let the last frames (a shutdown, a result) flush; cut what is left after a second.
    const t = setTimeout(() => server.forceShutdown(), 1000);
    t.unref();
    server.tryShutdown(() => clearTimeout(t));
  };
  return { address: `${host.includes(":") ? `[${host}]` : host}:${bound}`, close };
}

export interface ClusterClient {
  /** Resolves once connected; rejects when `waitMs` passes first. */
  ready(waitMs: number): Promise<void>;
  join(): grpc.ClientDuplexStream<Buffer, Buffer>;
  ring(): grpc.ClientDuplexStream<Buffer, Buffer>;
  close(): void;
}

const Client = grpc.makeGenericClientConstructor(SERVICE as grpc.ServiceDefinition, "Cluster") as unknown as new (
  address: string, creds: grpc.ChannelCredentials, options: grpc.ChannelOptions,
) => grpc.Client & Record<"join" | "ring", (md: grpc.Metadata, opts: grpc.CallOptions) => grpc.ClientDuplexStream<Buffer, Buffer>>;

/** A client for `address` (host:port); `ready()` waits for the server to come up. */
export function connect(address: string, token: string): ClusterClient {
  const client = new Client(address, grpc.credentials.createInsecure(), CHANNEL_OPTIONS);
  const md = () => {
    const m = new grpc.Metadata();
    m.set(TOKEN_KEY, token);
    return m;
  };
  return {
    ready: (waitMs) => new Promise((resolve, reject) => {
      client.waitForReady(Date.now() + waitMs, (err) => (err ? reject(new Error(`could not reach ${address} within ${waitMs / 1000} s: ${err.message}`)) : resolve()));
    }),
    join: () => client.join(md(), {}),
    ring: () => client.ring(md(), {}),
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
