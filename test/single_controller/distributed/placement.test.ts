// Placement a cluster needs: VERL_SOCKET_IFNAME (NCCL_SOCKET_IFNAME's syntax), ring
// ports from a range, DNS retries with a deadline, the timeouts from trainer.* keys
// (verl's nccl_timeout honoured).
import { test } from "node:test";
import assert from "node:assert/strict";
import { createServer, type Server } from "node:net";
import type { NetworkInterfaceInfo } from "node:os";
import { interfaceAddress, interfaceMatches, listenInRange, lookupWithRetry, ringPortRange } from "../../../src/single_controller/distributed/placement.js";
import { clusterTimeoutsFromConfig } from "../../../src/single_controller/distributed/settings.js";

const iface = (address: string, family: "IPv4" | "IPv6", internal = false) => ({ address, family, internal, netmask: "", mac: "", cidr: null }) as unknown as NetworkInterfaceInfo;
const IFACES = { lo: [iface("127.0.0.1", "IPv4", true)], eth0: [iface("fe80::1", "IPv6"), iface("10.0.0.5", "IPv4")], ib0: [iface("192.168.50.5", "IPv4")], docker0: [iface("172.17.0.1", "IPv4")] };

test("VERL_SOCKET_IFNAME picks the interface as NCCL_SOCKET_IFNAME does", () => {
  assert.equal(interfaceMatches("eth0", "eth"), true);
  assert.equal(interfaceMatches("eth0", "=eth"), false);
  assert.equal(interfaceMatches("docker0", "^docker,lo"), false);
  assert.equal(interfaceMatches("ib0", "^docker,lo"), true);
  assert.equal(interfaceAddress("ib", IFACES), "192.168.50.5");
  assert.equal(interfaceAddress("^docker,lo,eth", IFACES), "192.168.50.5");
  assert.equal(interfaceAddress("eth", IFACES), "10.0.0.5", "IPv4 before IPv6, link-local skipped");
  assert.equal(interfaceAddress(undefined, IFACES), "172.17.0.1", "no filter: the first non-internal interface by name");
  assert.equal(interfaceAddress("wlan", IFACES), undefined);
});

test("ring ports come from VERL_RING_PORT_RANGE; a taken port moves to the next", async () => {
  assert.equal(ringPortRange({}), undefined);
  assert.deepEqual(ringPortRange({ VERL_RING_PORT_RANGE: "29510-29519" }), [29510, 29519]);
  assert.throws(() => ringPortRange({ VERL_RING_PORT_RANGE: "9-3" }), /VERL_RING_PORT_RANGE='9-3' must be LO-HI/);
  const listen = (p: number) => new Promise<Server>((resolve, reject) => {
    const s = createServer();
    s.once("error", reject);
    s.listen(p, "127.0.0.1", () => resolve(s));
  });
  const first = await listenInRange([0, 0], listen);
  const port = (first.address() as { port: number }).port;
  const second = await listenInRange([port, port + 1], listen);
  assert.equal((second.address() as { port: number }).port, port + 1);
  await assert.rejects(listenInRange([port, port], listen), new RegExp(`no free port in VERL_RING_PORT_RANGE ${port}-${port}`));
  first.close();
  second.close();
});

test("a name that never resolves fails at its deadline, naming it", async () => {
  const t0 = Date.now();
  await assert.rejects(lookupWithRetry("no-such-host.invalid", 1200), /cannot resolve 'no-such-host\.invalid' within 1\.2 s \(VERL_DNS_TIMEOUT_S\)/);
  assert.ok(Date.now() - t0 >= 600, "it retried");
  assert.equal(await lookupWithRetry("localhost", 1000).then((a) => a === "127.0.0.1" || a === "::1"), true);
});

test("collective and keepalive timeouts from trainer.* keys, verl's nccl_timeout honoured", () => {
  assert.deepEqual(clusterTimeoutsFromConfig({ trainer: {}, actor_rollout_ref: { nccl_timeout: 600 } }), { collectiveTimeoutMs: 600_000 });
  assert.deepEqual(clusterTimeoutsFromConfig({ trainer: { collective_timeout: 30, keepalive_s: 4 }, actor_rollout_ref: { nccl_timeout: 600 } }), { collectiveTimeoutMs: 30_000, keepaliveMs: 4000 });
  assert.deepEqual(clusterTimeoutsFromConfig({ trainer: { collective_timeout: null } }), {});
  assert.throws(() => clusterTimeoutsFromConfig({ trainer: { keepalive_s: -1 } }), /trainer.keepalive_s must be a positive number of seconds, got -1/);
});
