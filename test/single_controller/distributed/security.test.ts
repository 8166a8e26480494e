// The security rows of issue 26: agents make the driver prove the run's token before
// they send anything (a fake driver learns nothing and is named); the token never
// crosses; a wrong-token agent is refused and the refusal logged with its address;
// idle unauthenticated connections are cut (join port and ring data port); an
// oversized message is refused without being kept; the driver binds only the given
// address; the token file is written only once the driver holds its port.
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { connect as tcpConnect, type Socket } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { fileURLToPath } from "node:url";
import { proof } from "../../../src/single_controller/distributed/auth.js";
import { joinCluster } from "../../../src/single_controller/distributed/cluster.js";
import { startDataServer } from "../../../src/single_controller/distributed/data_link.js";
import { DEFAULT_LINK, startServer, grpc } from "../../../src/single_controller/distributed/grpc_link.js";
import { decodeFrame, encodeFrame } from "../../../src/single_controller/distributed/wire.js";
import { startAgent } from "./cluster_helpers.js";

const TOKEN = "the-right-token-0123456789";
const GRPC_LINK = fileURLToPath(new URL("../../../src/single_controller/distributed/grpc_link.js", import.meta.url));
const CLUSTER = fileURLToPath(new URL("../../../src/single_controller/distributed/cluster.js", import.meta.url));

function canConnect(host: string, port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const s = tcpConnect({ host, port });
    s.once("connect", () => (s.destroy(), resolve(true)));
    s.once("error", () => resolve(false));
  });
}

/** A driver in a child process (its log lines are the test's evidence); resolves once it listens. */
function childDriver(env: Record<string, string>, joinTimeoutMs: number, link = "{}", nnodes = 1) {
  const code = `import { joinCluster } from ${JSON.stringify(CLUSTER)};
    await joinCluster({ nnodes: ${nnodes}, perNode: 1, name: "sec", addr: "127.0.0.1", port: 0, joinTimeoutMs: ${joinTimeoutMs}, link: ${link},
      onListen: (a) => process.stdout.write("LISTEN " + a + "\\n") }).then(() => process.exit(0), (e) => { process.stderr.write("FAILED " + e.message + "\\n"); process.exit(3); });`;
  const proc = spawn(process.execPath, ["--input-type=module", "-e", code], { env: { ...process.env, VERL_LOG_LEVEL: "info", VERL_LOG_FORMAT: "json", ...env }, stdio: ["ignore", "pipe", "pipe"] });
  let stderr = "";
  proc.stderr!.on("data", (b: Buffer) => (stderr += b.toString()));
  const exited = new Promise<number | null>((resolve) => proc.on("exit", (c) => resolve(c)));
  const address = new Promise<string>((resolve, reject) => {
    let out = "";
    proc.stdout!.on("data", (b: Buffer) => {
      out += b.toString();
      const m = /LISTEN (\S+)/.exec(out);
      if (m) resolve(m[1]!);
    });
    void exited.then((c) => reject(new Error(`the driver exited (${c}) before listening: ${stderr}`)));
  });
  return { proc, address, exited, log: () => stderr };
}

test("a fake driver gets no token: the agent sends only its challenge, names the process and exits 1", { timeout: 30_000 }, async () => {
  const received: Buffer[] = [];
  const server = await startServer("127.0.0.1", 0, {
    join: (call) => {
      call.on("data", (b: Buffer) => {
        received.push(b);
        const head = decodeFrame<{ t: string; nonce: Uint8Array }>(b).head;
        // It answers as a driver would, but without the token it can only guess a proof.
        if (head.t === "challenge") call.write(encodeFrame({ t: "proof", nonce: Buffer.alloc(16, 7), proof: proof("a-guessed-token-0000000", "driver", "r1", head.nonce, Buffer.alloc(16, 7)), runId: "r1", version: "0.1.0" }));
      });
      call.on("error", () => undefined);
    },
  });
  const agent = startAgent({ name: "victim" }, server.address, TOKEN);
  const code = await agent.exited;
  server.close();
  assert.equal(code, 1);
  assert.match(agent.output.join(""), new RegExp(`the process at ${server.address} is not this run's driver: it could not prove the run's join token; nothing was sent to it`));
  assert.equal(received.length, 1, "only the challenge was sent");
  const all = Buffer.concat(received);
  assert.equal(all.includes(Buffer.from(TOKEN)), false, "the token is not in what the fake driver received");
  assert.equal(decodeFrame<{ t: string }>(received[0]!).head.t, "challenge");
  assert.equal(/victim/.test(all.toString("latin1")), false, "not even the agent's name");
});

test("an agent with the wrong token is refused and the refusal is logged with its address; the driver binds only the given address", { timeout: 30_000 }, async () => {
  const d = childDriver({ VERL_JOIN_TOKEN: TOKEN }, 4000);
  const address = await d.address;
  const intruder = startAgent({ name: "intruder" }, address, "a-wrong-token-0123456789");
  assert.equal(await intruder.exited, 1, "the refused agent exits with an error");
  // Mutual: with another token it cannot tell this driver from a fake one, so it sends nothing and leaves.
  assert.match(intruder.output.join(""), /is not this run's driver: it could not prove the run's join token/);
  const port = Number(address.split(":").pop());
  assert.equal(await canConnect("127.0.0.1", port), true, "reachable on the given address");
  assert.equal(await canConnect("127.0.0.2", port), false, "not reachable on another address of this host");
  assert.equal(await d.exited, 3);
  const refused = d.log().split("\n").filter((l) => l.includes("refused a host agent")).map((l) => JSON.parse(l) as { peer: string; why: string; name?: string });
  assert.ok(refused.length >= 1, d.log());
  assert.match(refused[0]!.peer, /^ipv4:127\.0\.0\.1:\d+$|^127\.0\.0\.1:\d+$/);
  assert.match(refused[0]!.why, /left before it proved the run's join token/);
  assert.match(d.log(), /only 0 host agents joined .* within 4 s \(node ranks missing: 0\)/);
});

test("the same agent started twice is refused, not admitted as a second host; the refusal names it on the driver", { timeout: 30_000 }, async () => {
  const d = childDriver({ VERL_JOIN_TOKEN: TOKEN }, 20_000, "{}", 2);
  const address = await d.address;
  const agents = [startAgent({ name: "twin" }, address, TOKEN)];
  try {
    for (let i = 0; i < 200 && !/host agent joined/.test(d.log()); i++) await sleep(50);
    assert.match(d.log(), /host agent joined/, d.log());
    // The same command again: same name, same host (no --node-rank, so the driver would number it 1).
    agents.push(startAgent({ name: "twin" }, address, TOKEN));
    assert.equal(await agents[1]!.exited, 1, "the second copy exits with an error");
    assert.match(agents[1]!.output.join(""), /the driver refused this host: host agent 'twin' at 127\.0\.0\.1 \(pid \d+\) is the same agent as host 'twin' \(node 0, 127\.0\.0\.1:\d+\)/);
    const refused = d.log().split("\n").filter((l) => l.includes("refused a host agent")).map((l) => JSON.parse(l) as { peer: string; why: string; name?: string });
    assert.equal(refused.length, 1, d.log());
    assert.equal(refused[0]!.name, "twin");
    assert.match(refused[0]!.why, /same agent as host 'twin' \(node 0/);
    // The run still starts once a real second host joins: the refusal took no slot.
    agents.push(startAgent({ name: "other" }, address, TOKEN));
    assert.equal(await d.exited, 0, d.log());
    assert.match(d.log(), /every host agent is ready/);
  } finally {
    for (const a of agents) a.proc.kill("SIGKILL");
    d.proc.kill("SIGKILL");
  }
});

async function openMany(host: string, port: number, n: number): Promise<Socket[]> {
  const socks: Socket[] = [];
  for (let i = 0; i < n; i++) {
    const s = tcpConnect({ host, port });
    s.on("error", () => undefined);
    s.resume(); // read what the server sends, so its closing shows as the end of the stream
    socks.push(s);
    if (i % 100 === 99) await sleep(20);
  }
  return socks;
}

async function allClosed(socks: Socket[], withinMs: number): Promise<number> {
  const until = Date.now() + withinMs;
  for (;;) {
    const open = socks.filter((s) => !s.destroyed && s.readyState !== "closed" && !s.readableEnded).length;
    if (open === 0 || Date.now() > until) return open;
    await sleep(100);
  }
}

test("1,000 idle unauthenticated connections are cut, on the join port and on a ring data port", { timeout: 60_000 }, async () => {
  const d = childDriver({ VERL_JOIN_TOKEN: TOKEN }, 30_000, "{ idleMs: 1500, handshakeMs: 1500 }");
  const [host, port] = (await d.address).split(":") as [string, string];
  const join = await openMany(host, Number(port), 1000);
  const openJoin = await allClosed(join, 15_000);
  d.proc.kill();
  assert.equal(openJoin, 0, "every idle connection to the join port was closed by the driver");
  for (const s of join) s.destroy();

  const data = await startDataServer("127.0.0.1", 0, () => ({ token: TOKEN, runId: "r" }), () => assert.fail("nobody authenticated"), { handshakeMs: 1000, maxPending: 16, maxPeers: 2 });
  const [dh, dp] = data.address.split(":") as [string, string];
  const ring = await openMany(dh, Number(dp), 1000);
  const openRing = await allClosed(ring, 10_000);
  data.close();
  for (const s of ring) s.destroy();
  assert.equal(openRing, 0, "every idle connection to the ring data port was closed");
});

test("an oversized message is refused and its memory freed", { timeout: 60_000 }, async () => {
  const maxMessageBytes = 4 << 20;
  let got = 0;
  const settings = { ...DEFAULT_LINK, maxMessageBytes };
  const server = await startServer("127.0.0.1", 0, { join: (call) => (call.on("data", () => got++), call.on("error", () => undefined)) }, settings);
  (globalThis as { gc?: () => void }).gc?.();
  const base = process.memoryUsage();
  // The sender is another process, so what this process holds is the receiver's memory alone.
  const code = `import { connect } from ${JSON.stringify(GRPC_LINK)};
    const c = connect(${JSON.stringify(server.address)}, { keepaliveMs: 10000, maxMessageBytes: 1 << 30, idleMs: 10000, maxStreams: 4, handshakeMs: 5000, maxConnections: 64 });
    await c.ready(5000);
    const s = c.join();
    s.on("error", (e) => { process.stdout.write("CODE " + e.code + " " + e.details + "\\n"); process.exit(0); });
    s.write(Buffer.alloc(${256 << 20}, 1));`;
  const child = spawn(process.execPath, ["--input-type=module", "-e", code], { stdio: ["ignore", "pipe", "pipe"] });
  let out = "";
  child.stderr!.on("data", (b: Buffer) => (out += b.toString()));
  let peak = 0;
  const watch = setInterval(() => (peak = Math.max(peak, process.memoryUsage().arrayBuffers - base.arrayBuffers)), 20);
  child.stdout!.on("data", (b: Buffer) => (out += b.toString()));
  await new Promise((resolve) => child.on("exit", resolve));
  clearInterval(watch);
  server.close();
  await sleep(300);
  (globalThis as { gc?: () => void }).gc?.();
  const after = process.memoryUsage().arrayBuffers - base.arrayBuffers;
  assert.match(out, new RegExp(`CODE ${grpc.status.RESOURCE_EXHAUSTED} `), out);
  assert.equal(got, 0, "the handler never saw the message");
  assert.ok(after < 16 << 20, `the receiver still holds ${(after / 2 ** 20).toFixed(1)} MiB of array buffers (peak ${(peak / 2 ** 20).toFixed(1)} MiB)`);
});

test("the token file is written only once the driver listens: a driver that cannot bind leaves the live run's token alone", { timeout: 30_000 }, async () => {
  const dir = mkdtempSync(join(tmpdir(), "verl-token-"));
  const file = join(dir, "join_token.run7");
  try {
    const env = { VERL_JOIN_TOKEN: "", HOME: dir, VERL_RUN_ID: "run7", VERL_JOIN_TOKEN_FILE: "" };
    const saved = { ...process.env };
    Object.assign(process.env, env);
    delete process.env.VERL_JOIN_TOKEN;
    delete process.env.VERL_JOIN_TOKEN_FILE;
    let address = "";
    const live = joinCluster({ nnodes: 1, perNode: 1, name: "live", addr: "127.0.0.1", port: 0, joinTimeoutMs: 3000, onListen: (a) => (address = a) });
    const liveDone = live.catch((e: Error) => e);
    while (!address) await sleep(20);
    const expected = `${dir}/.verl-ts/join_token.run7`;
    assert.ok(existsSync(expected), "the live driver wrote the per-run token file");
    const token = readFileSync(expected, "utf8");
    const second = await joinCluster({ nnodes: 1, perNode: 1, name: "second", addr: "127.0.0.1", port: Number(address.split(":")[1]), joinTimeoutMs: 1000 }).catch((e: Error) => e);
    assert.match(String(second), /cannot listen on 127\.0\.0\.1/);
    assert.equal(readFileSync(expected, "utf8"), token, "the second driver did not overwrite the token");
    assert.ok((await liveDone) instanceof Error);
    process.env = saved;
  } finally {
    rmSync(dir, { recursive: true, force: true });
    void file;
  }
});

test("a short token is refused at start", async () => {
  const { driverToken } = await import("../../../src/single_controller/distributed/token.js");
  assert.throws(() => driverToken({ VERL_JOIN_TOKEN: "short" }), /VERL_JOIN_TOKEN: the join token must have at least 16 characters/);
});
