// Raw TCP between two processes on the link a benchmark uses, the ceiling for
// the cross-host all-reduce: `node raw_tcp.js --serve HOST` listens (prints its
// port) and answers every connection. Per measurement the client sends an 8-byte
// size and a mode; "duplex": both sides send that many bytes at once (the traffic
// of a two-host ring all-reduce, which sends and receives the buffer's size each
// way); "oneway": the client sends. The server ends each with one byte once it has read all. Reads
// land in one preallocated buffer (Node's onread), writes come from another: the
// best a Node.js process does with a socket.
import { spawn, type ChildProcess } from "node:child_process";
import { createServer, connect } from "node:net";
import { fileURLToPath } from "node:url";

const SCRATCH = 4 << 20;

function serve(host: string): void {
  const out = Buffer.alloc(SCRATCH, 1);
  const server = createServer({ noDelay: true }, (sock) => {
    let want = -1, mode = 0, got = 0;
    let head = Buffer.alloc(0);
    sock.on("data", (b: Buffer) => {
      if (want < 0) {
        head = Buffer.concat([head, b]);
        if (head.length < 9) return;
        want = Number(head.readBigUInt64LE(0));
        mode = head[8]!;
        b = head.subarray(9);
        got = 0;
        if (mode === 1) for (let sent = 0; sent < want; sent += SCRATCH) sock.write(out.subarray(0, Math.min(SCRATCH, want - sent)));
      }
      got += b.length;
      if (got >= want) {
        // The end mark: the client sends its next size only after this, so sizes never mix with payload.
        sock.write(Buffer.from([1]));
        want = -1;
        head = Buffer.alloc(0);
      }
    });
    sock.on("error", () => undefined);
  });
  server.listen(0, host, () => process.stdout.write(`${(server.address() as { port: number }).port}\n`));
}

/** Starts the server (in a network namespace when given); resolves with its port and a stop function. */
export function startRawServer(host: string, netns?: string): Promise<{ port: number; proc: ChildProcess }> {
  const self = fileURLToPath(import.meta.url);
  const [cmd, argv] = netns ? ["ip", ["netns", "exec", netns, process.execPath, self, "--serve", host]] : [process.execPath, [self, "--serve", host]];
  const proc = spawn(cmd, argv as string[], { stdio: ["ignore", "pipe", "inherit"] });
  return new Promise((resolve, reject) => {
    proc.stdout!.once("data", (b: Buffer) => resolve({ port: Number(b.toString().trim()), proc }));
    proc.once("exit", (code) => reject(new Error(`raw TCP server exited (${code})`)));
  });
}

/** MB/s (bytes each way / seconds) of each of `iters` transfers of `bytes`. */
export async function measureRawTcp(host: string, port: number, bytes: number, iters: number, mode: "duplex" | "oneway"): Promise<number[]> {
  const inbuf = new Uint8Array(SCRATCH);
  const out = Buffer.alloc(SCRATCH, 2);
  const times: number[] = [];
  let got = 0;
  let onChunk: () => void = () => undefined;
  const sock = connect({ host, port, noDelay: true, onread: { buffer: inbuf, callback: (n: number) => ((got += n), onChunk(), true) } });
  await new Promise<void>((resolve, reject) => (sock.once("connect", resolve), sock.once("error", reject)));
  for (let i = 0; i < iters + 1; i++) {
    got = 0;
    const expect = mode === "duplex" ? bytes + 1 : 1;
    const t0 = performance.now();
    const done = new Promise<void>((resolve) => (onChunk = () => got >= expect && resolve()));
    const head = Buffer.alloc(9);
    head.writeBigUInt64LE(BigInt(bytes), 0);
    head[8] = mode === "duplex" ? 1 : 0;
    sock.write(head);
    for (let sent = 0; sent < bytes; sent += SCRATCH) sock.write(out.subarray(0, Math.min(SCRATCH, bytes - sent)));
    await done;
    if (i > 0) times.push(performance.now() - t0);
  }
  sock.destroy();
  return times.map((ms) => bytes / 1e6 / (ms / 1000));
}

if (process.argv[2] === "--serve") serve(process.argv[3] ?? "127.0.0.1");
