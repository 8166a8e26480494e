// All-reduce bandwidth of one pool in three places, 16 MiB and 256 MiB of float32
// "mean" per call (the gradient all-reduce's op), two ranks each: both ranks in this
// process (SharedArrayBuffer), two host agents on 127.0.0.1 (the ring's TCP data plane
// over loopback), and two host agents in two network namespaces joined by a veth
// pair (the ring crosses a real Linux network device; skipped with the reason
// where namespaces cannot be made). MB/s = buffer bytes / wall time of the slowest
// rank, per call: median [min-max]. Beside each cross-host figure, raw TCP on the
// same link in the same run (bench/raw_tcp.ts), measured just before and just after
// the all-reduce so a load change on a shared machine hits both: "duplex" (each side
// sends the size at once, the traffic of a two-host ring all-reduce) and one way;
// *_of_raw is the all-reduce's median over raw duplex TCP's (target >= 0.7,
// bench/targets.ts). CPU ms per call of each thread that does the work (from /proc,
// 10 ms ticks; on a loaded 2-core machine CPU, not the link, bounds both): per agent,
// its rank thread (combine) and main thread (sockets), averaged over the two agents
// and the timed calls; per raw duplex transfer, the client's and the server's main
// thread. Like a trainer's flat gradient (DataParallelOptimizer.step), the bench's
// buffer is the collective's reduceBuffer: across hosts it lies in the bridge memory
// and is reduced in place. Prints one JSON line.
// Run: node dist/bench/allreduce_hosts.js
//   --iters N (default 8 for 16 MiB, 3 for 256 MiB; --reps N is the same)   --mib M,M (default 16,256)
// The namespace figure runs this script again inside namespace A as the driver
// (--driver-in-netns A,B), since the driver must listen on A's address.
import { spawnSync } from "node:child_process";
import { fileURLToPath } from "node:url";
import { ClassWithInitArgs, ResourcePool, WorkerGroup } from "../src/single_controller/index.js";
import { emit, loadAvg1m, machine, parseBenchArgs, runMain, stats, type Stats } from "./common.js";
import { launchCluster } from "./hosts.js";
import { createNetnsPair } from "./netns.js";
import { measureRawTcp, startRawServer } from "./raw_tcp.js";
import { threadCpuMs } from "./thread_cpu.js";

const WORKER = new ClassWithInitArgs(new URL("./controller.js", import.meta.url), "BenchWorker");

type Measured = { mb: Stats; rankCpuMs: number; mainCpuMs: number };
const mean = (v: number[]) => Math.round(v.reduce((a, b) => a + b, 0) / v.length);

async function measure(pool: ResourcePool, elems: number, iters: number): Promise<Measured> {
  try {
    const wg = await WorkerGroup.create(pool, WORKER);
    const perRank = (await wg.call("allReduceCpu", elems, iters)) as { times: number[]; rankCpuMs: number; mainCpuMs: number }[];
    const ms = perRank[0]!.times.map((_, i) => Math.max(...perRank.map((t) => t.times[i]!)));
    return { mb: mbStats(ms.map((m) => (elems * 4) / 1e6 / (m / 1000))), rankCpuMs: mean(perRank.map((r) => r.rankCpuMs)), mainCpuMs: mean(perRank.map((r) => r.mainCpuMs)) };
  } finally {
    await pool.destroy();
  }
}

const mbStats = (mbs: number[]): Stats => {
  const s = stats(mbs);
  return { ...s, median: Math.round(s.median), min: Math.round(s.min), max: Math.round(s.max) };
};

type Row = { allreduce: Stats; raw_duplex: Stats; raw_oneway: Stats; cpu: { rank: number; main: number; rawClient: number; rawServer: number } };

async function acrossAgents(elems: number, iters: number, addr: string, netns?: [string, string]): Promise<Measured> {
  const hosts = [{ name: "hostA", nodeRank: 0, ...(netns ? { netns: netns[0] } : {}) }, { name: "hostB", nodeRank: 1, ...(netns ? { netns: netns[1] } : {}) }];
  const cluster = await launchCluster(hosts, 1, { addr });
  try {
    return await measure(cluster.pool, elems, iters);
  } finally {
    await cluster.stop();
  }
}

/** The all-reduce between two agents and raw TCP between the same two places (server at `peer`, in `netns[1]`), before and after it. */
async function linkRow(elems: number, iters: number, addr: string, peer: string, netns?: [string, string]): Promise<Row> {
  const srv = await startRawServer(peer, netns?.[1]);
  try {
    const bytes = elems * 4, n = Math.max(3, Math.ceil(iters / 2));
    // The client's and server's main-thread CPU over the duplex transfers (n + 1 each time: one warm-up).
    let client = 0, server = 0;
    const duplexRun = async () => {
      const c0 = threadCpuMs(), s0 = threadCpuMs(srv.proc.pid!);
      const r = await measureRawTcp(peer, srv.port, bytes, n, "duplex");
      client += threadCpuMs() - c0;
      server += threadCpuMs(srv.proc.pid!) - s0;
      return r;
    };
    const duplex = await duplexRun();
    const oneway = await measureRawTcp(peer, srv.port, bytes, n, "oneway");
    const ar = await acrossAgents(elems, iters, addr, netns);
    duplex.push(...(await duplexRun()));
    oneway.push(...(await measureRawTcp(peer, srv.port, bytes, n, "oneway")));
    const per = 2 * (n + 1);
    return {
      allreduce: ar.mb, raw_duplex: mbStats(duplex), raw_oneway: mbStats(oneway),
      cpu: { rank: ar.rankCpuMs, main: ar.mainCpuMs, rawClient: Math.round(client / per), rawServer: Math.round(server / per) },
    };
  } finally {
    srv.proc.kill();
  }
}

function inNamespaces(sizes: [number, number][]): Row[] | { skipped: string } {
  const pair = createNetnsPair();
  if (typeof pair === "string") return { skipped: `no network namespaces here: ${pair}` };
  try {
    const self = fileURLToPath(import.meta.url);
    const r = spawnSync("ip", ["netns", "exec", pair.names[0], process.execPath, self, "--driver-in-netns", pair.names.join(","), "--sizes", sizes.map(([e, i]) => `${e}x${i}`).join(",")], { encoding: "utf8", timeout: 280_000 });
    const line = r.stdout.trim().split("\n").pop() ?? "";
    if (r.status !== 0 || !line.startsWith("[")) return { skipped: `the namespace run failed (code ${r.status}): ${r.stderr.slice(-500)}` };
    return JSON.parse(line) as Row[];
  } finally {
    pair.remove();
  }
}

const ratio = (a: number, b: number) => Math.round((a / b) * 100) / 100;

function rowFigures(prefix: string, r: Row): Record<string, number | Stats> {
  return {
    [`${prefix}_MB_per_s`]: r.allreduce,
    [`${prefix}_raw_tcp_duplex_MB_per_s`]: r.raw_duplex, [`${prefix}_raw_tcp_oneway_MB_per_s`]: r.raw_oneway,
    [`${prefix}_of_raw`]: ratio(r.allreduce.median, r.raw_duplex.median),
    [`${prefix}_cpu_ms_agent_rank_thread`]: r.cpu.rank, [`${prefix}_cpu_ms_agent_main_thread`]: r.cpu.main,
    [`${prefix}_cpu_ms_raw_client`]: r.cpu.rawClient, [`${prefix}_cpu_ms_raw_server`]: r.cpu.rawServer,
  };
}

async function main(): Promise<void> {
  const args = parseBenchArgs(process.argv.slice(2), { reps: 1 });
  const driverIn = args.extra.get("driver-in-netns");
  if (typeof driverIn === "string") {
    // Child mode: the driver inside namespace A; print the rows only.
    const [a, b] = driverIn.split(",") as [string, string];
    const sizes = String(args.extra.get("sizes")).split(",").map((x) => x.split("x").map(Number) as [number, number]);
    const rows: Row[] = [];
    for (const [elems, iters] of sizes) rows.push(await linkRow(elems, iters, "10.231.0.1", "10.231.0.2", [a, b]));
    process.stdout.write(`${JSON.stringify(rows)}\n`);
    return;
  }
  const load0 = loadAvg1m();
  const mibs = String(args.extra.get("mib") ?? "16,256").split(",").map(Number);
  const given = args.extra.get("iters") ?? (args.reps > 1 ? String(args.reps) : undefined);
  const sizes: [number, number][] = mibs.map((m) => [(m * 1024 * 1024) / 4, given !== undefined ? Number(given) : m >= 128 ? 3 : 8]);
  const figures: Record<string, number | string | Stats> = {};
  for (const [elems, iters] of sizes) {
    const mib = (elems * 4) / (1 << 20);
    const inProcess = (await measure(new ResourcePool({ worldSize: 2 }), elems, iters)).mb;
    Object.assign(figures, { [`in_process_${mib}MiB_MB_per_s`]: inProcess });
    Object.assign(figures, rowFigures(`hosts_loopback_${mib}MiB`, await linkRow(elems, iters, "127.0.0.1", "127.0.0.1")));
  }
  const netns = inNamespaces(sizes);
  if ("skipped" in netns) figures.hosts_netns_skipped = netns.skipped;
  else netns.forEach((r, i) => Object.assign(figures, rowFigures(`hosts_netns_${(sizes[i]![0] * 4) / (1 << 20)}MiB`, r)));
  emit({
    name: "allreduce_hosts",
    config: { ranks: 2, op: "mean", dtype: "float32", mib: mibs, iters: sizes.map((s) => s[1]) },
    figures,
    machine: machine("none", load0),
  });
}

runMain("allreduce_hosts", main);
