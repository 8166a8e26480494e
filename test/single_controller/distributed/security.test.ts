// The join port: an agent without the run's token is refused and never becomes a
// host; the driver listens on the address it was given only (here 127.0.0.1, so
// 127.0.0.2 on the same loopback device finds nothing).
import { test } from "node:test";
import assert from "node:assert/strict";
import { connect as tcpConnect } from "node:net";
import { joinCluster } from "../../../src/single_controller/distributed/cluster.js";
import { startAgent } from "./cluster_helpers.js";

function canConnect(host: string, port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const s = tcpConnect({ host, port });
    s.once("connect", () => (s.destroy(), resolve(true)));
    s.once("error", () => resolve(false));
  });
}

test("an agent with the wrong token is refused; the driver binds only the given address", { timeout: 30_000 }, async () => {
  process.env.VERL_JOIN_TOKEN = "the-right-token-0123456789";
  let address = "";
  const intruder: ReturnType<typeof startAgent>[] = [];
  const joined = joinCluster({
    nnodes: 1, perNode: 1, name: "sec", addr: "127.0.0.1", port: 0, joinTimeoutMs: 4000,
    onListen: (a) => {
      address = a;
      intruder.push(startAgent({ name: "intruder" }, a, "a-wrong-token-0123456789"));
    },
  });
  await assert.rejects(joined, /only 0 host agents joined .* within 4 s \(node ranks missing: 0\)/);
  const code = await intruder[0]!.exited;
  assert.equal(code, 1, "the refused agent exits with an error");
  assert.match(intruder[0]!.output.join(""), /UNAUTHENTICATED: wrong or missing run token/);
  // After the refusal the server is closed; check the binding with a fresh one.
  let port = 0;
  const second = joinCluster({ nnodes: 1, perNode: 1, name: "sec2", addr: "127.0.0.1", port: 0, joinTimeoutMs: 1500, onListen: (a) => (port = Number(a.split(":").pop())) });
  const settled = second.catch((e: Error) => e);
  while (port === 0) await new Promise((r) => setTimeout(r, 20));
  assert.equal(await canConnect("127.0.0.1", port), true, "reachable on the given address");
  assert.equal(await canConnect("127.0.0.2", port), false, "not reachable on another address of this host");
  assert.ok((await settled) instanceof Error);
  assert.ok(address.startsWith("127.0.0.1:"));
});

test("a short token is refused at start", async () => {
  const { driverToken } = await import("../../../src/single_controller/distributed/token.js");
  assert.throws(() => driverToken({ VERL_JOIN_TOKEN: "short" }), /VERL_JOIN_TOKEN: the join token must have at least 16 characters/);
});
