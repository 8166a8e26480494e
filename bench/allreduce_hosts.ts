// All-reduce bandwidth of one pool in three places, 16 MiB of float32 "mean"
// per call (the gradient all-reduce's op), two ranks each: both ranks in this
// process (SharedArrayBuffer), two host agents on 127.0.0.1 (gRPC ring over
// loopback), and two host agents in two network namespaces joined by a veth
// pair (the ring crosses a real Linux network device; skipped with the reason
// where namespaces cannot be made). MB/s = buffer bytes / median wall time of
// the slowest rank. Prints one JSON line. Run: node dist/bench/allreduce_hosts.js
//   --iters N (default 8; --reps N is the same)   --mib M (default 16)
// The namespace figure runs this script again inside namespace A as the driver
// (--driver-in-netns A,B), since the driver must listen on A's address.
import { spawnSync } from "node:child_process";
import { fileURLToPath } from "node:url";
import { ClassWithInitArgs, ResourcePool, WorkerGroup } from "../src/single_controller/index.js";
import { emit, intFlag, loadAvg1m, machine, parseBenchArgs, runMain } from "./common.js";
import { launchCluster } from "./hosts.js";
import { createNetnsPair } from "./netns.js";

const WORKER = new ClassWithInitArgs(new URL("./controller.js", import.meta.url), "BenchWorker");

const median = (xs: number[]): number => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2]! : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2;
};

async function measure(pool: ResourcePool, elems: number, iters: number): Promise<{ mbPerS: number; medianMs: number }> {
  try {
    const wg = await WorkerGroup.create(pool, WORKER);
    const perRank = (await wg.call("allReduceLoop", elems, iters)) as number[][];
    const ms = median(perRank[0]!.map((_, i) => Math.max(...perRank.map((t) => t[i]!))));
    return { mbPerS: Math.round((elems * 4) / 1e6 / (ms / 1000)), medianMs: Math.round(ms * 10) / 10 };
  } finally {
    await pool.destroy();
  }
}

async function acrossAgents(elems: number, iters: number, addr: string, netns?: [string, string]): Promise<{ mbPerS: number; medianMs: number }> {
  const hosts = [{ name: "hostA", nodeRank: 0, ...(netns ? { netns: netns[0] } : {}) }, { name: "hostB", nodeRank: 1, ...(netns ? { netns: netns[1] } : {}) }];
  const cluster = await launchCluster(hosts, 1, { addr });
  try {
    return await measure(cluster.pool, elems, iters);
  } finally {
    await cluster.stop();
  }
}

function inNamespaces(elems: number, iters: number): { mbPerS: number; medianMs: number } | { skipped: string } {
  const pair = createNetnsPair();
  if (typeof pair === "string") return { skipped: `no network namespaces here: ${pair}` };
  try {
    const self = fileURLToPath(import.meta.url);
    const r = spawnSync("ip", ["netns", "exec", pair.names[0], process.execPath, self, "--driver-in-netns", pair.names.join(","), "--elems", String(elems), "--iters", String(iters)], { encoding: "utf8", timeout: 120_000 });
    const line = r.stdout.trim().split("\n").pop() ?? "";
    if (r.status !== 0 || !line.startsWith("{")) return { skipped: `the namespace run failed (code ${r.status}): ${r.stderr.slice(-500)}` };
    return JSON.parse(line) as { mbPerS: number; medianMs: number };
  } finally {
    pair.remove();
  }
}

async function main(): Promise<void> {
  const args = parseBenchArgs(process.argv.slice(2), { reps: 1 });
  const driverIn = args.extra.get("driver-in-netns");
  if (typeof driverIn === "string") {
    // Child mode: the driver inside namespace A; print the figure only.
    const [a, b] = driverIn.split(",") as [string, string];
    const fig = await acrossAgents(intFlag(args, "elems", 1 << 22), intFlag(args, "iters", 8), "10.231.0.1", [a, b]);
    process.stdout.write(`${JSON.stringify(fig)}\n`);
    return;
  }
  const load0 = loadAvg1m();
  const iters = intFlag(args, "iters", args.reps > 1 ? args.reps : 8);
  const elems = (intFlag(args, "mib", 16) * 1024 * 1024) / 4;
  const inProcess = await measure(new ResourcePool({ worldSize: 2 }), elems, iters);
  const loopback = await acrossAgents(elems, iters, "127.0.0.1");
  const netns = inNamespaces(elems, iters);
  emit({
    name: "allreduce_hosts",
    config: { ranks: 2, op: "mean", dtype: "float32", mib: (elems * 4) / (1 << 20), iters },
    figures: {
      in_process_MB_per_s: inProcess.mbPerS, in_process_median_ms: inProcess.medianMs,
      hosts_loopback_MB_per_s: loopback.mbPerS, hosts_loopback_median_ms: loopback.medianMs,
      ...("skipped" in netns ? { hosts_netns_skipped: netns.skipped } : { hosts_netns_MB_per_s: netns.mbPerS, hosts_netns_median_ms: netns.medianMs }),
    },
    machine: machine("none", load0),
  });
}

runMain("allreduce_hosts", main);
